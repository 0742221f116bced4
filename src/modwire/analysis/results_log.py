"""The results log of a resumable study (``experiments/``): one JSON object per finished job,
appended as each job ends, so a rerun skips what is done."""
from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import UserError
from ..files import append_line


def load_results(path: Path, keep: Callable[[dict], bool] = lambda r: True) -> dict[str, dict]:
    """Finished jobs by their ``key`` (those ``keep`` accepts). A last line cut short (the study was
    killed mid-write) is dropped, so that job runs again; a damaged line elsewhere is an error
    naming the file and line."""
    if not path.exists():
        return {}
    lines, out = path.read_text().splitlines(), {}
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line) if line.strip() else None
        except json.JSONDecodeError as e:
            if n == len(lines):
                break
            raise UserError(f"{path}, line {n}: not a JSON result ({e}); fix or delete the line") from None
        if r is not None and keep(r):
            out[r["key"]] = r
    return out


def append_results(results: Iterable[dict], path: Path, *, total: int, describe: Callable[[dict], str],
                   log: Callable[[str], None]) -> list[str]:
    """Append each finished job's result to the results log ``path`` as it arrives (a whole line or
    none: :func:`modwire.files.append_line`), log one line per job (``describe(result)``), and return
    the failures (results with an ``error`` key, not recorded, so a rerun tries them again)."""
    failed: list[str] = []
    for i, r in enumerate(results, 1):
        if "error" in r:
            failed.append(f"{r['key']}: {r['error']}")
            log(f"[{i}/{total}] {failed[-1]}")
            continue
        append_line(path, json.dumps(r))
        log(f"[{i}/{total}] {r['key']}: {describe(r)} ({r['seconds']:.0f} s)")
    return failed


def run_jobs(run: Callable[[Any], dict], todo: list, path: Path, *, workers: int, describe: Callable[[dict], str],
             log: Callable[[str], None] = print) -> list[str]:
    """Run ``run(job)`` for each job of ``todo`` in ``workers`` spawned processes (one job per process;
    0: in this process), appending each result to the results log ``path`` as it arrives
    (:func:`append_results`); SIGTERM stops the pool like Ctrl-C. Returns the failures. ``run`` must
    be importable by the spawned workers (a module-level function of the experiment script)."""
    import multiprocessing as mp

    path.parent.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    pool = mp.get_context("spawn").Pool(workers, maxtasksperchild=1) if workers else None
    results = pool.imap_unordered(run, todo) if pool else map(run, todo)
    try:
        return append_results(results, path, total=len(todo), log=log, describe=describe)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
