"""modwire.experiments.table1_ladder: the jobs it plans, its OOD splits, its table, and a smoke run."""
import argparse
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modwire.experiments import table1_ladder as ladder
from modwire.tasks import build_dataset
from modwire.tasks.augment.rand_augment import rotate
from modwire.tasks.synthetic.listops import nesting_depth

ROOT = Path(__file__).resolve().parents[1]


def args(**kw) -> argparse.Namespace:
    base = dict(rows=",".join(ladder.DEFAULT_ROWS), tasks="listops,fashion_mnist", seeds=3, steps_scale=1.0,
                sweep=False, sweep_only=False, sweep_seeds=1, sweep_tasks="listops", quick=False, out="unused")
    return argparse.Namespace(**{**base, **kw})


def test_default_plan_is_every_row_task_and_seed_at_one_budget():
    jobs = ladder.plan(args(), "fashion_mnist")
    assert len(jobs) == len(ladder.DEFAULT_ROWS) * 2 * 3
    assert [j.seed for j in jobs] == sorted(j.seed for j in jobs)          # seed 0 of every row first
    assert {j.steps for j in jobs if j.task == "listops"} == {ladder.STEPS["listops"]}
    for j in jobs:                                                          # each model at its config's lr
        assert (j.lr, j.warmup) == ladder.config_setting(j.row, j.task)
    assert {(j.lr, j.warmup) for j in jobs if j.row == "pio" and j.task == "listops"} == {(1e-3, 50)}


def test_sweep_reuses_the_ladder_run_at_the_config_setting():
    jobs = ladder.plan(args(rows="pio", tasks="listops", seeds=1, sweep=True), "fashion_mnist")
    grid = len(ladder.SWEEP_LRS) * len(ladder.SWEEP_WARMUPS) * len(ladder.SWEEP_ROWS)
    assert len(jobs) == grid                     # the ladder's pio run is the sweep's (1e-3, 50) point
    assert "listops/pio_lr0.001_w50/steps600/seed0" in {j.key for j in jobs}
    assert {(j.lr, j.warmup) for j in jobs if j.row == "nac_scale_free"} == \
        set(itertools.product(ladder.SWEEP_LRS, ladder.SWEEP_WARMUPS))


def test_unknown_rows_and_tasks_are_named():
    with pytest.raises(SystemExit, match=r"unknown task or row \['nac_typo'\]"):
        ladder.plan(args(rows="pio,nac_typo"), "fashion_mnist")


def test_job_config_is_the_models_cpu_config_with_the_row_on_top(tmp_path):
    nac = ladder.Job("frozen", "listops", 2, 600, *ladder.config_setting("frozen", "listops")).config(tmp_path)
    assert nac.model.name == "nac_small" and nac.seed == 2 and nac.max_steps == 600
    assert nac.model.overrides["frozen_graph"]["name"] == "scale_free"
    lr, warm = nac.optim.lr, nac.optim.warmup_steps
    assert nac.out_dir == str(tmp_path / f"listops/frozen_lr{lr:g}_w{warm}/steps600/seed2")
    pio = ladder.Job("pio", "listops", 0, 600, lr=5e-4, warmup=200).config(tmp_path)
    assert pio.model.name == "perceiver_io_small" and pio.optim.lr == 5e-4 and pio.optim.warmup_steps == 200
    prior = ladder.Job("nac_ring", "listops", 0, 600, 1e-3, 50).config(tmp_path)
    assert prior.aux_loss_weights == {"graph": 5e-3}


def test_listops_ood_is_deeper_than_any_training_expression():
    params = {"seed": 0, "size": {"train": 200, "val": 10, "test": 10}, "min_len": 5, "max_len": 64, "max_depth": 3}
    ood = ladder.listops_ood(params, n=300)
    train = build_dataset("listops", "train", **params)
    assert max(nesting_depth(train[i][0]) for i in range(len(train))) == 2
    depths = [nesting_depth(ood[i][0]) for i in range(len(ood))]
    assert len(ood) > 60 and min(depths) == 3 and max(depths) >= 4
    assert max(len(ood[i][0]) for i in range(len(ood))) < 64              # same lengths as training


def test_image_ood_rotates_the_test_images():
    iid = build_dataset("digits", "test")
    ood = ladder.image_ood("digits", {})
    x, y = iid[5]
    x_ood, y_ood = ood[5]
    assert int(y_ood) == int(y)
    torch.testing.assert_close(x_ood, rotate(x, 30.0))
    bar = torch.zeros(1, 32, 32)
    bar[0, 10:22, 14:18] = 1.0                                  # a vertical bar ...
    torch.testing.assert_close(rotate(bar, 90.0)[0, 14:18, 10:22], torch.ones(4, 12))   # ... lies down
    assert rotate(bar, 30.0).sum() == pytest.approx(48.0, rel=0.02)   # mass kept, nothing cropped


