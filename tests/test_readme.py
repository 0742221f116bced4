"""README.md and docs/ stay true to the code: the preset tables list every preset with its parameter
count, the examples run as written and give the values their comments state, and every speed ratio
docs/speed.md states comes from a committed benchmark result (benchmarks/results/)."""
import json
import re
from pathlib import Path

import pytest
import torch
from test_doc_commands import blocks, doc_files, rel

import modwire

ROOT = Path(__file__).resolve().parents[1]
SPEED = ROOT / "docs" / "speed.md"
PRESET_TABLE = re.compile(r"^\| preset \| reproduces \| params \|\n\| --- \| --- \| --- \|\n((?:\|.*\|\n)+)", re.M)


def _preset_rows():
    """(page, preset names, parameter counts) of every row of every preset table in README.md and docs/."""
    for path in doc_files():
        for table in PRESET_TABLE.finditer(path.read_text()):
            for row in table.group(1).splitlines():
                cells = re.fullmatch(r"\| (`[^|]+`) \| ([^|]+) \| ([^|]+) \|", row)
                assert cells, f"{rel(path)}: a preset row that is not `| names | reproduces | params |`: {row}"
                names, _, params = cells.groups()
                counts = [float(v) * (1e6 if u == "M" else 1e3) for v, u in re.findall(r"([\d.]+) ([Mk])", params)]
                yield rel(path), re.findall(r"`([^`]+)`", names), counts


@pytest.mark.slow
def test_preset_tables_match_registry_and_parameter_counts():
    seen: dict[str, str] = {}
    for page, names, counts in _preset_rows():
        assert len(names) == len(counts), (page, names)
        for name, count in zip(names, counts):
            assert name not in seen, f"{name} is listed in {seen[name]} and {page}"
            n = modwire.create_model(name).num_parameters()
            assert abs(n - count) / n < 0.01, (page, name, n, count)
            seen[name] = page
    assert set(seen) == set(modwire.list_models()), "every preset appears in one preset table of docs/"


def _run_block(file: str, heading: str) -> dict:
    """Executes the one python block under ``heading`` in ``file``; its namespace."""
    found = [b for b in blocks(ROOT / file) if b.lang == "python" and b.heading == heading]
    assert len(found) == 1, f"{file}: expected one python block under {heading!r}, found {len(found)}"
    scope: dict = {"__name__": "__doc_block__"}
    torch.manual_seed(0)
    exec(compile(found[0].text, f"{file}:{found[0].line}", "exec"), scope)
    return scope


def test_readme_nac_example_runs_as_written():
    s = _run_block("README.md", "Neural Attentive Circuits and Perceiver IO")
    assert tuple(s["logits"].shape) == (2, 200) and tuple(s["P"].shape) == (320, 320)
    P = s["P"]
    assert 0 < P.min() and P.max() <= 1 and torch.allclose(P.diagonal(), torch.ones(320))   # exp(-d/ε), d_ii = 0
    kept = s["small"].config.num_processor_modules
    assert kept == 40 and s["nac"].config.num_processor_modules == 320


@pytest.mark.slow
def test_nac_quickstart_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # it saves to runs/nac
    s = _run_block("docs/nac.md", "Quick start")
    assert tuple(s["logits"].shape) == (8, 10) and tuple(s["out"].shape) == (2, 4, 10, 16)
    assert tuple(s["inter"].link_probs.shape) == (320, 320)
    assert s["small"].config.num_processor_modules == 40
    assert (tmp_path / "runs" / "nac" / "model.safetensors").is_file()
    assert (s["w"] > 0).sum(-1).max() <= 5                    # top-5: at most 5 keys (of 50 and the null slot)


def test_readme_ni_example_runs_as_written():
    s = _run_block("README.md", "Neural Interpreters and the ViT")
    assert tuple(s["logits"].shape) == (8, 10) and tuple(s["fast"].shape) == (8, 10)
    assert tuple(s["compat"].shape) == (8, 5, 67) and tuple(s["types"].shape) == (8, 67, 24)
    torch.testing.assert_close(s["compat"].sum(1), torch.ones(8, 67), atol=1e-4, rtol=0)   # Σ_u C_ui ≈ 1
    assert s["ni"].config.num_functions == 6 and s["ni"].config.num_added_functions == 0   # 5 + 3 - 2


