"""The one format of a result file: ``study.json``, written by every study of :mod:`modwire.experiments`
and by the demo, read by the results report (:mod:`modwire.experiments.report`, ``modwire results``).

``{"study", "config", "seeds", "commit", "wall_time_s", "machine", "source", "results"}``: the study's
name, its configuration (the command's arguments), the seeds, the git commit and the machine it ran on,
its wall time, where its numbers come from, and its ``results`` (a list of records, the study's own).

Two ways to write one:

* :func:`write_study`: a study that has just trained its runs records what it knows, the commit, the
  machine and the wall time; ``source`` is ``None``.
* :func:`write_study_from_logs`: a study's ``--report`` mode rebuilds the file from the run logs an
  earlier run left (``results.jsonl``, ``metrics.jsonl``, ...). What the logs do not record is ``None``
  (the commit and machine that ran them, the wall time, the arguments where no run's ``config.yaml``
  was kept), never a guess; ``source`` names the logs, the git commit that last changed them and the
  command that rebuilt the file.

Written atomically (a temporary file, then :func:`os.replace`), so a study killed while writing leaves
the previous file whole. :func:`read_study` reads one back and says what is wrong with a bad one.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..files import atomic_write_text

RESULTS_FILE = "study.json"
KEYS = ("study", "config", "seeds", "commit", "wall_time_s", "machine", "source", "results")
_HERE = Path(__file__).resolve().parent


def _git(args: list[str], root: Path) -> str | None:
    """``git ARGS`` run in ``root``: its stripped output, or ``None`` (no git, not a checkout, no output)."""
    try:
        run = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if run.returncode != 0:
        return None
    return run.stdout.strip() or None


CODE = ("src", "configs")     # what a study's numbers depend on (the studies are src/modwire/experiments), for -dirty


def git_commit(root: Path = _HERE) -> str | None:
    """``git rev-parse HEAD`` of the checkout, with ``-dirty`` appended when the code (:data:`CODE`,
    untracked files included) differs from that commit, so the record never names a commit that did
    not hold the code that ran; ``None``: no git, not a checkout."""
    head = _git(["rev-parse", "HEAD"], root)
    if head is None:
        return None
    top = Path(_git(["rev-parse", "--show-toplevel"], root) or root)
    changed = _git(["status", "--porcelain", "--untracked-files=all", "--", *CODE], top)
    return f"{head}-dirty" if changed else head


def last_commit_of(paths: Iterable[Path]) -> str | None:
    """The last git commit that changed any of ``paths`` (``None``: not committed, or no git)."""
    paths = [Path(p).resolve() for p in paths]
    if not paths:
        return None
    return _git(["log", "-1", "--format=%H", "--", *map(str, paths)], paths[0].parent)


def machine() -> dict:
    """What the study ran on: platform, Python, CPU count, torch version (``None`` without torch)."""
    try:
        import torch

        version = torch.__version__
    except ImportError:
        version = None
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "torch": version}


def write_json_atomic(path: Path, obj: Any) -> Path:
    """Write ``obj`` as JSON to ``path`` through a temporary file and :func:`os.replace`: a failure
    (or a kill) while writing leaves ``path`` as it was and no temporary file behind."""
    path = Path(path)
    text = json.dumps(obj, indent=1, default=_plain) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, text)


def _plain(obj: Any) -> Any:
    """JSON for what :mod:`json` cannot write: arrays and scalars of numpy and torch as numbers, the
    rest (paths) as text."""
    import numpy as np
    import torch

    return obj.tolist() if isinstance(obj, (np.ndarray, np.generic, torch.Tensor)) else str(obj)


def write_study(out: Path, study: str, results: Iterable, *, config: argparse.Namespace | dict,
                seeds: Iterable[int] = (), started: float | None = None) -> Path:
    """The study run's one results file, ``out/study.json``: the study's name, its ``config`` (the
    command's arguments), its ``seeds``, the commit and machine, the wall time since ``started``
    (a :func:`time.perf_counter` value; ``None``: not timed) and its ``results``."""
    record = {"study": study, "config": _config(config), "seeds": list(seeds), "commit": git_commit(),
              "wall_time_s": None if started is None else round(time.perf_counter() - started, 1),
              "machine": machine(), "source": None, "results": list(results)}
    return write_json_atomic(Path(out) / RESULTS_FILE, record)


def write_study_from_logs(out: Path, study: str, results: Iterable, *, seeds: Iterable[int], logs: Iterable[Path],
                          command: str) -> Path:
    """``out/study.json`` rebuilt from the logs of runs that trained earlier (a study's ``--report``):
    ``config`` lists the runs' own committed ``config.yaml`` files under ``out`` (``None`` without
    any: the study's arguments then are not known, and the ``--report`` command's are not theirs);
    ``commit``, ``machine`` and ``wall_time_s`` are ``None`` (the logs do not record them);
    ``source`` names the ``logs`` (relative to the checkout), ``logs_commit`` (the git commit that
    last changed them) and the ``command`` that rebuilt the file (rebuilding it again gives the same
    file while the logs are unchanged)."""
    logs = sorted({Path(p).resolve() for p in logs})
    configs = run_configs(Path(out).resolve())
    source = {"logs": [_relative(p) for p in logs], "logs_commit": last_commit_of(logs), "command": command}
    record = {"study": study, "config": {"run_configs": [_relative(p) for p in configs]} if configs else None,
              "seeds": sorted(set(seeds)), "commit": None, "wall_time_s": None, "machine": None, "source": source,
              "results": list(results)}
    return write_json_atomic(Path(out) / RESULTS_FILE, record)


def run_configs(out: Path) -> list[Path]:
    """The runs' ``config.yaml`` files under ``out`` that git does not ignore (a study's ``runs/``
    folders with checkpoints are not committed); every one outside a git checkout."""
    found = sorted(out.rglob("config.yaml"))
    listed = _git(["ls-files", "--cached", "--others", "--exclude-standard", "--", "."], out) if found else None
    if listed is None:
        return found
    kept = {(out / line).resolve() for line in listed.splitlines()}
    return [p for p in found if p.resolve() in kept]


def read_study(path: Path) -> dict:
    """A ``study.json`` read back; a file that is not one is a :class:`ValueError` naming the file,
    what was expected and what was found."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e}); expected a study.json with keys {list(KEYS)}") from None
    missing = [k for k in KEYS if k != "source" and k not in record] if isinstance(record, dict) else list(KEYS)
    if missing or not isinstance(record.get("results"), list):
        got = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{path}: expected a study.json with keys {list(KEYS)} and a list of results, got {got}")
    return record


def _config(config: argparse.Namespace | dict) -> dict:
    """The arguments as a dict, paths inside the checkout relative to it (a committed file names no
    machine's directories)."""
    config = vars(config) if isinstance(config, argparse.Namespace) else dict(config)
    return {k: _relative(Path(v).resolve()) if isinstance(v, Path) else v for k, v in config.items()}


def _relative(path: Path) -> str:
    """``path`` relative to the checkout above this package where it lies in it, else as given."""
    root = _HERE.parents[2]
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
