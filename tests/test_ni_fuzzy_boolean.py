"""modwire.experiments.ni_fuzzy_boolean (NI Table 1 at CPU scale): its table from run files, and a
smoke run through ``modwire train`` and ``modwire finetune``."""
import json
from pathlib import Path

import pytest

from modwire.experiments import ni_fuzzy_boolean as fz

ROOT = Path(__file__).resolve().parents[1]


def _write_setting(out: Path, setting: str, values: list[tuple[float, float]]) -> None:
    d = out / f"finetune-{setting.replace(',', '+')}"
    runs = {}
    for seed, (r2, std) in enumerate(values):
        run = d / f"seed-{seed}"
        run.mkdir(parents=True)
        (run / "result.json").write_text(json.dumps({"seed": seed, "val": {"r2": r2, "r2_std": std}}))
        runs[str(seed)] = str(run)
    (d / "summary.json").write_text(json.dumps({"seed_runs": runs}))


def test_table_reports_means_over_seeds_std_over_functions_and_the_ordering(tmp_path):
    (tmp_path / "pretrain").mkdir()
    (tmp_path / "pretrain" / "result.json").write_text(json.dumps({"val": {"r2": 0.995, "r2_std": 0.002}}))
    _write_setting(tmp_path, "cls", [(0.90, 0.02), (0.92, 0.04)])
    _write_setting(tmp_path, "cls,type_inference", [(0.97, 0.01), (0.97, 0.03)])
    _write_setting(tmp_path, "all", [(0.99, 0.005)])
    table = fz.rows(tmp_path)
    assert [key for key, *_ in table] == ["pretrain", "cls", "cls,type_inference", "all"]
    ours = {key: o for key, _, o, _ in table}
    assert ours["cls"][0] == pytest.approx(0.91) and ours["cls"][1] == pytest.approx(0.03)
    assert ours["cls"][2] == pytest.approx(0.0141421, rel=1e-4) and ours["cls"][3] == 2
    text = fz.format_table(table)
    assert "| Finetuning CLS Tokens | 0.9100 ± 0.0300; ± 0.0141 (2 seeds) | 0.9202 ± 0.0198 |" in text
    assert "ordering (CLS only < + type inference ≤ + all): holds" in text
    assert "Pre-training R² ≥ 0.99: yes (0.9950)" in text
    # a violated ordering is said so
    (tmp_path / "finetune-all" / "seed-0" / "result.json").write_text(json.dumps({"val": {"r2": 0.96, "r2_std": 0}}))
    assert "does NOT hold" in fz.format_table(fz.rows(tmp_path))


def test_missing_settings_are_reported_as_not_run(tmp_path):
    text = fz.format_table(fz.rows(tmp_path))
    assert text.count("not run") == 3 and "ordering" not in text


def test_bad_arguments_are_usage_errors():
    with pytest.raises(SystemExit) as e:
        fz.parse(["--epochs", "0"])
    assert e.value.code == 2