def _result(row, seed, iid, ood, lr, warm=50, task="listops"):
    return {"task": task, "row": row, "seed": seed, "steps": 600, "lr": lr, "warmup": warm, "iid": iid,
            "ood": ood, "image_task": "fashion_mnist", "ood_split": ladder.OOD_SPLITS[task]}


def test_table_prints_the_ladder_next_to_the_paper_then_the_sweep():
    nac_lr, nac_warm = ladder.config_setting("nac_scale_free", "listops")
    pio_lr, pio_warm = ladder.config_setting("pio", "listops")
    off = 2e-3 if nac_lr != 2e-3 else 1e-3
    results = [_result("pio", 0, 0.40, 0.20, pio_lr, pio_warm), _result("pio", 1, 0.42, 0.22, pio_lr, pio_warm),
               _result("pio", 2, 0.44, 0.18, pio_lr, pio_warm),
               _result("nac_scale_free", 0, 0.41, 0.25, nac_lr, nac_warm),
               _result("nac_scale_free", 0, 0.30, 0.10, off, nac_warm)]
    groups = ladder.aggregate(results)
    g = groups[("listops", "pio", pio_lr, pio_warm, 600)]
    assert g["seeds"] == 3 and g["iid"] == pytest.approx(0.42) and g["iid_std"] == pytest.approx(0.02)
    lines = ladder.format_table(groups, ["listops", "fashion_mnist"]).splitlines()
    assert f"| Perceiver IO | {pio_lr:g} | {pio_warm} | 600 | 3 |  42.0 ± 2.0 |  20.0 ± 2.0 | 58.89 | 17.57 |" in lines
    sweep_at = lines.index(next(l for l in lines if l.startswith("learning-rate / warm-up sweep")))
    ladder_sf = [l for l in lines[:sweep_at] if l.startswith("| NAC with Scale-Free Prior")]
    assert ladder_sf == [f"| NAC with Scale-Free Prior | {nac_lr:g} | {nac_warm} | 600 | 1 |  41.0       |  25.0"
                         f"       | 60.76 | 19.52 |"]                      # the off-config run is not in the ladder
    sweep = [l for l in lines[sweep_at:] if l.startswith("| NAC with Scale-Free Prior")]
    assert sweep == [f"| NAC with Scale-Free Prior{' *' if lr == nac_lr else ''} | {lr:g} | {nac_warm} | 600 | 1 | "
                     f"{' 41.0' if lr == nac_lr else ' 30.0'}       | {' 25.0' if lr == nac_lr else ' 10.0'}       |  |  |"
                     for lr in sorted([nac_lr, off])]
    assert not any("fashion_mnist" in l for l in lines)                    # no results, no block


def test_results_file_cut_short_by_a_kill_loses_only_the_last_run(tmp_path):
    path = tmp_path / "results.jsonl"
    good = _result("pio", 0, 0.4, 0.3, 1e-3)
    path.write_text(json.dumps({**good, "key": "a"}) + "\n" + json.dumps({**good, "key": "b"})[:25])
    assert list(ladder.load_results(path)) == ["a"]                         # "b" is trained again
    path.write_text("{oops\n" + json.dumps({**good, "key": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"results.jsonl, line 1: not a JSON result"):
        ladder.load_results(path)


@pytest.mark.parametrize("argv", [["--workers", "0"], ["--seeds", "x"], ["--steps-scale", "-1"],
                                  ["--steps-scale", "nan"]])
def test_bad_counts_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        ladder.main([*argv, "--report", "--out", "unused"])
    assert e.value.code == 2 and "expected a" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_trains_scores_and_resumes(tmp_path):
    cmd = [sys.executable, "-m", "modwire.experiments.table1_ladder", "--quick", "--rows", "pio,nac_scale_free", "--tasks", "listops",
           "--seeds", "1", "--workers", "1", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(r["row"] for r in results) == ["nac_scale_free", "pio"]
    for r in results:
        assert r["steps_done"] == 3 and 0 <= r["iid"] <= 1 and 0 <= r["ood"] <= 1
        assert not (tmp_path / r["key"] / "checkpoints").exists()           # removed, metrics kept
        assert (tmp_path / r["key"] / "metrics.jsonl").is_file()
        cell = f"{100 * r['iid']:5.1f}"
        assert re.search(rf"^\| {re.escape(ladder.ROW[r['row']].label)} \| {r['lr']:g} \| .*\| {re.escape(cell)} ",
                         out, re.M)
    assert (tmp_path / "table.md").read_text().count("| 3 | 1 |") == 2   # steps, seeds
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "2 runs, 2 already in" in again and "0 to train" in again       # resumed: nothing retrained
    stale = [{**r, "ood_split": "an earlier definition"} for r in results]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stale))
    assert ladder.load_results(tmp_path / "results.jsonl") == {}            # retrained, not mixed in
