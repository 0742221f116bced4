"""What every study of :mod:`modwire.experiments` does, once: its command line, the grid of training runs
(each run trained or resumed, finished ones skipped), the study's one results file, mean ± std over
seeds, Markdown tables and figures. A study script keeps what is its own: the paper's figure or
table it reproduces, its grid, its metric and its figure's specifics.

Every study run writes ``OUT/study.json`` (:func:`write_study`): ``{"study", "config", "seeds",
"commit", "wall_time_s", "machine", "source", "results"}``, written atomically (a temporary file, then
:func:`os.replace`), so a study killed while writing leaves the previous file whole. A study's
per-run log (``OUT/results.jsonl``, :mod:`modwire.analysis.results_log`) is what lets a rerun skip
finished runs; ``study.json`` is the run's record of what it found. A study's ``--report`` rebuilds
``study.json`` from the logs alone (:func:`finish_study`; no training), so every committed number
stays traceable to the runs that produced it.

Each study is a module of this package, run as ``python -m modwire.experiments.NAME``; it reads its
configs from and writes its results into a clone of the repository (:mod:`modwire.experiments.paths`).
"""
from __future__ import annotations

import argparse
import functools
import json
import shlex
import subprocess
import sys
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from modwire.analysis.study import (RESULTS_FILE, git_commit, machine, write_json_atomic,  # noqa: F401
                                    write_study, write_study_from_logs)
from modwire.errors import UserError

from .paths import CONFIGS, ROOT, results_dir  # noqa: F401

# ----------------------------------------------------------------------------- the command


class StudyParser(argparse.ArgumentParser):
    """An argument parser whose ``--out`` defaults to the study's folder of the clone's results
    (:func:`~modwire.experiments.paths.results_dir`), resolved when parsing: without a clone, a
    usage error asking for ``--out`` (never a folder inside the installed package)."""

    results: str | None = None

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        if self.results is not None and getattr(parsed, "out", None) is None:
            try:
                parsed.out = results_dir(self.results)
            except UserError as e:
                self.error(str(e))
        return parsed


def prog() -> str | None:
    """``python -m modwire.experiments.NAME`` when a study runs as ``python -m`` (usage lines name the
    command, not the module's file); else argparse's default."""
    main = Path(sys.argv[0])
    return f"python -m modwire.experiments.{main.stem}" if main.parent == Path(__file__).parent else None


def parser(doc: str, out: Path | str | None, quick: str, *, workers: int | None = None,
           report: str | None = None, results: str | None = None) -> StudyParser:
    """A study's parser: its docstring's first paragraph as description, ``--out`` (default ``out``;
    with ``results``, the clone's ``experiments/results/RESULTS``), ``--quick`` (a smoke test:
    ``quick``), and ``--workers`` / ``--report`` where given."""
    ap = StudyParser(prog=prog(), description=doc.split("\n\n")[0])
    ap.results = results
    ap.add_argument("--out", type=Path, default=None if out is None else Path(out))
    ap.add_argument("--quick", action="store_true", help=f"smoke test: {quick}")
    if workers is not None:
        ap.add_argument("--workers", type=int, default=workers, help="worker processes (0: in this process)")
    if report is not None:
        ap.add_argument("--report", action="store_true", help=report)
    return ap