@pytest.mark.slow
def test_quick_run_pretrains_finetunes_every_setting_and_reports(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert fz.main(["--quick", "--out", str(tmp_path), "--workers", "1"]) == 0
    table = fz.rows(tmp_path)
    assert all(ours is not None and ours[3] == 1 for _, _, ours, _ in table)
    assert (tmp_path / "table.md").read_text().startswith("| parameter set |")
    dynamic = json.loads((tmp_path / "pretrain" / "dynamic.json").read_text())
    pre = json.loads((tmp_path / "pretrain" / "result.json").read_text())["val"]["r2"]
    assert list(dynamic["iterations"]) == ["1", "2", "3", "4"] and len(dynamic["dropped"]) == 4   # 1 … 2·n_i
    assert dynamic["residual"] == "identity" and dynamic["trained_iterations"] == 2
    assert dynamic["iterations"]["2"] == pytest.approx(pre, rel=1e-5)      # all iterations: the run's own score
    # a rerun reads the finished runs back instead of training again
    mtime = (tmp_path / "pretrain" / "result.json").stat().st_mtime
    assert fz.main(["--quick", "--out", str(tmp_path), "--workers", "1"]) == 0
    assert (tmp_path / "pretrain" / "result.json").stat().st_mtime == mtime


def test_residual_growth_of_the_eq11_readings():
    """``--residual-growth``: Eq. 11 as printed doubles the stream per function iteration and is
    refused at iterations=50 (2 scripts: 2^100); ``update`` keeps the scale and runs."""
    literal = fz.residual_growth_of("ni_fuzzy_boolean", "identity")
    assert len(literal["growth"]) == 4 and all(1.9 < g < 2.1 for g in literal["per_iteration"])
    assert literal["iterations_50"].startswith("refused:") and "2^100" in literal["iterations_50"]
    update = fz.residual_growth_of("ni_fuzzy_boolean", "update")
    assert all(0.8 < g < 1.25 for g in update["growth"]) and update["iterations_50"] == "finite"


def test_committed_residual_growth_matches_the_documented_numbers():
    """The numbers the NI docstring and docs/ni.md quote come from the committed measurement."""
    result = json.loads((ROOT / "experiments" / "results" / "ni_fuzzy_boolean" / "residual_growth.json").read_text())
    digits = result["ni_digits"]
    assert len(digits["identity"]["growth"]) == 8 and 250 < digits["identity"]["growth"][-1] < 260
    assert 1.0 < digits["update"]["growth"][-1] < 1.1 and digits["update"]["iterations_50"] == "finite"
    assert result["ni_fuzzy_boolean"]["identity"]["iterations_50"].startswith("refused:")


def test_report_reads_each_seed_next_to_its_summary_and_rebuilds_the_study_file(tmp_path):
    """A committed study's summaries name the directories the runs trained in (elsewhere): the
    seeds are read from ``seed-<s>/`` beside the summary, and --report records the files it read."""
    (tmp_path / "pretrain").mkdir()
    (tmp_path / "pretrain" / "result.json").write_text(json.dumps({"val": {"r2": 0.99, "r2_std": 0.01}}))
    (tmp_path / "pretrain" / "dynamic.json").write_text(json.dumps({
        "checkpoint": {"r2": 0.995, "r2_std": 0.002, "path": "best-00000010"}, "iterations": {"1": 0.5, "2": 0.995},
        "dropped": {"0": 0.4}}))
    _write_setting(tmp_path, "cls", [(0.90, 0.02), (0.92, 0.04)])
    summary = tmp_path / "finetune-cls" / "summary.json"
    summary.write_text(json.dumps({"seed_runs": {"0": "/elsewhere/seed-0", "1": "/elsewhere/seed-1"}}))
    assert [r["r2"] for r in fz.setting_results(tmp_path, "cls")] == [0.90, 0.92]
    assert fz.main(["--report", "--out", str(tmp_path)]) == 0
    got = json.loads((tmp_path / "study.json").read_text())
    assert got["seeds"] == [0, 1] and got["commit"] is None and got["machine"] is None
    by = {r["setting"]: r for r in got["results"]}
    assert by["pretrain"]["r2_per_seed"] == [0.995] and by["cls"]["r2_per_seed"] == [0.90, 0.92]
    assert "r2_per_seed" in by["all"] and by["all"]["r2_per_seed"] == []          # not run
    logs = {Path(p).relative_to(tmp_path).as_posix() for p in got["source"]["logs"]}
    assert logs == {"pretrain/result.json", "pretrain/dynamic.json", "finetune-cls/summary.json",
                    "finetune-cls/seed-0/result.json", "finetune-cls/seed-1/result.json"}
    assert got["source"]["command"] == f"python -m modwire.experiments.ni_fuzzy_boolean --report --out {tmp_path}"


def test_residual_option_sets_the_pretrained_models_eq11_reading_and_names_the_study(tmp_path, monkeypatch):
    """``--residual R``: the pre-training's model override ``interpreter_residual: R`` (no override
    without it: the model's default), and the study record's name ``ni_fuzzy_boolean_residual_R``."""
    import modwire.training

    seen = []

    def fake_train(cfg, resume=False):
        seen.append(cfg.model.overrides)
        return {"status": "finished", "val": {"r2": 0.5, "r2_std": 0.1}, "step": 1}

    monkeypatch.setattr(modwire.training, "train", fake_train)
    for residual in ("update", None):
        out = tmp_path / str(residual)
        fz.pretrain(fz.parse(["--quick", "--out", str(out)] + (["--residual", residual] if residual else [])))
    assert seen[0]["interpreter_residual"] == "update" and "interpreter_residual" not in seen[1]
    with pytest.raises(SystemExit):
        fz.parse(["--residual", "double"])
    _write_setting(tmp_path / "report", "cls", [(0.9, 0.1)])
    assert fz.main(["--report", "--residual", "update", "--out", str(tmp_path / "report")]) == 0
    assert json.loads((tmp_path / "report" / "study.json").read_text())["study"] == "ni_fuzzy_boolean_residual_update"
