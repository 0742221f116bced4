"""modwire.experiments.nac_fewshot (NAC Fig. 4 at CPU scale): the jobs it plans, its table, and an in-process
quick run whose two models fine-tune on the same k-shot subsets and whose study.json ``--report`` rebuilds."""
import argparse
import json
import statistics
from pathlib import Path

import pytest
import yaml
from task_fixtures import write_mnist

from modwire.experiments import nac_fewshot as fewshot
from modwire.experiments import report

LR = {m: fewshot.MODELS[m].finetune_lr for m in ("nac", "pio")}
NAC_KEY, PIO_KEY = (f"finetune/{m}_lr{LR[m]:g}/2shot" for m in ("nac", "pio"))


def args(**kw) -> argparse.Namespace:
    base = dict(models="nac,pio", shots="1,2,4,8,16", seeds=3, nac_lr=None, pio_lr=None, lr_check=False,
                lr_check_only=False, quick=False, data_root=None)
    return argparse.Namespace(**{**base, **kw})


def test_plan_pretrains_both_then_finetunes_every_k_of_fig_4_at_each_models_lr():
    pre, ft = fewshot.plan(args())
    assert [j.key for j in pre] == ["pretrain/nac", "pretrain/pio"]
    assert [(j.model, j.shots) for j in ft[:2]] == [("nac", 16), ("pio", 16)]          # the longest jobs first
    assert sorted({j.shots for j in ft}) == [1, 2, 4, 8, 16] and len(ft) == 10          # NAC Fig. 4: 1-16 shots
    assert {(j.model, j.lr) for j in ft} == {("nac", 3e-2), ("pio", 3e-2)}          # each model's lr check
    assert {j.seed_list == [0, 1, 2] for j in ft} == {True}
    _, ft = fewshot.plan(args(pio_lr=3e-3, lr_check=True))
    checks = [j for j in ft if j.check]
    assert {(j.model, j.lr) for j in checks} == {(m, lr) for m in ("nac", "pio") for lr in fewshot.LR_CHECK}
    assert {tuple(j.seed_list) for j in checks} == {(fewshot.CHECK_SEED,)} and fewshot.CHECK_SEED >= 3
    assert {j.lr for j in ft if j.model == "pio" and not j.check} == {3e-3}
    with pytest.raises(SystemExit, match=r"unknown model \['vit'\]"):
        fewshot.plan(args(models="nac,vit"))


def test_pretrain_config_is_the_cpu_config_with_the_scale_free_prior_for_the_nac(tmp_path):
    nac, pio = (fewshot.Job(m).pretrain_config(tmp_path) for m in ("nac", "pio"))
    assert (nac.model.name, pio.model.name) == ("nac_small", "perceiver_io_small")
    assert nac.model.overrides["graph_prior"] == {"name": "scale_free", "params": {"beta": 0.5}}
    assert nac.aux_loss_weights == {"graph": 5e-3} and pio.aux_loss_weights == {}
    for cfg in (nac, pio):                 # the same budget and optimiser for both (table1_ladder's Fashion-MNIST)
        assert (cfg.data.task, cfg.data.batch_size, cfg.max_steps) == ("fashion_mnist", 128, fewshot.PRETRAIN_STEPS)
        assert (cfg.optim.name, cfg.optim.lr, cfg.optim.warmup_steps) == ("adamw", 1e-3, 100)
    assert nac.out_dir == str(tmp_path / "pretrain" / "nac")


def _record(model, shots, values, check=False, lr=None):
    lr = LR[model] if lr is None else lr
    xs = list(values.values())
    return {"key": fewshot.Job(model, shots, len(xs), lr, check=check).key, "model": model, "shots": shots,
            "lr": lr, "check": check, "values": values, "mean": statistics.fmean(xs),
            "std": statistics.stdev(xs) if len(xs) > 1 else None, "n": len(xs), "epochs": 10}


def test_table_puts_both_models_side_by_side_with_the_gap():
    pre = {"key": "pretrain/nac", "model": "nac", "shots": -1, "parameters": 1234, "steps_done": 400, "seconds": 120,
           "val": {"top1": 0.8}}
    rs = [pre, _record("nac", 1, {"0": 0.3, "1": 0.5}), _record("pio", 1, {"0": 0.2, "1": 0.2}),
          _record("nac", 4, {"0": 0.6}), _record("pio", 4, {"100": 0.25}, check=True, lr=1e-2)]
    table = fewshot.format_table({r["key"]: r for r in rs}, ["nac", "pio"], LR)
    assert "| NAC (scale-free prior) | 1,234 | 400 | 80.0 | 2.0 |" in table
    assert "| 1 | 40.0 ± 14.1 | 20.0 ± 0.0 | +20.0 | 2 |" in table
    assert "| 4 | 60.0 |  |  | 1 |" in table                        # the Perceiver IO's k = 4 is missing
    assert "| Perceiver IO | 4 | 0.01 | 25.0 |" in table                 # the lr check, apart from the curve
    assert "NAC ahead of Perceiver IO" in table and "chance 12.5" in table


