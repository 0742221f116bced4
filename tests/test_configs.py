"""Every shipped config parses, names a real model and task, and builds its model."""
import json
from pathlib import Path

import pytest
import torch

from modwire import cli
from modwire.tasks import get_task
from modwire.training import build_model_for_task, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def test_there_are_paper_and_cpu_configs():
    names = {p.relative_to(ROOT / "configs").as_posix() for p in CONFIGS}
    assert {"nac_tiny_imagenet.yaml", "perceiver_io_tiny_imagenet.yaml", "cpu/nac_tiny_imagenet.yaml",
            "cpu/nac_listops.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_config_builds_its_model(path):
    cfg = load_config(str(path))
    model = build_model_for_task(cfg)
    assert model.num_classes == get_task(cfg.data.task).num_classes


def test_table4_config_matches_the_table():
    cfg = load_config(str(ROOT / "configs" / "nac_tiny_imagenet.yaml"))
    assert cfg.model.name == "nac_tiny_imagenet" and cfg.data.batch_size == 1024 and cfg.epochs == 400
    assert cfg.optim.name == "adamw" and cfg.optim.weight_decay == 0.05
    assert cfg.optim.lr == pytest.approx(3e-4 * 1024 / 512) and cfg.optim.min_lr == pytest.approx(1e-5 * 2)
    assert cfg.optim.warmup_steps == 25 * (100_000 // 1024)


def test_train_a_cpu_config_then_eval_reproduces_its_metric(tmp_path, capsys):
    path = ROOT / "configs" / "cpu" / "nac_listops.yaml"
    assert cli.main(["train", str(path), "--set", f"out_dir={tmp_path}", "max_steps=3", "progress=false",
                     "data.params.size={train: 192, val: 32, test: 32}"]) == 0
    reported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert reported["status"] == "finished" and reported["step"] == 3
    assert cli.main(["eval", str(tmp_path)]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["top1"] == pytest.approx(reported["val"]["top1"]) and again["loss"] == pytest.approx(reported["val"]["loss"])


def test_cpu_listops_configs_use_each_models_learning_rate():
    """experiments/table1_ladder.py: at Perceiver IO's lr the NAC never leaves the label-prior
    plateau on short ListOps (its MLP-generated initial states take ~56x larger relative Adam
    steps than free latents, tests/models/test_nac.py); each config holds its model's best."""
    nac = load_config(str(ROOT / "configs" / "cpu" / "nac_listops.yaml"))
    pio = load_config(str(ROOT / "configs" / "cpu" / "perceiver_io_listops.yaml"))
    assert nac.model.name == "nac_small" and pio.model.name == "perceiver_io_small"
    assert (nac.optim.lr, nac.optim.warmup_steps) == (5e-4, 200) and (pio.optim.lr, pio.optim.warmup_steps) == (1e-3, 50)
    assert nac.data.params == pio.data.params and nac.max_steps == pio.max_steps


def test_ni_cpu_config_trains_evaluates_and_finetunes(tmp_path, capsys):
    """NI Table 1's protocol end to end at toy size: train on the 20 functions, eval, then new CLS
    tokens for the 10 held-out ones trained alone (`--train cls`): the other weights stay put."""
    run = tmp_path / "ni"
    size = "data.params.size={train: 64, val: 32}"
    assert cli.main(["train", str(ROOT / "configs" / "cpu" / "ni_fuzzy_boolean.yaml"), "--set", f"out_dir={run}",
                     "max_steps=2", "progress=false", "data.batch_size=32", size]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli.main(["eval", str(run)]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["r2"] == pytest.approx(trained["val"]["r2"]) and "r2_std" in again
    out = tmp_path / "ft"
    assert cli.main(["finetune", str(run), "--task", "fuzzy_boolean_adapt", "--train", "cls", "--seeds", "0",
                     "--epochs", "1", "--batch-size", "32", "--out", str(out), "--set", size, "progress=false"]) == 0
    import modwire
    from modwire.training.checkpoint import choose_checkpoint

    before = modwire.from_pretrained(choose_checkpoint(run)[0])
    after = modwire.from_pretrained(choose_checkpoint(out / "seed-0")[0])
    assert after.config.num_cls_tokens == 10 and before.config.num_cls_tokens == 20
    b, a = before.state_dict(), after.state_dict()
    assert set(a) == set(b) and a["cls_tokens"].shape == (10, b["cls_tokens"].shape[1])
    assert all(torch.equal(a[k], b[k]) for k in a if not k.startswith(("cls_tokens", "heads.")))
