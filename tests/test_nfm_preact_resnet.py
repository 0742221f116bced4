"""modwire.experiments.nfm_preact_resnet (NFM Table 2 at CPU scale): both rows are the committed CPU recipes
with one budget of one epoch (one validation, at the last step: no checkpoint is selected on the test
split), and an in-process smoke run on a tiny Fashion-MNIST fixture trains, scores the last checkpoint
clean and under one 16×16 box, tabulates next to the paper and rebuilds the same study.json from its log."""
import json
from dataclasses import asdict

import pytest
from omegaconf import OmegaConf
from task_fixtures import write_mnist

from modwire.experiments import nfm_preact_resnet as npr
from modwire.training import load_config


def test_runs_are_the_cpu_recipes_with_one_budget(tmp_path):
    a = npr.parse(["--out", str(tmp_path), "--data-root", "/data/fmnist"])
    assert (a.steps, a.batch, a.seeds, a.samples, a.occlusion) == (200, 64, 3, 12_800, 16)   # one epoch of 200 steps
    base, nfm = (load_config(npr.CONFIGS[m], values=npr.overrides(m, 2, a)) for m in ("base", "nfm"))
    assert (base.model.name, nfm.model.name) == ("preact_resnet18_cifar10", "nfm_preact_resnet18_cifar10")
    assert base.model.overrides == nfm.model.overrides == {"initial_channels": 8, "num_blocks": [1, 1, 1]}
    for cfg in (base, nfm):
        assert cfg.max_steps == 200 and cfg.epochs == 1 and cfg.seed == 2 and cfg.data.max_samples == 12_800
        assert cfg.data.task == "fashion_mnist" and cfg.data.val_split == "test" and cfg.data.mixup == "input"
        assert cfg.data.params["root"] == "/data/fmnist" and cfg.optim.name == "sgd" and cfg.optim.lr == 0.05
    assert nfm.out_dir == str(tmp_path / "runs" / "nfm-seed2")
    same = lambda cfg: {k: v for k, v in asdict(cfg).items() if k not in ("model", "out_dir")}
    assert same(base) == same(nfm)                                             # same data, optimizer and steps
    assert npr.parse(["--steps", "100"]).samples == 10_000                     # the whole test split
    with pytest.raises(SystemExit):
        npr.parse(["--steps", "100", "--samples", "6000"])                     # 93 steps an epoch < 100
    with pytest.raises(SystemExit):
        npr.parse(["--models", "base,vit"])


def test_table_has_mean_std_per_seed_and_the_paired_difference():
    a = npr.parse(["--steps", "200"])
    results = {npr.run_name(m, s): {"model": m, "seed": s, "parameters": p, "seconds": 120,
                                    "test": {"top1": t, "samples": 10_000}, "occluded": {"top1": o}}
               for m, p, vals in (("base", 19_650, [(0.70, 0.50), (0.72, 0.52)]),
                                  ("nfm", 58_808, [(0.75, 0.51), (0.73, 0.56)]))
               for s, (t, o) in enumerate(vals)}
    table = npr.format_table(results, a)
    assert ("| PreActResNet | 19.6 k | 71.00 ± 1.41 (n = 2) | 70.00 / 72.00 | 51.00 ± 1.41 (n = 2) | 50.00 / 52.00 "
            "| 2.0 |") in table
    assert "| NFM(PreActResNet) | 58.8 k | 74.00 ± 1.41 (n = 2) | 75.00 / 73.00 |" in table
    assert "clean 3.00 ± 2.83 (n = 2); occluded 2.50 ± 2.12 (n = 2)" in table         # 5, 1 and 1, 4 points
    paper = npr.format_paper()
    assert "| CIFAR-10 | PreResNet18 | 96.27 ± 0.2 | 96.56 ± 0.09 |" in paper
    assert "| Tiny-Imagenet | PreResNet18 | 57.12 ± 0.3 | 58.32 ± 0.2 |" in paper and "| 82.46 | 84.11 |" in paper


@pytest.mark.slow
def test_quick_run_scores_the_last_checkpoint_and_report_rebuilds_it(tmp_path, capsys):
    data, out = tmp_path / "fashion-mnist", tmp_path / "out"
    write_mnist(data, n=64, n_test=32, balanced=True)                 # Debian's idx layout, 64 + 32 images
    args = ["--quick", "--workers", "0", "--seeds", "2", "--out", str(out), "--data-root", str(data)]
    assert npr.main(args) == 0
    records = {r["key"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert sorted(records) == ["base-seed0", "base-seed1", "nfm-seed0", "nfm-seed1"]
    assert len({json.dumps(r["sizes"]) for r in records.values()}) == 1             # one budget for both rows
    for key, r in records.items():
        test, occluded = r["test"], r["occluded"]
        assert test["step"] == occluded["step"] == 4 and test["samples"] == occluded["samples"] == 32
        again = npr.score_last(out / "runs" / key)                                   # the last checkpoint, clean
        assert again["top1"] == pytest.approx(test["top1"]) and again["loss"] == pytest.approx(test["loss"], rel=1e-5)
        assert occluded["size"] == 16 and occluded["loss"] != pytest.approx(test["loss"], rel=1e-6)  # boxes seen
        assert npr.score_last(out / "runs" / key, 16) == occluded                    # same boxes each time
    configs = [OmegaConf.load(out / "runs" / f"{m}-seed1" / "config.yaml") for m in ("base", "nfm")]
    for c in configs:
        c.pop("model"), c.pop("out_dir")
    assert configs[0] == configs[1] and configs[0].seed == 1                         # same data, seed and steps
    study = json.loads((out / "study.json").read_text())
    assert study["seeds"] == [0, 1] and study["source"] is None
    nfm = [r["test"]["top1"] for r in study["results"] if r["model"] == "nfm"]
    assert nfm == [records[f"nfm-seed{s}"]["test"]["top1"] for s in (0, 1)]          # what Seeds(..., "test.top1") reads
    table = (out / "table.md").read_text()
    assert f"{100 * records['nfm-seed1']['occluded']['top1']:.2f}" in table and "on 32 test images" in table
    (out / "table.md").unlink()
    assert npr.main([*args, "--report"]) == 0                                       # no training
    rebuilt = json.loads((out / "study.json").read_text())
    assert rebuilt["results"] == study["results"] and (out / "table.md").read_text() == table
    assert rebuilt["source"]["command"].endswith("--report") and rebuilt["seeds"] == [0, 1]
    assert npr.main(args) == 0
    assert "4 runs, 4 already in" in capsys.readouterr().out