def _seed_config(out: Path, key: str, seed: int) -> dict:
    return yaml.safe_load((out / key / f"seed-{seed}" / "config.yaml").read_text())


@pytest.mark.slow
def test_quick_run_finetunes_both_on_the_same_subsets_and_report_rebuilds_study(tmp_path, capsys):
    data = tmp_path / "fashion-mnist"       # the pre-training set: Fashion-MNIST's idx files, every class
    write_mnist(data, n=160, n_test=40, balanced=True)
    out = tmp_path / "out"
    argv = ["--quick", "--shots", "2", "--seeds", "2", "--workers", "0", "--out", str(out), "--data-root", str(data)]
    assert fewshot.main(argv) == 0
    results = fewshot.load_results(out / "results.jsonl")
    assert sorted(results) == [NAC_KEY, PIO_KEY, "pretrain/nac", "pretrain/pio"]
    nac, pio = results[NAC_KEY], results[PIO_KEY]
    for model, key, r in (("nac", NAC_KEY, nac), ("pio", PIO_KEY, pio)):
        for seed in (0, 1):                  # each value is what the seed's run scored, on the 8 drawn classes
            done = json.loads((out / key / f"seed-{seed}" / "result.json").read_text())
            assert r["values"][str(seed)] == done["val"]["top1"]
            assert not (out / key / f"seed-{seed}" / "checkpoints").exists()
        assert r["mean"] == pytest.approx(statistics.fmean(r["values"].values())) and r["n"] == 2
        assert (r["ways"], r["batch_size"]) == (8, 2 * 8)           # the whole 2-shot 8-way set in one batch
        cfg = _seed_config(out, key, 0)
        assert cfg["data"]["task"] == "digits" and cfg["data"]["few_shot"] == {"shots": 2, "ways": 8}
        assert cfg["finetune"]["train"] == ["all"] and cfg["finetune"]["new_task"] is True
        assert cfg["optim"]["name"] == "radam" and cfg["optim"]["lr"] == cfg["optim"]["min_lr"] == LR[model]
    assert _seed_config(out, NAC_KEY, 0)["aux_loss_weights"] == {"graph": 5e-3}
    # the same subsets for both models: same data settings and seed, hence the same draw, differing across seeds
    for seed in (0, 1):
        a, b = (_seed_config(out, k, seed) for k in (NAC_KEY, PIO_KEY))
        assert a["data"] == b["data"] and a["seed"] == b["seed"] == seed
    assert nac["subsets"] == pio["subsets"] and nac["subsets"]["0"] != nac["subsets"]["1"]
    for seed, s in nac["subsets"].items():
        assert len(s["classes"]) == 8 and s["images"] == 16
        assert s["digest"] == _independent_draw(int(seed), shots=2, max_samples=100)
    _check_study(out, nac, pio)
    assert (out / "table.md").is_file() and (out / "fewshot.png").is_file()
    assert fewshot.main(argv) == 0                                              # resumed: nothing runs again
    assert capsys.readouterr().out.count("0 to run") == 2


def _independent_draw(seed: int, *, shots: int, max_samples: int) -> str:
    """The digest of the k-shot draw a seed's run trains on, from the digits labels directly."""
    import torch
    from modwire.tasks import build_dataset
    from modwire.training.finetune_setup import few_shot_indices

    train = build_dataset("digits", "train", max_samples=max_samples, sample_seed=seed)
    labels = torch.tensor([int(train[i][1]) for i in range(len(train))])
    indices, _ = few_shot_indices(labels, shots=shots, ways=8, seed=seed)
    return fewshot.subset_digest(indices)


def _check_study(out: Path, nac: dict, pio: dict) -> None:
    """study.json holds each model's per-seed values (a results-table row's selector finds them) and
    ``--report`` rebuilds the same results and seeds from results.jsonl alone."""
    ran = json.loads((out / "study.json").read_text())
    assert ran["study"] == "nac_fewshot" and ran["seeds"] == [0, 1] and ran["source"] is None
    for model, r in (("nac", nac), ("pio", pio)):
        where = {"model": model, "shots": 2, "lr": LR[model], "check": False}
        got = report.seed_values(ran, report.registry.Seeds(model, where, "values", True))
        assert got == [100 * r["values"]["0"], 100 * r["values"]["1"]]
    assert fewshot.main(["--report", "--out", str(out)]) == 0
    rebuilt = json.loads((out / "study.json").read_text())
    assert json.dumps(rebuilt["results"]) == json.dumps(ran["results"]) and rebuilt["seeds"] == ran["seeds"]
    assert rebuilt["source"]["command"] == f"python -m modwire.experiments.nac_fewshot --report --out {out}"
