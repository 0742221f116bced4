"""The README's preset table and the demo stay true to the code."""
import re
from pathlib import Path

import pytest

import modwire
from modwire import demo

ROOT = Path(__file__).resolve().parents[1]


def _readme_presets():
    rows = re.findall(r"^\| (`[^|]+`) \| ([^|]+) \| ([^|]+) \|$", (ROOT / "README.md").read_text(), re.M)
    for names, _, params in rows:
        counts = re.findall(r"([\d.]+) ([Mk])", params)
        yield re.findall(r"`([^`]+)`", names), [float(v) * (1e6 if u == "M" else 1e3) for v, u in counts]


def test_readme_preset_table_matches_registry_and_parameter_counts():
    seen = set()
    for names, counts in _readme_presets():
        assert len(names) == len(counts), names
        for name, count in zip(names, counts):
            n = modwire.create_model(name).num_parameters()
            assert abs(n - count) / n < 0.01, (name, n, count)
            seen.add(name)
    assert seen == set(modwire.list_models()), "every preset appears in the README table"


def test_demo_trains_both_models_and_prints_the_table(tmp_path, capsys):
    demo.main(["--no-progress", "--out-dir", str(tmp_path), "--set", "max_steps=3",
               "data.params.size={train: 64, val: 4, test: 4}", "data.batch_size=16"])
    out = capsys.readouterr().out
    rows = {l.split()[0]: l.split() for l in out.splitlines() if l.startswith(("nac_small", "perceiver_io_small"))}
    assert set(rows) == {"nac_small", "perceiver_io_small"}
    for name, cols in rows.items():
        model = modwire.create_model(name, tokenizer="embedding", vocab_size=16, max_len=64, token_dim=96)
        assert cols[1] == f"{model.num_parameters():,}"
        assert 0.0 <= float(cols[2]) <= 1.0 and float(cols[4]) > 0
    assert "listops, 3 training steps per model" in out
    assert (tmp_path / "nac_small" / "checkpoints" / "last" / "model.safetensors").is_file()


def test_forward_demo_prints_parameter_counts_and_throughput(capsys):
    demo.main(["--forward", "--batch", "2", "--iters", "1", "--models", "nac_small", "perceiver_io_small"])
    out = capsys.readouterr().out
    for name in ("nac_small", "perceiver_io_small"):
        line = next(l for l in out.splitlines() if l.startswith(name))
        assert f"{modwire.create_model(name).num_parameters():,}" in line and "[2, 10]" in line
    assert re.search(r"throughput ratio .*: \d+\.\d\d", out)


def test_demo_rejects_unknown_model_with_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(["--models", "nac_huge"])
    assert e.value.code == 2
    assert "invalid choice: 'nac_huge'" in capsys.readouterr().err
