"""``modwire reproduce``: the registry covers the papers' claims, ``--list`` shows them, an unknown
or script-less study is a clear error, a study runs end to end with ``--quick`` into ``--out`` and
writes a study.json the report reads, and outside a clone the command says a clone is needed."""
import importlib.util
import json
from pathlib import Path

import pytest

from modwire import cli
from modwire.experiments import nfm_lm_synthetic, paths, report

ROOT = Path(__file__).resolve().parents[1]
registry = report.registry

# issue 27: at least these
REQUIRED = {"table1_ladder", "demo", "nac_fewshot", "conditional_nac", "ni_fuzzy_boolean", "ni_fewshot",
            "ait_triangle", "ait_memory_collapse_digits", "ait_analysis", "nfm_sort_of_clevr", "nfm_multi_digit",
            "nfm_lm_synthetic", "gan_fashion_mnist", "nfm_preact_resnet"}


def test_registry_covers_the_issues_studies_with_runnable_scripts():
    assert REQUIRED <= set(registry.STUDY)
    for s in registry.STUDIES:
        assert s.steps, s.name
        for step in (*s.steps, *s.quick, *((s.rebuild,) if s.rebuild else ())):
            assert step[0] == "-m" and importlib.util.find_spec(step[1]) is not None, f"{s.name}: {step[:2]}"
        if s.steps:
            assert s.time and s.quick_time and len(s.quick) == len(s.steps), s.name
            assert any(registry.OUT in a for step in s.steps for a in step), f"{s.name}: writes outside OUT"


def test_list_names_every_study_its_claim_and_times(capsys):
    assert cli.main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for s in registry.STUDIES:
        line = next(li for li in out.splitlines() if li.startswith(s.name + " "))
        assert s.claim in line, s.name
    assert "no study script" not in out
    assert "full: ~40 min (24 runs" in out and "quick:" in out


def test_unknown_study_is_an_error_listing_the_known_ones(capsys):
    assert cli.main(["reproduce", "table_1"]) == 2
    err = capsys.readouterr().err
    assert "unknown study 'table_1'; the studies are: table1_ladder, demo," in err and "--list" in err
    assert cli.main(["reproduce"]) == 2 and "give the NAME of a study" in capsys.readouterr().err


def test_dry_run_prints_the_steps_with_the_output_folder(tmp_path, capsys):
    assert cli.main(["reproduce", "ait_analysis", "--quick", "--dry-run", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(registry.STUDY["ait_analysis"].quick) == 5
    assert err[0].startswith(f"modwire reproduce ait_analysis: python -m modwire train {registry.AIT_FASHION}")
    assert f"out_dir={tmp_path / 'a'}/paper/run" in err[0] and "max_steps=6" in err[0]
    assert err[-1].endswith(f"python -m modwire.experiments.ait_analysis --report --out {tmp_path / 'a'}")
    assert not (tmp_path / "a").exists()


def test_the_clone_is_this_packages_repository_else_the_current_directory(tmp_path):
    assert paths.find_checkout() == paths.ROOT == ROOT
    site = tmp_path / "site-packages"                         # an installed package: no clone above it
    assert paths.find_checkout(site, cwd=tmp_path) is None
    (tmp_path / "configs").mkdir()
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    assert paths.find_checkout(site, cwd=tmp_path) == tmp_path.resolve()


def test_outside_a_clone_it_says_a_clone_is_needed(tmp_path, monkeypatch, capsys):
    """No clone: --list still works; reproduce, results and a study's default --out say what is
    missing (a study never writes into the installed package)."""
    monkeypatch.setattr(paths, "ROOT", None)
    monkeypatch.setattr(report, "RESULTS", None)
    assert cli.main(["reproduce", "--list"]) == 0 and "graph_align" in capsys.readouterr().out
    assert cli.main(["reproduce", "graph_align", "--quick"]) == 2
    assert "clone of the modwire repository" in capsys.readouterr().err
    assert cli.main(["results"]) == 2 and "give --results DIR" in capsys.readouterr().err
    assert cli.main(["results", "--rebuild", "table1_ladder"]) == 2 and "clone" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        nfm_lm_synthetic.main(["--report"])
    assert e.value.code == 2 and "nfm_lm_synthetic: give --out DIR" in capsys.readouterr().err


def test_quick_study_runs_end_to_end_and_the_report_reads_its_file(tmp_path, capsys):
    out = tmp_path / "graph_align"
    assert cli.main(["reproduce", "graph_align", "--quick", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"result: {out / 'study.json'}")
    studies = report.load_studies(tmp_path)                   # tmp_path/<name>/study.json, as experiments/results
    got = studies["graph_align"]
    assert got["study"] == "graph_align" and got["source"] is None and got["config"]["quick"] is True
    assert got["results"] and all(r["U"] == 16 for r in got["results"])            # --quick: U = 16
    assert all(v is None for k, v in studies.items() if k != "graph_align")


def test_a_failing_step_stops_with_its_exit_code(tmp_path, capsys):
    bad = tmp_path / "file"
    bad.write_text("not a folder")
    assert cli.main(["reproduce", "nfm_lm_synthetic", "--quick", "--out", str(bad / "sub")]) == 1   # no folder
    assert "the step above exited 1" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_lm_study_gives_the_reports_perplexity_row(tmp_path):
    """A study with a claim: its quick study.json fills the report's NFM Table 8 row."""
    assert cli.main(["reproduce", "nfm_lm_synthetic", "--quick", "--out", str(tmp_path / "nfm_lm_synthetic")]) == 0
    record = json.loads((tmp_path / "nfm_lm_synthetic" / "study.json").read_text())
    base = next(r for r in record["results"] if r["variant"] == "base")["val"]["perplexity"]
    row = next(li for li in report.section(tmp_path).splitlines() if li.startswith("| NFM Table 8"))
    assert f"base {base:.3f} vs NFM" in row and "(n = 1) ⚠ fewer than 3 seeds" in row


def test_the_docs_page_lists_every_study():
    page = (ROOT / "docs" / "reproduce.md").read_text()
    assert all(f"`{s.name}`" in page for s in registry.STUDIES)
