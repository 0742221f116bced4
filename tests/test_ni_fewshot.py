"""modwire.experiments.ni_fewshot: the jobs it plans, its table, and an in-process smoke run."""
import argparse
import json
import re
from pathlib import Path

import pytest
from task_fixtures import write_mnist

from modwire.experiments import ni_fewshot as fewshot

ROOT = Path(__file__).resolve().parents[1]


def args(**kw) -> argparse.Namespace:
    base = dict(models="ni,vit", shots="1,2,5,10,20", seeds=3, ni_lr=None, vit_lr=None, lr_check=False,
                lr_check_only=False, quick=False, data_root=None)
    return argparse.Namespace(**{**base, **kw})


def test_plan_pretrains_both_then_finetunes_every_k_at_the_papers_lrs():
    pre, ft = fewshot.plan(args())
    assert [j.key for j in pre] == ["pretrain/ni", "pretrain/vit"]
    assert len(ft) == 2 * 5 and {j.seeds for j in ft} == {3}
    assert {(j.model, j.lr) for j in ft} == {("ni", 0.05), ("vit", 0.03)}          # NI App. C.2.2
    assert [j.model for j in ft[:5]] == ["ni"] * 5 and ft[0].shots == 20            # the longest jobs first
    _, ft = fewshot.plan(args(ni_lr=1e-3, lr_check=True))
    checks = [j for j in ft if j.check]
    assert {(j.model, j.lr) for j in checks} == {(m, lr) for m, lrs in fewshot.LR_CHECK.items() for lr in lrs}
    assert {j.seeds for j in checks} == {1} and {j.lr for j in ft if j.model == "ni" and not j.check} == {1e-3}
    with pytest.raises(SystemExit, match=r"unknown model \['nac'\]"):
        fewshot.plan(args(models="ni,nac"))


def test_pretrain_config_is_the_cpu_sized_preset_with_table_4_optimiser(tmp_path):
    pre = fewshot.Job("ni").pretrain_config(tmp_path)
    assert pre.model.name == "ni_digits" and pre.model.overrides["d_model"] == 64
    assert pre.model.overrides["tokenizer"]["patch_size"] == 8 and pre.max_steps == fewshot.MODELS["ni"].steps
    assert pre.data.task == "digits_multitask_offline" and pre.data.batch_size == 128
    assert (pre.optim.name, pre.optim.warmup_steps, pre.optim.min_lr) == ("radam", 0, 1e-6)   # NI Tables 4-5
    assert pre.out_dir == str(tmp_path / "pretrain" / "ni")


def _record(model, shots, mean, std, n=3, lr=None, check=False):
    lr = lr if lr is not None else fewshot.MODELS[model].finetune_lr
    return {"key": fewshot.Job(model, shots, n, lr, check=check).key, "model": model, "shots": shots, "lr": lr,
            "check": check, "mean": mean, "std": std, "n": n, "values": {}, "seconds": 1.0}


def test_table_puts_both_models_side_by_side_with_the_gap():
    pre = {"key": "pretrain/ni", "model": "ni", "shots": -1, "parameters": 1234, "steps_done": 600, "seconds": 60,
           "val": {"top1": 0.8, "top1_svhn_like": 0.7, "top1_mnist_m_like": 0.8, "top1_mnist_like": 0.9}}
    rs = [pre, _record("ni", 1, 0.40, 0.02), _record("vit", 1, 0.35, 0.01), _record("ni", 5, 0.6, 0.03),
          _record("ni", 5, 0.2, None, n=1, lr=1e-3, check=True)]
    table = fewshot.format_table({r["key"]: r for r in rs}, ["ni", "vit"], {"ni": 0.05, "vit": 0.03})
    assert "| Neural Interpreter | 1,234 | 600 | 80.0 | 70.0 | 80.0 | 90.0 | 1.0 |" in table
    assert "| 1 | 40.0 ± 2.0 | 35.0 ± 1.0 | +5.0 | 3 |" in table
    assert "| 5 | 60.0 ± 3.0 |  |  | 3 |" in table                       # the ViT's k = 5 is missing
    assert "| Neural Interpreter | 5 | 0.001 | 20.0 |" in table              # the lr check, apart from the curve
    assert "NI ahead" in table


def test_results_file_cut_short_loses_only_the_last_job(tmp_path):
    path = tmp_path / "results.jsonl"
    good = _record("ni", 1, 0.4, 0.02)
    path.write_text(json.dumps(good) + "\n" + '{"key": "finetune/vit')
    assert fewshot.load_results(path) == {good["key"]: good}
    path.write_text('{"key": \n' + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match="line 1"):
        fewshot.load_results(path)


def test_quick_run_pretrains_finetunes_reports_and_resumes(tmp_path, capsys):
    data = tmp_path / "fashion-mnist"       # the few-shot target: Fashion-MNIST's idx files, every class
    write_mnist(data, n=120, n_test=60, balanced=True)
    argv = ["--quick", "--shots", "1", "--seeds", "2", "--workers", "0", "--out", str(tmp_path), "--data-root", str(data)]
    assert fewshot.main(argv) == 0
    results = fewshot.load_results(tmp_path / "results.jsonl")
    assert sorted(results) == ["finetune/ni_lr0.05/1shot", "finetune/vit_lr0.03/1shot", "pretrain/ni", "pretrain/vit"]
    for key in ("pretrain/ni", "pretrain/vit"):
        assert results[key]["steps_done"] == 3 and 0 <= results[key]["val"]["top1"] <= 1
    for key in ("finetune/ni_lr0.05/1shot", "finetune/vit_lr0.03/1shot"):
        r = results[key]
        assert r["n"] == 2 and len(r["values"]) == 2 and 0 <= r["mean"] <= 1 and r["batch_size"] == 10
        seed_dir = tmp_path / key / "seed-1"
        assert (seed_dir / "result.json").is_file() and not (seed_dir / "checkpoints").exists()
        summary = json.loads((tmp_path / key / "summary.json").read_text())
        assert summary["shots"] == 1 and summary["ways"] == 10 and summary["optimizer"] == "radam"
        assert summary["lr"] == summary["min_lr"] == r["lr"]                   # constant lr (NI App. C.2.2)
    out = capsys.readouterr().out
    ni, vit = results["finetune/ni_lr0.05/1shot"], results["finetune/vit_lr0.03/1shot"]
    assert re.search(rf"^\| 1 \| {100 * ni['mean']:.1f} ± [0-9.]+ \| {100 * vit['mean']:.1f} ± ", out, re.M)
    assert (tmp_path / "table.md").is_file() and (tmp_path / "fewshot.png").is_file()
    cfg = fewshot.Job("ni", 1, 2, 0.05, quick=True, data_root=str(data)).finetune_config_for(tmp_path)[0](0, tmp_path / "x")
    assert (cfg.data.task, cfg.data.val_split, cfg.data.params["upsample_to"], cfg.data.params["channels"]) == \
        ("fashion_mnist", "test", 32, 3)
    assert cfg.data.params["root"] == str(data)
    assert cfg.finetune.train == ["all"] and cfg.finetune.new_task and cfg.optim.warmup_steps == 0
    assert fewshot.main(argv) == 0                                              # resumed: nothing runs again
    again = capsys.readouterr().out
    assert "2 jobs, 2 already in" in again and again.count("0 to run") == 2
