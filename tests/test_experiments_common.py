"""modwire.experiments.common: what every study does once (the grid of runs, the study's one results file,
mean ± std over seeds, Markdown tables, figures), tested with values."""
import argparse
import json
import os
import pickle
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from modwire.analysis import study  # the one results format
from modwire.experiments import common


# ----------------------------------------------------------------------------- the results file

def test_study_file_round_trips_with_the_run_and_machine(tmp_path):
    config = argparse.Namespace(out=tmp_path / "out", quick=True, rows=["ait", "vit"])
    results = [{"key": "ait-seed0", "top1": np.float32(0.5), "steps": np.int64(8), "dir": tmp_path / "ait"}]
    path = common.write_study(tmp_path / "out", "toy_study", results, config=config, seeds=range(2), started=0.0)
    assert path == tmp_path / "out" / "study.json"
    got = json.loads(path.read_text())
    assert list(got) == ["study", "config", "seeds", "commit", "wall_time_s", "machine", "source", "results"]
    assert got["source"] is None                                # a run that trained: no logs it was rebuilt from
    assert got["study"] == "toy_study" and got["seeds"] == [0, 1]
    assert got["config"] == {"out": str(tmp_path / "out"), "quick": True, "rows": ["ait", "vit"]}
    assert got["results"] == [{"key": "ait-seed0", "top1": 0.5, "steps": 8, "dir": str(tmp_path / "ait")}]
    assert got["commit"] is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", got["commit"])
    assert got["wall_time_s"] > 0                               # since perf_counter() == 0.0
    assert got["machine"]["cpu_count"] == os.cpu_count() and got["machine"]["torch"]
    assert common.write_study(tmp_path, "s", [], config={})         # not timed: wall_time_s is null
    assert json.loads((tmp_path / "study.json").read_text())["wall_time_s"] is None


def test_study_rebuilt_from_logs_names_them_and_claims_no_commit_machine_or_time(tmp_path):
    log = tmp_path / "results.jsonl"
    log.write_text('{"key": "a", "seed": 1}\n')
    args = argparse.Namespace(out=tmp_path, report=True)
    path = common.finish_study(tmp_path, "toy", [{"key": "a", "seed": 1}], args=args, started=0.0, seeds=[1, 1],
                               logs=[log], script="/somewhere/modwire/experiments/toy.py", argv=["--report", "--out", "x y"])
    got = json.loads(path.read_text())
    assert list(got) == list(study.KEYS)
    assert (got["commit"], got["machine"], got["wall_time_s"], got["seeds"]) == (None, None, None, [1])
    assert got["source"]["logs"] == [str(log.resolve())]          # outside the checkout: as given
    assert got["source"]["logs_commit"] is None                   # not in git
    assert got["source"]["command"] == "python -m modwire.experiments.toy --report --out 'x y'"
    assert got["results"] == [{"key": "a", "seed": 1}] and study.read_study(path) == got
    assert got["config"] is None                                  # no run's config.yaml: the arguments are not known
    (tmp_path / "run-a").mkdir()
    (tmp_path / "run-a" / "config.yaml").write_text("seed: 1\n")
    again = common.finish_study(tmp_path, "toy", [], args=args, started=0.0, seeds=[1], logs=[log],
                                script="toy.py", argv=["--report"])
    assert json.loads(again.read_text())["config"] == {"run_configs": [str((tmp_path / "run-a" / "config.yaml")
                                                                            .resolve())]}
    fresh = common.finish_study(tmp_path, "toy", [], args=argparse.Namespace(report=False), started=0.0, seeds=[0],
                                logs=[log], script="toy.py", argv=[])
    assert json.loads(fresh.read_text())["source"] is None and json.loads(fresh.read_text())["machine"]


def test_paths_in_the_checkout_are_recorded_relative_to_it(tmp_path):
    inside = common.ROOT / "experiments" / "results" / "x"
    path = common.write_study(tmp_path, "s", [], config={"out": inside, "other": tmp_path})
    got = json.loads(path.read_text())["config"]
    assert got == {"out": "experiments/results/x", "other": str(tmp_path.resolve())}


def test_a_file_that_is_not_a_study_is_named_with_what_was_expected(tmp_path):
    bad = tmp_path / "study.json"
    bad.write_text('{"study": "x", "results": []}')
    with pytest.raises(ValueError, match=r"study.json: expected a study.json with keys \['study', 'config'.*got "
                                         r"\['results', 'study'\]"):
        study.read_study(bad)
    bad.write_text("{oops")
    with pytest.raises(ValueError, match="study.json: not JSON"):
        study.read_study(bad)


def test_seeds_of_records_count_an_unseeded_record_as_seed_0():
    assert common.seeds_of([{"seed": 2}, {}, {"seed": 2}]) == [0, 2]


def test_commit_is_null_without_git(monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(study.subprocess, "run", no_git)
    assert common.git_commit() is None


def test_the_commit_is_marked_dirty_when_the_code_differs_from_it(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "src").mkdir()
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "experiments" / "results" / "log.json").write_text("{}")       # a result: not code
    assert study.git_commit(tmp_path) == head
    (tmp_path / "src" / "new_study.py").write_text("")                         # an uncommitted study
    assert study.git_commit(tmp_path) == f"{head}-dirty"
    (tmp_path / "src" / "new_study.py").unlink()
    (tmp_path / "src" / "a.py").write_text("x = 2\n")                          # a changed module
    assert study.git_commit(tmp_path / "src") == f"{head}-dirty"


