"""``make demo`` (``modwire.demo``): the dropping table, its data choice, the race and forward modes."""
import csv
import re
from pathlib import Path

import pytest
import yaml
from task_fixtures import write_mnist

import modwire
from modwire import demo

ROOT = Path(__file__).resolve().parents[1]


def _table(out: str) -> dict[float, list[str]]:
    rows = re.findall(r"^\s*([\d.]+)% \|\s*(\d+)\s+([\d.]+)%\s+([\d.]+) \|\s*(\d+)\s+([\d.]+)%\s+([\d.]+)$",
                      out, re.M)
    return {float(r[0]) / 100: list(r[1:]) for r in rows}


def test_demo_main_path_drops_modules_and_prints_the_table(tmp_path, capsys):
    demo.main(["--dataset", "digits", "--steps", "2", "--drop", "0,0.5,0.9375", "--max-samples", "24",
               "--no-plots", "--no-progress", "--out-dir", str(tmp_path), "--set", "data.batch_size=16"])
    out = capsys.readouterr().out
    assert "dataset digits: scikit-learn's 8x8 digits, as asked" in out
    table = _table(out)
    assert sorted(table) == [0.0, 0.5, 0.9375]
    assert [table[f][0] for f in sorted(table)] == ["64", "32", "4"]   # NAC processor modules kept
    assert [table[f][3] for f in sorted(table)] == ["64", "32", "4"]   # Perceiver IO latents kept
    # the printed accuracies are analyze()'s, from the CSV it wrote
    with open(tmp_path / "analysis" / "modules_dropped.csv") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        col = 1 if r["model"] == "nac_small" else 4
        assert table[float(r["fraction_dropped"])][col] == f"{100 * float(r['top1']):.1f}"
    assert "NAC paper (§3, Fig. 5a / 15" in out and "less than 3%" in out
    assert re.search(r"→ the pattern (holds|does NOT hold) in this run", out)
    assert "2 / 2 training steps" in out and "plot: none (--no-plots)" in out
    assert (tmp_path / "nac_small" / "checkpoints" / "last" / "model.safetensors").is_file()


def test_demo_falls_back_to_digits_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("MODWIRE_SYSTEM_DATASETS", str(tmp_path / "not-installed"))
    data = demo.pick_data("auto")
    assert data.task == "digits" and "data.task=digits" in data.train
    assert "Fashion-MNIST is not readable" in data.why and "apt-get install dataset-fashion-mnist" in data.why
    with pytest.raises(ValueError, match="root=... is required"):
        demo.pick_data("fashion_mnist")


def test_demo_uses_fashion_mnist_when_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("MODWIRE_SYSTEM_DATASETS", str(tmp_path))   # dataset-fashion-mnist's files, 10 + 10 images
    write_mnist(tmp_path / "fashion-mnist", n=10, balanced=True)
    data = demo.pick_data("auto")
    assert data.task == "fashion_mnist" and "data.task=fashion_mnist" in data.train
    assert str(tmp_path / "fashion-mnist") in data.why and "dataset-fashion-mnist" in data.why


def test_demo_race_trains_both_models_and_prints_the_table(tmp_path, capsys):
    demo.main(["--race", "--no-progress", "--out-dir", str(tmp_path), "--set", "max_steps=2",
               "data.params.size={train: 32, val: 4, test: 4}", "data.batch_size=16"])
    out = capsys.readouterr().out
    rows = {l.split()[0]: l.split() for l in out.splitlines() if l.startswith(("nac_small", "perceiver_io_small"))}
    assert set(rows) == {"nac_small", "perceiver_io_small"}
    for name, cols in rows.items():
        model = modwire.create_model(name, tokenizer={"kind": "embedding", "vocab_size": 16, "max_len": 64,
                                                     "token_dim": 96})
        assert cols[1] == f"{model.num_parameters():,}"
        assert 0.0 <= float(cols[2]) <= 1.0 and float(cols[4]) > 0
    assert "listops, 2 training steps per model" in out
    assert (tmp_path / "race" / "nac_small" / "checkpoints" / "last" / "model.safetensors").is_file()
    # each model at its own best lr and warm-up (experiments/table1_ladder.py), as its CPU config
    for name, config in (("nac_small", "nac_listops.yaml"), ("perceiver_io_small", "perceiver_io_listops.yaml")):
        optim = yaml.safe_load((tmp_path / "race" / name / "config.yaml").read_text())["optim"]
        expected = yaml.safe_load((ROOT / "configs" / "cpu" / config).read_text())["optim"]
        assert (optim["lr"], optim["warmup_steps"]) == (expected["lr"], expected["warmup_steps"])


def test_forward_demo_prints_parameter_counts_and_throughput(capsys):
    demo.main(["--forward", "--batch", "2", "--iters", "1", "--models", "nac_small", "perceiver_io_small"])
    out = capsys.readouterr().out
    for name in ("nac_small", "perceiver_io_small"):
        line = next(l for l in out.splitlines() if l.startswith(name))
        assert f"{modwire.create_model(name).num_parameters():,}" in line and "[2, 10]" in line
    assert re.search(r"throughput ratio .*: \d+\.\d\d", out)


def test_demo_replaces_only_its_own_runs(tmp_path):
    out = tmp_path / "demo"
    demo.fresh_out_dir(str(out), ("nac_small", "analysis"))
    (out / "nac_small" / "checkpoints").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    demo.fresh_out_dir(str(out), ("nac_small", "analysis"))     # a second demo starts fresh
    assert not (out / "nac_small").exists() and (out / "notes.txt").read_text() == "mine"
