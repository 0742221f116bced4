"""The one format of a result file: ``study.json``, written by every study of ``experiments/`` and by the
demo, read by the results report (``experiments/report.py``).

``{"study", "config", "seeds", "commit", "wall_time_s", "machine", "results"}``: the study's name, its
configuration (the command's arguments), the seeds, the git commit and the machine it ran on, its wall
time and its ``results`` (a list of records, the study's own). Written atomically (a temporary file, then
:func:`os.replace`), so a study killed while writing leaves the previous file whole.
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
_HERE = Path(__file__).resolve().parent


def git_commit(root: Path = _HERE) -> str | None:
    """``git rev-parse HEAD`` of the checkout, or ``None`` (no git, not a checkout)."""
    try:
        run = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if run.returncode != 0:
        return None
    return run.stdout.strip() or None


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
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)


def write_study(out: Path, study: str, results: Iterable, *, config: argparse.Namespace | dict,
                seeds: Iterable[int] = (), started: float | None = None) -> Path:
    """The study run's one results file, ``out/study.json``: the study's name, its ``config`` (the
    command's arguments), its ``seeds``, the commit and machine, the wall time since ``started``
    (a :func:`time.perf_counter` value; ``None``: not timed) and its ``results``."""
    config = vars(config) if isinstance(config, argparse.Namespace) else dict(config)
    record = {"study": study, "config": config, "seeds": list(seeds), "commit": git_commit(),
              "wall_time_s": None if started is None else round(time.perf_counter() - started, 1),
              "machine": machine(), "results": list(results)}
    return write_json_atomic(Path(out) / RESULTS_FILE, record)
