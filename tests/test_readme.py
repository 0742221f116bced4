"""The README (preset table, quickstart, numbers) stays true to the code."""
import re
from pathlib import Path

import pytest
import torch

import modwire

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _readme_presets():
    rows = re.findall(r"^\| (`[^|]+`) \| ([^|]+) \| ([^|]+) \|$", README, re.M)
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


def _section_code(title: str, lang: str) -> str:
    section = README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_readme_quickstart_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # it saves to runs/nac
    scope: dict = {}
    exec(compile(_section_code("Quickstart", "python"), "README.md#quickstart", "exec"), scope)
    assert tuple(scope["logits"].shape) == (8, 10) and tuple(scope["out"].shape) == (2, 4, 10, 16)
    assert tuple(scope["inter"].link_probs.shape) == (320, 320)
    assert scope["small"].config.num_processor_modules == 40
    assert (tmp_path / "runs" / "nac" / "model.safetensors").is_file()


def test_readme_ni_example_runs_as_written():
    scope: dict = {}
    exec(compile(_section_code("Neural Interpreters and the ViT", "python"), "README.md#ni", "exec"), scope)
    assert tuple(scope["logits"].shape) == (8, 10) and tuple(scope["fast"].shape) == (8, 10)
    assert tuple(scope["compat"].shape) == (8, 5, 67) and tuple(scope["types"].shape) == (8, 67, 24)
    torch.testing.assert_close(scope["compat"].sum(1), torch.ones(8, 67), atol=1e-4, rtol=0)   # Σ_u C_ui ≈ 1
    assert scope["ni"].config.num_functions == 6 and scope["ni"].config.num_added_functions == 0  # 5 + 3 - 2


def test_readme_ait_example_runs_as_written():
    scope: dict = {}
    exec(compile(_section_code("The Associative Transformer (AiT)", "python"), "README.md#ait", "exec"), scope)
    assert tuple(scope["logits"].shape) == (16, 10) and scope["balance"].item() > 0
    rec = scope["rec"]
    assert tuple(rec.weights.shape) == (1, 8, 32, 1024) and ((rec.weights > 0).sum(-1) == 512).all()
    assert tuple(rec.memory.shape) == (1, 32, 32) and tuple(rec.energy_before.shape) == (16, 64)
    assert scope["ait"].config.eval_memory_forward is False and scope["ablation"].config.bottleneck_size == 0


def test_readme_nfm_example_runs_as_written():
    scope: dict = {}
    exec(compile(_section_code("Neural Function Modules (NFM)", "python"), "README.md#nfm", "exec"), scope)
    assert tuple(scope["y"].shape) == (8, 32, 8, 8)
    rec = scope["net"].records[2]
    assert (rec.pass_index, rec.layer_index, rec.sources) == (1, 0, [(0, 0), (0, 1)]) and rec.mass.shape == (8, 2)
    assert scope["model"].config.nfm.enabled and scope["model"].config.nfm.passes == 2


def test_readme_nfm_lm_example_runs_as_written():
    scope: dict = {}
    exec(compile(_section_code("Transformer language model with NFM (NFM §4.6, Table 8)", "python"),
                 "README.md#nfm-lm", "exec"), scope)
    assert tuple(scope["logits"].shape) == (2, 16, 50)
    c = scope["lm"].config
    assert len(scope["reads"]) == c.num_layers * c.nfm.passes and scope["reads"][0].null.shape == (2,)


def test_readme_speed_claims_agree_with_the_benchmarks_readme():
    """No "~8x faster" for dropping 87.5% of the modules: benchmarks/README.md measures 6.85×."""
    bench = (ROOT / "benchmarks" / "README.md").read_text()
    assert "6.85×" in bench and "6.85×" in README
    assert not re.search(r"~\s*8\s*[x×] faster", README)
