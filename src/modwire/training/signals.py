"""SIGINT and SIGTERM as a stop request.

Cluster schedulers (Slurm, Kubernetes, SGE) stop a job with SIGTERM and kill it with
SIGKILL a grace period later (Slurm: ``KillWait``, 30 s by default; Kubernetes:
``terminationGracePeriodSeconds``). modwire treats SIGTERM exactly like Ctrl-C (SIGINT):
the current optimizer step (or validation batch) finishes, a ``last`` checkpoint is
written, and the process exits with ``128 + signal``: 130 for SIGINT, 143 for SIGTERM.
``modwire train --resume RUN_DIR`` then continues bit-identically.
"""
from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """``with StopSignals() as stop:`` … ``stop.requested`` / ``stop.signum`` (the first signal)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __call__(self) -> bool:
        return self.requested

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum) if self.signum is not None else 0

    def _handle(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> "StopSignals":
        for s in STOP_SIGNALS:
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread: signals stay with their owner
                break
        return self

    def __exit__(self, *exc) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous.clear()