def test_readme_ait_example_runs_as_written():
    s = _run_block("README.md", "The Associative Transformer (AiT)")
    assert tuple(s["logits"].shape) == (16, 10) and s["balance"].item() > 0
    rec = s["rec"]
    assert tuple(rec.weights.shape) == (1, 8, 32, 1024) and ((rec.weights > 0).sum(-1) == 512).all()
    assert tuple(rec.memory.shape) == (1, 32, 32) and tuple(rec.energy_before.shape) == (16, 64)
    assert s["ait"].config.eval_memory_forward is False and s["ablation"].config.bottleneck_size == 0


def test_readme_nfm_example_runs_as_written():
    s = _run_block("README.md", "Neural Function Modules (NFM)")
    assert tuple(s["y"].shape) == (8, 32, 8, 8)
    rec = s["net"].records[2]
    assert (rec.pass_index, rec.layer_index, rec.sources) == (1, 0, [(0, 0), (0, 1)]) and rec.mass.shape == (8, 2)
    assert s["model"].config.nfm.enabled and s["model"].config.nfm.passes == 2


def test_nfm_lm_example_runs_as_written():
    s = _run_block("docs/nfm.md", "Transformer language model with NFM (NFM §4.6, Table 8)")
    assert tuple(s["logits"].shape) == (2, 16, 50)
    c = s["lm"].config
    assert len(s["reads"]) == c.num_layers * c.nfm.passes and s["reads"][0].null.shape == (2,)


def _train_records(cfg, out: Path) -> list[dict]:
    """The per-step records of ``modwire train`` with ``cfg``, logged at every step, run in ``out``."""
    from dataclasses import replace

    from modwire.training import train

    train(replace(cfg, out_dir=str(out), log_every=1, progress=False))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r and "lr" in r]


def _assert_same_losses(history: list[dict], records: list[dict]) -> None:
    """Each step's ``loss.logged()`` of a doc example equals that step's record of ``modwire train``,
    as the float32 values ``metrics.jsonl`` holds (same weights, batches, objective, updates)."""
    assert len(history) == len(records) == 4 and "aux/balance" in records[0]     # 2 epochs of 2 steps, AiT
    for step, (mine, logged) in enumerate(zip(history, records), 1):
        assert logged["step"] == step and set(mine) == {"loss", "aux/balance"}
        assert {k: v.item() for k, v in mine.items()} == {k: logged[k] for k in mine}, step


