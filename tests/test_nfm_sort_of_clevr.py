"""modwire.experiments.nfm_sort_of_clevr (NFM Table 6 / 7 at CPU scale): its runs are the two Table 6 presets on
sort_of_clevr_image with one budget, and an in-process smoke run trains, scores the test split per question
kind, tabulates next to the paper and skips finished runs on a rerun."""
import json

import pytest

from modwire.experiments import nfm_sort_of_clevr as soc
from modwire.training import load_config


def test_runs_are_the_table6_presets_with_one_budget(tmp_path):
    a = soc.parse(["--steps", "300", "--batch", "32", "--stem", "1", "--holdout", "2"])
    cnn = load_config(values=soc.row_overrides("cnn", a, 0, tmp_path))
    nfm = load_config(values=soc.row_overrides("nfm", a, 1, tmp_path))
    one = load_config(values=soc.row_overrides("nfm_one_pass", a, 0, tmp_path))
    assert (cnn.model.name, nfm.model.name) == ("cnn_mlp_sort_of_clevr", "nfm_cnn_mlp_sort_of_clevr")
    assert cnn.model.overrides == {"block_order": "conv_relu_bn"}                  # the authors' order (issue 23)
    assert nfm.model.overrides == {"stem_layers": 1, "block_order": "conv_relu_bn"}
    assert one.model.overrides == {"stem_layers": 1, "nfm": {"passes": 1}, "block_order": "conv_relu_bn"}
    old = soc.parse(["--block-order", "conv_bn_relu"])
    old_cnn = load_config(values=soc.row_overrides("cnn", old, 0, tmp_path))
    assert old_cnn.model.overrides == {"block_order": "conv_bn_relu"}
    assert soc.sizes(old)["block_order"] == "conv_bn_relu" != soc.sizes(a)["block_order"]
    for cfg in (cnn, nfm):
        assert cfg.data.task == "sort_of_clevr_image" and cfg.data.params["holdout"] == 2
        assert cfg.max_steps == 300 and cfg.data.batch_size == 32 and cfg.optim.lr == 1e-3
    assert nfm.seed == 1 and nfm.out_dir.endswith("runs/nfm-holdout2-seed1")
    with pytest.raises(SystemExit):
        soc.parse(["--rows", "cnn,nope"])


def test_table_puts_mean_and_std_over_seeds_next_to_table6():
    a = soc.parse(["--rows", "cnn,nfm"])
    results = {f"cnn-seed{s}": {"row": "cnn", "seed": s, "parameters": 241_522, "seconds": 60,
                                "test": {"top1_relational": r, "top1_non_relational": n}}
               for s, (r, n) in enumerate([(0.5, 0.6), (0.6, 0.8)])}
    table = soc.format_table(results, a)
    assert "| CNN | relational | 68.26 ± 0.61 | 55.00 ± 7.07 (n = 2) | 50.00 / 60.00 | 242 k | 1.0 |" in table
    assert "| CNN | non-relational | 71.78 ± 9.30 | 70.00 ± 14.14 (n = 2) |" in table
    assert "| NFM(CNN) | relational | 74.95 ± 1.58 | not run |" in table
    a.holdout = 3
    assert "| NFM(CNN) | relational | 38.33 | not run |" in soc.format_table({}, a)


@pytest.mark.slow
def test_quick_run_trains_scores_each_kind_and_skips_finished_runs(tmp_path, capsys):
    args = ["--quick", "--workers", "0", "--seeds", "1", "--out", str(tmp_path)]
    assert soc.main(args) == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(r["row"] for r in records) == ["cnn", "nfm"]
    for r in records:
        assert r["test"]["split"] == "test" and r["test"]["samples"] == 40     # 2 test images × 20 questions
        assert r["test"]["checkpoint"].startswith(f"runs/{r['key']}/checkpoints/best")   # relative to --out
        assert 0 <= r["test"]["top1_relational"] <= 1 and 0 <= r["test"]["top1_non_relational"] <= 1
    table = (tmp_path / "table.md").read_text()
    nfm = next(r for r in records if r["row"] == "nfm")
    assert f"| NFM(CNN) | relational | 74.95 ± 1.58 | {100 * nfm['test']['top1_relational']:.2f} ± 0.00 (n = 1)" in table
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    assert soc.main(args) == 0
    assert "2 runs, 2 already in" in capsys.readouterr().out