@pytest.mark.parametrize("failure", ["fsync", "replace"])
def test_a_failed_write_leaves_the_previous_file_whole_and_no_partial_file(tmp_path, monkeypatch, failure):
    path = common.write_json_atomic(tmp_path / "study.json", {"results": [1, 2]})
    before = path.read_text()

    def boom(*args):
        raise OSError(f"simulated {failure} failure")

    monkeypatch.setattr(study.os, failure, boom)
    with pytest.raises(OSError, match="simulated"):
        common.write_json_atomic(path, {"results": [3]})
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["study.json"]


def test_an_unwritable_value_leaves_no_file(tmp_path):
    class Broken:
        def __str__(self):
            raise RuntimeError("cannot be written")

    with pytest.raises(RuntimeError):
        common.write_json_atomic(tmp_path / "study.json", {"x": Broken()})
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- summaries and tables

def test_mean_and_sample_std_over_seeds():
    m, s = common.mean_std([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and s == pytest.approx(1.2909944487)          # n - 1 in the denominator
    assert common.mean_std(iter([0.7])) == (0.7, 0.0)
    assert common.format_mean_std([50.0, 60.0]) == "55.00 ± 7.07"
    assert common.format_mean_std([50.0, 60.0], 1, n=True) == "55.0 ± 7.1 (n = 2)"
    assert common.format_mean_std([42.0]) == "42.00" and common.format_mean_std([42.0], n=True) == "42.00 ± 0.00 (n = 1)"
    assert common.format_mean_std([]) == "not run" and common.format_mean_std([], empty="-") == "-"


def test_markdown_table_text():
    assert common.markdown_table(["model", "top-1 %", "paper"], [["NAC", 61.5, ""], ["ViT", "58.2 ± 0.3", 60]]) == (
        "| model | top-1 % | paper |\n| --- | --- | --- |\n| NAC | 61.5 |  |\n| ViT | 58.2 ± 0.3 | 60 |")
    assert common.markdown_table(["a"], []) == "| a |\n| --- |"


def test_figure_is_saved_and_skipped_without_matplotlib(tmp_path, monkeypatch):
    drawn = []
    path = common.save_figure(tmp_path / "f.png", lambda fig, ax: drawn.append(ax.plot([0, 1], [1, 0])))
    assert path == tmp_path / "f.png" and path.stat().st_size > 0 and len(drawn) == 1
    monkeypatch.setitem(sys.modules, "matplotlib", None)           # import matplotlib raises ImportError
    assert common.save_figure(tmp_path / "g.png", lambda fig, ax: drawn.append(1)) is None
    assert len(drawn) == 1 and not (tmp_path / "g.png").exists()


# ----------------------------------------------------------------------------- the grid of runs

RAN: list[str] = []


@common.worker(lambda job: job)
def toy_job(job: str) -> dict:
    """A job of the toy grid: ``"bad"`` fails, the others record their key."""
    RAN.append(job)
    if job == "bad":
        raise ValueError("diverged")
    return {"key": job, "steps": 3}


def test_worker_records_seconds_returns_errors_and_stays_picklable():
    assert pickle.loads(pickle.dumps(toy_job)) is toy_job          # spawned workers find it by name
    record = toy_job("a")
    assert record["key"] == "a" and record["steps"] == 3 and record["seconds"] >= 0
    assert toy_job("bad") == {"key": "bad", "error": "ValueError: diverged"}


def test_grid_skips_finished_runs_and_retries_failed_ones(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"key": "a", "steps": 3}) + "\n" + json.dumps({"key": "b", "steps": 99}) + "\n")
    RAN.clear()
    log: list[str] = []
    run = dict(key=lambda j: j, workers=0, keep=lambda r: r["steps"] == 3, describe=lambda r: "ok", log=log.append)
    failed = common.run_grid(toy_job, ["a", "b", "c", "bad"], path, **run)
    assert RAN == ["b", "c", "bad"]                                  # "a" is done; "b" was of another budget
    assert log[0] == f"4 runs, 1 already in {path}, 3 to train in this process"
    assert failed == ["bad: ValueError: diverged"]
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["a", "b", "b", "c"]
    RAN.clear()
    assert common.run_grid(toy_job, ["a", "b", "c", "bad"], path, **run) == ["bad: ValueError: diverged"]
    assert RAN == ["bad"]                                            # only the failed run again
    RAN.clear()
    common.run_grid(toy_job, ["a", "c"], path, **run, finished=lambda j, done: j == "a", noun="jobs", verb="run")
    assert RAN == ["c"] and log[-2] == f"2 jobs, 1 already in {path}, 1 to run in this process"


# ----------------------------------------------------------------------------- the command

def test_parser_has_the_shared_flags():
    ap = common.parser("A study (Table 1).\n\nDetails.", "runs/x", "3 steps", workers=2, report="reprint")
    args = ap.parse_args([])
    assert ap.description == "A study (Table 1)."
    assert (args.out, args.quick, args.workers, args.report) == (Path("runs/x"), False, 2, False)
    assert not hasattr(common.parser("d", None, "q").parse_args([]), "workers")
    assert common.positive("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="expected a whole number >= 1"):
        common.positive("0")
