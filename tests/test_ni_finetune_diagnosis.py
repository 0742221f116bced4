"""modwire.experiments.ni_finetune_diagnosis (NI Table 1's "+ all" fine-tuning, instrumented): parameter
groups, which run folder a run is read from, and a smoke run on a --quick study."""
import json

import pytest

import modwire
from modwire.analysis.study import read_study
from modwire.experiments import ni_finetune_diagnosis as dg
from modwire.experiments import ni_fuzzy_boolean as fz


def test_every_parameter_of_the_fuzzy_boolean_model_has_one_group():
    model = modwire.create_model("ni_fuzzy_boolean")
    groups = {name: dg.group_of(name) for name, _ in model.named_parameters()}
    assert set(groups.values()) == {g for g, _ in dg.GROUPS}
    assert groups["scripts.0.log_sigma"] == groups["scripts.1.functions.signatures"] == "type_inference"
    assert groups["scripts.0.functions.codes"] == "codes" and groups["heads.weight"] == "head"
    assert groups["scripts.1.locs.0.attn.fn.q.weight"] == "locs" and groups["cls_tokens"] == "cls_tokens"
    with pytest.raises(ValueError, match="no group"):
        dg.group_of("somewhere.else")


def test_the_studys_own_run_is_read_where_it_trained_the_same_set_at_the_same_lr(tmp_path):
    own = tmp_path / "finetune-all"
    own.mkdir()
    (own / "summary.json").write_text(json.dumps({"lr": 0.05}))
    assert dg.run_dir(tmp_path, dg.Run("all", 0.05, 1)) == own / "seed-1"
    assert dg.run_dir(tmp_path, dg.Run("all", 0.05, 1, rerun=True)) == tmp_path / "diagnosis" / "all-lr0.05" / "seed-1"
    assert dg.run_dir(tmp_path, dg.Run("all", 0.05, 1, clip=1.0)) == tmp_path / "diagnosis" / "all-lr0.05-clip1" / "seed-1"
    assert dg.run_dir(tmp_path, dg.Run("all", 0.01, 2)) == tmp_path / "diagnosis" / "all-lr0.01" / "seed-2"
    assert dg.Run.of({"train": "all", "lr": 0.01, "seed": 2}) == dg.Run("all", 0.01, 2, False, 0.0)


@pytest.mark.slow
def test_quick_study_then_an_instrumented_rerun_and_a_clipped_run(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert fz.main(["--quick", "--out", str(tmp_path), "--workers", "1"]) == 0
    small = ["--study", str(tmp_path), "--seeds", "0", "--adapt-points", "256", "--val-points", "128",
             "--adapt-epochs", "1", "--every", "1"]
    assert dg.main([*small, "--lrs", "0.05"]) == 0                        # the study's own run: measured, not trained
    assert [p.name for p in (tmp_path / "diagnosis").iterdir()] == ["study.json"]     # no run trained
    assert dg.main([*small, "--lrs", "0.05", "--rerun"]) == 0
    assert dg.main([*small, "--lrs", "0.05", "--clip", "1"]) == 0
    result = read_study(tmp_path / "diagnosis" / "study.json")          # the one format, the runs added
    assert result["study"] == f"{tmp_path.name}_diagnosis" and result["seeds"] == [0]
    runs = {(r["rerun"], r["clip"]): r for r in result["results"]}
    assert set(runs) == {(False, 0.0), (True, 0.0), (False, 1.0)}
    own, rerun = runs[(False, 0.0)], runs[(True, 0.0)]
    assert own["final_r2"] == own["final"]["r2"] and own["run"].endswith("finetune-all/seed-0")
    assert rerun["final"] == own["final"]                 # the same arithmetic: snapshots change nothing
    snap = rerun["snapshots"][-1]
    assert set(snap["moved"]) == {g for g, _ in dg.GROUPS} and len(snap["r2_per_function"]) == 10
    assert len(snap["cls_reads_inputs"]) == len(snap["unread"]) == 4 and snap["grad_norm"]["locs"] > 0
    assert "grad_clip: 1.0" in (tmp_path / "diagnosis" / "all-lr0.05-clip1" / "seed-0" / "config.yaml").read_text()
    assert "grad_clip: 0.0" in (tmp_path / "diagnosis" / "all-lr0.05" / "seed-0" / "config.yaml").read_text()