def positive(text: str) -> int:
    """argparse type: an int >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


# ----------------------------------------------------------------------------- the grid of runs


def worker(key_of: Callable[[Any], str]) -> Callable:
    """Decorator of a study's job function (run in a worker process, :func:`run_grid`): one torch
    thread (two single-threaded workers beat one two-threaded on 2 cores), the job's ``seconds``
    unless it records them, and an exception returned as ``{"key": key_of(job), "error"}`` so that
    the other jobs go on. The decorated function stays picklable by name (spawned workers)."""
    def wrap(run: Callable[[Any], dict]) -> Callable[[Any], dict]:
        @functools.wraps(run)
        def job(arg):
            start = time.perf_counter()
            try:
                import torch

                torch.set_num_threads(1)
                record = run(arg)
            except Exception as e:        # reported by the parent with the job's key
                return {"key": key_of(arg), "error": f"{type(e).__name__}: {e}"}
            return {**record, "seconds": record.get("seconds", round(time.perf_counter() - start, 1))}
        return job
    return wrap


def run_grid(run: Callable[[Any], dict], jobs: Sequence, path: Path, *, key: Callable[[Any], str], workers: int,
             describe: Callable[[dict], str], keep: Callable[[dict], bool] = lambda r: True,
             finished: Callable[[Any, dict[str, dict]], bool] | None = None, noun: str = "runs",
             verb: str = "train", log: Callable[[str], None] = print) -> list[str]:
    """Run the jobs of a study's grid that the results log ``path`` does not hold yet (its records
    that ``keep`` accepts, by key; ``finished(job, done)`` where a key is not enough), on ``workers``
    spawned processes (0: in this one), appending each record as it finishes. Returns the failures."""
    from modwire.analysis.results_log import load_results, run_jobs

    done = load_results(path, keep=keep)
    todo = [j for j in jobs if not (finished(j, done) if finished else key(j) in done)]
    where = f"on {workers} worker process(es)" if workers else "in this process"
    log(f"{len(jobs)} {noun}, {len(jobs) - len(todo)} already in {path}, {len(todo)} to {verb} {where}")
    if not todo:
        return []
    return run_jobs(run, list(todo), path, workers=workers, describe=describe, log=log)


def train_or_resume(cfg) -> dict:
    """``modwire.training.train`` of ``cfg``, resuming the interrupted run in its ``out_dir``; a run
    stopped by a signal is an error (a rerun resumes it)."""
    from modwire.training import train

    resume = (Path(cfg.out_dir) / "checkpoints" / "last").exists()
    result = train(cfg, resume=resume, overwrite=not resume)
    if result["status"] != "finished":
        raise RuntimeError(f"interrupted at step {result['step']} of {cfg.max_steps}; rerun to resume")
    return result


def modwire(*argv: str, capture: bool = False) -> subprocess.CompletedProcess:
    """``python -m modwire ARGV`` with this Python: a study runs the ``modwire`` commands (eval,
    finetune) as a user does, across the command line (the CLI sits above this package); the
    output captured as text with ``capture``."""
    return subprocess.run([sys.executable, "-m", "modwire", *argv], capture_output=capture, text=capture)


def eval_run(run_dir: Path, split: str = "test") -> dict:
    """``modwire eval RUN --split SPLIT``'s metrics of the run's best checkpoint."""
    run = modwire("eval", str(run_dir), "--split", split, capture=True)
    if run.returncode != 0:
        raise RuntimeError(f"modwire eval {run_dir} --split {split} exited {run.returncode}: "
                           f"{run.stderr.strip().splitlines()[-1:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- summaries and tables


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; 0 for one value) over seeds."""
    values = list(values)
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def format_mean_std(values: Iterable[float], digits: int = 2, *, n: bool = False, empty: str = "not run") -> str:
    """``"m ± s"`` of :func:`mean_std` (``"m"`` for one value), ``"m ± s (n = k)"`` with ``n``,
    ``empty`` for no values."""
    values = list(values)
    if not values:
        return empty
    m, s = mean_std(values)
    if n:
        return f"{m:.{digits}f} ± {s:.{digits}f} (n = {len(values)})"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if len(values) > 1 else f"{m:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A Markdown table: the header, its rule, one line per row (cells as ``str``); no final newline."""
    def line(cells: Sequence) -> str:
        return "| " + " | ".join(str(c) for c in cells) + " |"
    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


def save_figure(path: Path, draw: Callable[[Any, Any], None], *, figsize: tuple[float, float] = (6, 4),
                dpi: int = 120, **subplots) -> Path | None:
    """A study's figure: ``draw(fig, ax)`` on ``plt.subplots(figsize=..., **subplots)``, saved to
    ``path``; ``None`` without matplotlib (imported here, with the Agg backend)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=figsize, **subplots)
    try:
        draw(fig, ax)
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return Path(path)


# ----------------------------------------------------------------------------- the results file
# one format for every study and the demo: modwire.analysis.study


def finish_study(out: Path, study: str, results: list[dict], *, args: argparse.Namespace, started: float,
                 seeds: Iterable[int], logs: Iterable[Path], script: str, argv: Sequence[str] | None) -> Path:
    """The study's ``OUT/study.json``: after training, :func:`write_study` (commit, machine, wall
    time); with ``--report``, :func:`write_study_from_logs` from ``logs`` (the files the results
    were read from), recording the command that rebuilt it (``script`` run with ``argv``)."""
    if not getattr(args, "report", False):
        return write_study(out, study, results, config=args, seeds=seeds, started=started)
    argv = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python", "-m", f"modwire.experiments.{Path(script).stem}", *map(shlex.quote, argv)])
    return write_study_from_logs(out, study, results, seeds=seeds, logs=logs, command=command)


def read_log(path: Path, script: str) -> Any:
    """A study's JSON log of an earlier run (``OUT/results.json``) for its ``--report``; a clear
    error when the study has not run there."""
    if not path.is_file():
        raise SystemExit(f"{Path(script).stem} --report: {path} does not exist; run the study first (without "
                         f"--report)")
    return json.loads(path.read_text())


def seeds_of(results: Iterable[dict]) -> list[int]:
    """The seeds of a study's records (``seed``, 0 where an early record has none)."""
    return sorted({int(r.get("seed", 0)) for r in results})
