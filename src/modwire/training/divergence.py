"""A run that diverges stops with its last finite checkpoint (issue 26, item 3).

:class:`NonFiniteGuard` watches each optimizer step's loss and gradient norm:

* ``nonfinite: stop`` (default): the step's finiteness is recorded on the device, without a host
  sync (:meth:`observe`); :meth:`check` (called where the trainer syncs anyway: each log record,
  before each checkpoint, at the end) raises :class:`TrainingDiverged` naming the first non-finite
  step. Steps run between that step and the check are never saved: the run's ``last`` and ``best``
  checkpoints stay the last finite ones. A checkpoint is also refused when a parameter is not finite.
* ``nonfinite: skip``: a step whose loss or gradients are not finite is skipped (no optimizer
  update, gradients dropped), as AMP's grad scaler does; this costs one host sync per step (the
  decision), and the count is logged as ``skipped_steps``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch
from torch import Tensor

from .checkpoint import checkpoint_step

NONFINITE = ("stop", "skip")


class TrainingDiverged(RuntimeError):
    """The loss or the gradients were not finite; the run's last finite checkpoint is kept."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


def grad_norm(parameters: Iterable[torch.nn.Parameter]) -> Tensor | None:
    """The total L2 norm of the gradients (NaN or inf when any entry is), or None without gradients."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return None
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


class NonFiniteGuard:
    """Module docstring. ``mode``: ``"stop"`` or ``"skip"``."""

    def __init__(self, mode: str, run_dir: Path | None = None) -> None:
        self.mode, self.skipped, self.run_dir = mode, 0, run_dir
        self.first_bad: Tensor | None = None      # the first non-finite step, -1 while none (on the device)

    def observe(self, step: int, loss: Tensor, norm: Tensor | None) -> bool:
        """Record step ``step`` (its task loss and the gradients' total norm, before clipping). Returns
        whether to take the optimizer step: always in ``stop`` mode (checked later), the step's own
        finiteness in ``skip`` mode (a host sync)."""
        ok = torch.isfinite(loss.detach()).all()
        if norm is not None:
            ok = ok & torch.isfinite(norm)
        if self.mode == "skip":
            if bool(ok):                          # the one sync of this mode (as AMP's scaler)
                return True
            self.skipped += 1
            return False
        if self.first_bad is None:
            self.first_bad = torch.full((), -1, dtype=torch.long, device=ok.device)
        self.first_bad = torch.where((self.first_bad < 0) & ~ok, step, self.first_bad)
        return True

    def check(self, parameters: Iterable[torch.nn.Parameter] = ()) -> None:
        """Raise :class:`TrainingDiverged` when a step was not finite (``stop`` mode), or when any of
        ``parameters`` is not (given before a checkpoint is written); the message names the step of the
        run's last checkpoint (:func:`last_saved_step`)."""
        bad = -1 if self.first_bad is None else int(self.first_bad)
        params = list(parameters)
        if bad < 0 and params and all(bool(torch.isfinite(p).all()) for p in params):
            return
        if bad < 0 and not params:
            return
        last_saved = None if self.run_dir is None else last_saved_step(self.run_dir)
        what = (f"the loss or a gradient was not finite (NaN or inf) at step {bad}" if bad >= 0 else
                "a parameter is not finite (NaN or inf)")
        kept = (f"the last finite checkpoint (step {last_saved}) is kept as 'last' and 'best'"
                if last_saved is not None else "no checkpoint was written before it")
        raise TrainingDiverged(f"training diverged: {what}; stopped without saving the diverged weights, "
                               f"{kept}. Try a lower optim.lr or optim.grad_clip > 0, or nonfinite: skip to "
                               f"skip such steps (as AMP's grad scaler does)", bad)


def last_saved_step(run_dir: Path) -> int | None:
    """The step of the run's ``last`` checkpoint, None before the first."""
    link = run_dir / "checkpoints" / "last"
    return checkpoint_step(link.resolve()) if link.exists() else None
