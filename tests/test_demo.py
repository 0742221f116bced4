"""``make demo`` (``modwire.demo``): the dropping table, its data choice, the race and forward modes."""
import contextlib
import csv
import io
import json
import re
from pathlib import Path

import pytest
import yaml
from task_fixtures import write_mnist

import modwire
from modwire import demo
from modwire.analysis.study import KEYS

ROOT = Path(__file__).resolve().parents[1]


CELL = r"\s*(\d+)\s+([\d.]+)\s+([-\d.]+) ±\s*([\d.]+)\s+([-\d.]+)\s*"


def _table(out: str) -> dict[float, list[list[str]]]:
    """The printed drop table: per level, per model (NAC, PIO), [kept, GFLOP, mean, std, own order]."""
    rows = re.findall(rf"^\s*([\d.]+)% \|{CELL}\|{CELL}$", out, re.M)
    return {float(r[0]) / 100: [list(r[1:6]), list(r[6:11])] for r in rows}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One tiny demo (digits, 2 steps, 24 test images, the default 5 draws): its stdout and directory."""
    out_dir = tmp_path_factory.mktemp("demo")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        demo.main(["--dataset", "digits", "--steps", "2", "--drop", "0,0.5,0.875,0.9375", "--max-samples", "24",
                   "--no-plots", "--no-progress", "--out-dir", str(out_dir), "--set", "data.batch_size=16"])
    return stdout.getvalue(), out_dir


def _study(out_dir):
    return json.loads((out_dir / "study.json").read_text())


def test_demo_prints_mean_and_std_over_draws_equal_to_the_files(demo_run):
    out, out_dir = demo_run
    assert "dataset digits: scikit-learn's 8x8 digits, as asked" in out
    table = _table(out)
    assert sorted(table) == [0.0, 0.5, 0.875, 0.9375]
    for m in (0, 1):   # NAC processor modules, Perceiver IO latents kept
        assert [table[f][m][0] for f in sorted(table)] == ["64", "32", "8", "4"]
    # the printed numbers are analyze()'s, from the CSV files it wrote, and the study.json's
    with open(out_dir / "analysis" / "modules_dropped_stats.csv") as f:
        stats = list(csv.DictReader(f))
    with open(out_dir / "analysis" / "modules_dropped.csv") as f:
        own = [r for r in csv.DictReader(f) if r["order"] != "random"]
    assert len(stats) == 2 * 4 and {int(s["draws"]) for s in stats} == {5}
    for s in stats:
        cell = table[float(s["fraction_dropped"])][0 if s["model"] == "nac_small" else 1]
        assert cell[2:4] == [f"{100 * float(s['top1_mean']):.1f}", f"{100 * float(s['top1_std']):.1f}"]
    for r in own:
        cell = table[float(r["fraction_dropped"])][0 if r["model"] == "nac_small" else 1]
        assert cell[4] == f"{100 * float(r['top1']):.1f}" and r["order"] == ("importance" if r["model"] ==
                                                                                "nac_small" else "last")
    levels = [r for r in _study(out_dir)["results"] if r["record"] == "drop_level"]
    for r in levels:
        cell = table[r["fraction_dropped"]][0 if r["model"] == "nac_small" else 1]
        assert cell[2:5] == [f"{100 * r[k]:.1f}" for k in ("mean", "std", "own")] and r["draws"] == 5
    assert table[0.0][0][3] == table[0.0][1][3] == "0.0"    # nothing dropped: every draw is the full model
    assert "2 / 2 training steps" in out and "plot: none (--no-plots)" in out
    assert (out_dir / "nac_small" / "checkpoints" / "last" / "model.safetensors").is_file()


def test_demo_uses_the_same_random_subsets_for_both_models(demo_run):
    _, out_dir = demo_run
    copies = [r for r in _study(out_dir)["results"] if r["record"] == "dropped_copy" and r["order"] == "random"]
    by = {(r["model"], r["fraction_dropped"], r["draw"]): r["dropped"] for r in copies}
    assert len(copies) == 2 * 4 * 5
    for f in (0.5, 0.875, 0.9375):
        subsets = [by[("nac_small", f, d)] for d in range(5)]
        assert subsets == [by[("perceiver_io_small", f, d)] for d in range(5)]
        assert len(set(subsets)) == 5 and all(len(s.split()) == round(f * 64) for s in subsets)


def _headline(out: str) -> re.Match | None:
    """The printed headline: NAC lost ± std (full → mean), PIO likewise, then gap and spread."""
    num = r"(-?\d+\.\d)"
    return re.search(rf"with 87\.50% dropped \(5 random subsets, the same for both models\), the NAC loses "
                     rf"{num} ± {num} points \({num}% → {num}%\),\nthe Perceiver IO {num} ± {num} "
                     rf"points \({num}% → {num}%\); the gap is {num} points against a spread of {num}\.", out)


def test_demo_headline_is_computed_from_the_table(demo_run):
    out, out_dir = demo_run
    table = _table(out)
    m = _headline(out)
    assert m, out
    h = next(r for r in _study(out_dir)["results"] if r["record"] == "headline")
    for i, name in ((0, "nac_small"), (1, "perceiver_io_small")):
        lost, std, full, mean = (float(x) for x in m.groups()[4 * i: 4 * i + 4])
        assert (full, mean, std) == (float(table[0.0][i][2]), float(table[0.875][i][2]), float(table[0.875][i][3]))
        assert f"{100 * h['models'][name]['lost']:.1f}" == m.group(4 * i + 1)
        assert lost == pytest.approx(full - mean, abs=0.11)          # rounding of the printed percentages
    assert float(m.group(9)) == pytest.approx(100 * h["gap"], abs=0.051)
    assert float(m.group(10)) == pytest.approx(100 * h["spread"], abs=0.051)
    assert "NAC paper (§3, Fig. 5a / 15" in out and "less than 3%" in out
    assert f"→ the pattern {h['verdict']}." in out and "criterion: NAC loses < 3 points" in out


def test_demo_writes_its_study_json(demo_run):
    _, out_dir = demo_run
    study = _study(out_dir)
    assert list(study) == list(KEYS) and study["study"] == "demo" and study["seeds"] == [0]
    assert study["config"]["draws"] == 5 and study["config"]["dataset"] == "digits"
    assert study["wall_time_s"] > 0 and study["machine"]["cpu_count"] >= 1
    records = {r["record"] for r in study["results"]}
    assert records == {"setup", "training", "dropped_copy", "drop_level", "headline"}
    setup = study["results"][0]
    assert setup["task"] == "digits" and setup["test_images"] == 24 and len(setup["load_average_start"]) == 3
    training = [r for r in study["results"] if r["record"] == "training"]
    assert [(r["model"], r["steps"]) for r in training] == [("nac_small", 2), ("perceiver_io_small", 2)]


@pytest.mark.parametrize("headline_args, verdict", [
    ((0.01, 0.005, 0.10, 0.02), "holds in this run"),                     # NAC < 3 points, gap 9 > spread 2.5
    ((0.05, 0.005, 0.10, 0.02), "holds only in part"),                    # gap 5 > 2.5, but NAC loses 5 points
    ((0.01, 0.02, 0.03, 0.02), "differ by less than their spread"),       # gap 2 <= spread 4
    ((0.08, 0.01, 0.01, 0.01), "the Perceiver IO loses less"),            # gap -7 < -2
])
def test_headline_verdict_follows_its_criterion(headline_args, verdict):
    nac_lost, nac_std, pio_lost, pio_std = headline_args
    cell = lambda mean, std: {"mean": mean, "std": std, "own": mean, "order": "x", "draws": 5}   # noqa: E731
    table = {0.0: {"nac_small": cell(0.8, 0.0), "perceiver_io_small": cell(0.7, 0.0)},
             0.875: {"nac_small": cell(0.8 - nac_lost, nac_std), "perceiver_io_small": cell(0.7 - pio_lost, pio_std)}}
    h = demo.headline(table)
    assert verdict in h["verdict"] and h["fraction_dropped"] == 0.875
    assert h["gap"] == pytest.approx(pio_lost - nac_lost) and h["spread"] == pytest.approx(nac_std + pio_std)


def test_demo_defaults_and_bad_draws(tmp_path, capsys):
    args = demo.parser().parse_args([])
    assert args.draws >= 5 and 0.0 in args.drop and 0.875 in args.drop
    for bad in (["--draws", "1"], ["--drop", "0.5,0.875"]):
        with pytest.raises(SystemExit):
            demo.main([*bad, "--out-dir", str(tmp_path / "d")])
        assert "--draws must be >= 2 and --drop must include 0" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


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
    demo.fresh_out_dir(str(out), ("nac_small", "analysis", "study.json"))
    (out / "nac_small" / "checkpoints").mkdir(parents=True)
    (out / "study.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    demo.fresh_out_dir(str(out), ("nac_small", "analysis", "study.json"))     # a second demo starts fresh
    assert not (out / "nac_small").exists() and not (out / "study.json").exists()
    assert (out / "notes.txt").read_text() == "mine"


def _floats(obj):
    """Every float in a JSON value (recursively)."""
    if isinstance(obj, float):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _floats(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _floats(v)


def test_docs_demo_page_states_only_numbers_of_the_committed_result():
    """docs/demo.md: its pasted table is the committed study.json's, and every decimal number on the
    page is one of that file's values (as a percentage, a fraction, or seconds)."""
    study = json.loads((ROOT / "experiments" / "results" / "demo" / "study.json").read_text())
    page = (ROOT / "docs" / "demo.md").read_text()
    table = _table(page)
    levels = [r for r in study["results"] if r["record"] == "drop_level"]
    assert sorted(table) == sorted({r["fraction_dropped"] for r in levels}) == study["config"]["drop"]
    for r in levels:
        cell = table[r["fraction_dropped"]][0 if r["model"] == "nac_small" else 1]
        assert cell == [str(r["kept"]), f"{r['gflops']:.4f}", *(f"{100 * r[k]:.1f}" for k in ("mean", "std", "own"))]
    known = {f.format(scale * v) for v in _floats(study) for scale in (1, 100) for f in ("{:.1f}", "{:.2f}", "{:.4f}",
                                                                                       "{:g}")}
    h = next(r for r in study["results"] if r["record"] == "headline")
    m = _headline(page)
    assert m and f"→ the pattern {h['verdict']}." in page
    nac, pio = h["models"]["nac_small"], h["models"]["perceiver_io_small"]
    assert list(m.groups()) == [f"{100 * v:.1f}" for v in (nac["lost"], nac["lost_std"], nac["full"], nac["mean"],
                                                           pio["lost"], pio["lost_std"], pio["full"], pio["mean"],
                                                           h["gap"], h["spread"])]
    stated = set(re.findall(r"(?<![\w.])(\d+\.\d+)", page))
    assert stated and not stated - known, f"docs/demo.md states numbers study.json does not hold: {stated - known}"
    assert f"total {study['wall_time_s']:.0f} s" in page
    readme = (ROOT / "README.md").read_text()                 # the README's demo time is the same run's
    assert f"One run took {study['wall_time_s']:.0f} s on 2 quiet CPU cores" in readme