def test_tools_plain_loop_gives_the_losses_of_modwire_train(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = _run_block("docs/tools.md", "A plain PyTorch loop")
    _assert_same_losses(s["history"], _train_records(s["cfg"], tmp_path / "run"))
    first = s["history"][0]       # total = task + σ · balance, σ = 1e-2 (AiT Eq. 6, ait_micro's default)
    assert s["objective"].weights(s["model"]) == {"balance": 1e-2} and first["aux/balance"] > 0


def test_tools_lightning_module_gives_the_losses_of_modwire_train(tmp_path, monkeypatch):
    pytest.importorskip("lightning", reason="the LightningModule example needs modwire[lightning]")
    monkeypatch.chdir(tmp_path)
    s = _run_block("docs/tools.md", "A LightningModule")
    _assert_same_losses(s["module"].history, _train_records(s["cfg"], tmp_path / "run"))


@pytest.mark.slow
def test_speed_flop_ratio_of_dropping_is_as_stated(capsys):
    """docs/speed.md's FLOP bound on dropping 87.5 % of the modules is what its code prints."""
    s = _run_block("docs/speed.md", "What dropping modules can save")
    code = next(b.text for b in blocks(SPEED) if b.heading == "What dropping modules can save")
    stated = re.search(r"# (\d+\.\d+) \(tests/test_readme\.py", code).group(1)
    assert f"{s['ratio']:.2f}" == stated and f"{s['ratio']:.2f}" in capsys.readouterr().out
    assert s["ratio"] < 8       # the page's claim: dropping 87.5 % cannot make the NAC 8× faster


# ----------------------------------------------------------------------------- speed numbers

def _result_numbers() -> set[str]:
    """Every number in benchmarks/results/: the Markdown files' as written, the JSON files' rounded to 1-2 digits."""
    out: set[str] = set()

    def walk(v):
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.update({f"{v:.2f}", f"{v:.1f}"})
    for path in (ROOT / "benchmarks" / "results").iterdir():
        if path.suffix == ".json":
            walk(json.loads(path.read_text()))
        elif path.suffix == ".md":
            out.update(re.findall(r"\d+\.\d+", path.read_text()))
    return out


def _prose(path: Path) -> str:
    """The page without its fenced blocks and tables."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return "\n".join(line for line in text.splitlines() if not line.startswith("|"))


def _bench_compile():
    """benchmarks/bench_compile.py as a module (its ``markdown`` prints docs/speed.md's table)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_compile", ROOT / "benchmarks" / "bench_compile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_speed_tables_equal_the_committed_benchmark_results():
    page = SPEED.read_text()
    compiled = json.loads((ROOT / "benchmarks" / "results" / "compile_cpu.json").read_text())
    table = page.split("<!-- compile_cpu:begin -->\n")[1].split("<!-- compile_cpu:end -->")[0]
    assert table.strip() == _bench_compile().markdown(compiled)     # generated: bench_compile.py --markdown
    attention = json.loads((ROOT / "benchmarks" / "results" / "attention_cpu.json").read_text())
    for r in attention["rows"]:
        row = (f"| `{r['preset']}` | {r['mode']} | {r['calls']} | {r['fused']} | {1000 * r['current_s']:.2f} | "
               f"{r['speedup']:.2f}× |")
        assert row in page, row
    flex = json.loads((ROOT / "benchmarks" / "results" / "flex_cpu.json").read_text())
    for r in flex["rows"]:
        timed = "— | —" if r["flex_ms"] is None else f"{r['flex_ms']:.2f} | {r['sdpa_over_flex']:.2f}×"
        row = f"| `{r['preset']}` | {r['mode']} | {r['flex_calls']} of {r['calls']} | {r['sdpa_ms']:.2f} | {timed} |"
        assert row in page, row
    for r in flex["attention_alone"]:
        row = (f"| `{r['preset']}` | {r['calls']} | {r['flex_ms']:.2f} | {r['math_ms']:.2f} | {r['sdpa_ms']:.2f} | "
               f"{r['math_over_flex']:.2f}× | {r['sdpa_over_flex']:.2f}× |")
        assert row in page, row


def test_speed_ratios_in_the_text_come_from_committed_results():
    """A ratio stated in docs/speed.md's text is one a benchmark wrote to benchmarks/results/."""
    known = _result_numbers()
    stated = re.findall(r"(\d+\.\d+)(?:-(\d+\.\d+))?×", _prose(SPEED))
    assert len(stated) > 5
    missing = sorted({v for pair in stated for v in pair if v and v not in known})
    assert not missing, f"docs/speed.md states ratios no file in benchmarks/results/ holds: {missing}"


def test_no_speedup_claim_without_a_measurement():
    """No "~8x faster" for dropping 87.5 % of the modules anywhere: the FLOPs allow less (docs/speed.md)."""
    for path in doc_files():
        assert not re.search(r"~\s*\d+\s*[x×] faster", path.read_text()), rel(path)


def test_the_guarantee_table_names_existing_tests_and_counts_their_cases():
    """docs/training.md, "How it is tested": every named test exists and each row's case count is what
    pytest collects for its names (issue 26's "with the counts")."""
    import subprocess
    import sys

    text = (ROOT / "docs" / "training.md").read_text()
    table = text.split("<!-- guarantees:begin -->")[1].split("<!-- guarantees:end -->")[0]
    rows = [[c.strip() for c in r.strip("|").split("|")] for r in table.strip().splitlines()[2:] if r.startswith("|")]
    assert len(rows) == 10
    named = {row[0]: re.findall(r"`(tests/[^`]+::[^`]+)`", row[1]) for row in rows}
    every = sorted({i for ids in named.values() for i in ids})
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *every],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    collected = [line.split("[")[0] for line in out.stdout.splitlines() if "::" in line]
    assert set(collected) == set(every)                       # every named test exists
    for row in rows:
        cases = sum(collected.count(i) for i in set(named[row[0]]))
        assert cases == int(row[2]), f"{row[0]}: the table says {row[2]} cases, pytest collects {cases}"


def test_speed_gpu_vit_table_is_the_committed_h200_output():
    """docs/speed.md's GPU table: each cell is the ratio bench_vit.py printed on the H200
    (benchmarks/results/gpu/vit_timm_h200_{fp32,bf16}.txt)."""
    text = (ROOT / "docs" / "speed.md").read_text()
    printed = {}
    for precision in ("fp32", "bf16"):
        out = (ROOT / "benchmarks" / "results" / "gpu" / f"vit_timm_h200_{precision}.txt").read_text()
        for name, mode, ratio in re.findall(r"^  (.+?), (inference|train): ([\d.]+)x", out, re.M):
            printed[(name, precision, mode)] = ratio
    for name in ("NI Table 5 ViT", "AiT ViT-Small"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {name} ("))
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert cells == [printed[(name, p, m)] for p in ("fp32", "bf16") for m in ("inference", "train")]
