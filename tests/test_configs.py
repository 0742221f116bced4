"""Every shipped config parses, names a real model and task, and builds its model."""
import json
from pathlib import Path

import pytest

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
