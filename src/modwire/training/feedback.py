"""What a run tells its user: a one-time summary, progress, and ``metrics.jsonl``.

On a terminal (``progress: true`` and stderr a TTY) a tqdm bar shows steps and another
the validation batches. Redirected to a file (a cluster job's log), the same information
comes as plain lines, one every ``log_every`` steps and a few per validation, never
carriage-return redraws. ``metrics.jsonl`` is always written (rank 0); the other loggers a
config names (``loggers``: CSV, TensorBoard, MLflow, W&B, your own) are
:mod:`modwire.training.loggers`.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import append_line, atomic_write_text, read_lines


def json_safe(value: Any) -> Any:
    """``value`` with NaN and ±inf replaced by None, so ``json.dumps(allow_nan=False)`` writes valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def dumps(value: Any) -> str:
    return json.dumps(json_safe(value), allow_nan=False)


class Feedback:
    """Summary and progress on stderr (rank 0 only); ``bars``: tqdm on a TTY, plain lines otherwise."""

    def __init__(self, *, title: str, total: int, start: int, enabled: bool, main: bool, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.title, self.total, self.main, self.enabled = title, total, main, enabled and main
        self.bar = self.val_bar = None
        self._val_shown = 0.0
        if self.enabled and _isatty(self.stream):
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._tqdm = tqdm
                self.bar = tqdm(total=total, initial=start, desc=title, unit="step", file=self.stream)

    def print(self, text: str) -> None:
        if self.main:
            if self.bar is not None:
                self.bar.write(text, file=self.stream)
            else:
                print(text, file=self.stream, flush=True)

    def summary(self, items: dict[str, Any]) -> None:
        """The one-time summary of a run, one ``key: value`` per line."""
        self.print("\n".join([self.title] + [f"  {k + ':':<18}{v}" for k, v in items.items()]))

    def step(self, record: dict[str, Any] | None, val: dict[str, float] | None) -> None:
        """After each optimizer step; ``record`` is the logged record of this step, if any."""
        if not self.enabled:
            return
        shown = {"val_" + k: v for k, v in (val or {}).items()}
        if self.bar is not None:
            self.bar.update(1)
            if record is not None:
                self.bar.set_postfix({k: _fmt(v) for k, v in {**_step_items(record), **shown}.items()})
        elif record is not None:
            items = {**_step_items(record), **shown}
            self.print(f"{self.title}: step {record['step']}/{self.total} "
                       + " ".join(f"{k}={_fmt(v)}" for k, v in items.items()))

    def validation(self, done: int, total: int) -> None:
        """After each validation batch."""
        if not self.enabled:
            return
        if self.bar is not None:
            if self.val_bar is None:
                self.val_bar = self._tqdm(total=total, desc="validation", unit="batch", leave=False, file=self.stream)
            self.val_bar.update(1)
            if done == total:
                self.val_bar.close()
                self.val_bar = None
        elif done == 1 or done == total or time.monotonic() - self._val_shown > 10:
            self._val_shown = time.monotonic()
            self.print(f"{self.title}: validation {done}/{total} batches")

    def close(self) -> None:
        for bar in (self.val_bar, self.bar):
            if bar is not None:
                bar.close()


def _step_items(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("step", "epoch")}


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class MetricsLog:
    """``metrics.jsonl``, rank 0 only: one JSON record per line. On resume,
    records after the resumed step are dropped so the log matches an uninterrupted run: the file is
    rewritten atomically (:mod:`modwire.files`), so a kill during the rewrite keeps every record, and a
    torn last line (a kill or a full disk mid-append) is dropped with a warning."""

    def __init__(self, run: Path, main: bool, resume_step: int | None) -> None:
        self.path, self.main = run / "metrics.jsonl", main
        if not main:
            return
        if resume_step is not None and self.path.exists():
            keep = [l for n, l in enumerate(read_lines(self.path), 1)
                    if _record(self.path, n, l).get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(l + "\n" for l in keep))
        elif resume_step is None:
            atomic_write_text(self.path, "")

    def log(self, record: dict[str, Any]) -> None:
        if self.main:
            append_line(self.path, dumps(record))

    def close(self) -> None:
        pass


def _record(path: Path, n: int, line: str) -> dict[str, Any]:
    """One ``metrics.jsonl`` record; a damaged line is a ValueError naming the file and line."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise UserError(f"{path}, line {n}: not a metrics record ({e}); remove or repair the line, "
                        f"then resume again") from None
    if not isinstance(record, dict):
        raise UserError(f"{path}, line {n}: not a metrics record (a JSON {type(record).__name__})")
    return record
