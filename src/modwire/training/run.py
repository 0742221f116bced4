"""What one training process holds besides its :class:`~modwire.training.state.TrainState`: the
:class:`TrainingRun`, and the :class:`Program` that says what one step and one evaluation are.

The trainer (:mod:`modwire.training.trainer`) owns everything every run shares: the run
directory and its lock, the config record and resume checks, signals, checkpoints,
``metrics.jsonl``, the start-up header and progress. A program brings what differs between kinds
of model: supervised learning (:class:`~modwire.training.supervised.Supervised`: micro-batches,
the task loss, validation on ``data.val_split``) or adversarial training
(:class:`~modwire.training.gan.GANProgram`: ``n_dis`` discriminator steps and one generator
step, FID scores, sample grids). Which program a run gets is its kind's (:mod:`modwire.training.kinds`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from . import distributed
from .config import TrainConfig
from .divergence import NonFiniteGuard
from .feedback import Feedback
from .loggers import RunLoggers
from .signals import StopSignals
from .state import TrainState


class Program(Protocol):
    """The model-kind-specific parts of a run. ``step`` takes one optimizer step (advancing
    ``state.step``, ``state.epoch``, ``state.micro`` and setting ``state.val_pending`` when an
    evaluation is due) and returns its losses as detached scalars; ``evaluate`` returns the
    metrics (None when a stop request interrupted it); ``best_metric`` names the metric that
    decides ``best`` and whether lower is better; ``summary`` gives the header's lines (``data``,
    ``steps``, and optionally ``workers``, appended to the device line); ``log_fields`` adds the
    program's own counters to each ``metrics.jsonl`` record."""

    best_metric: tuple[str | None, bool]

    def step(self, run: "TrainingRun", state: TrainState) -> dict[str, Tensor]: ...

    def evaluate(self, run: "TrainingRun", state: TrainState, stop: StopSignals) -> dict[str, float] | None: ...

    def summary(self, run: "TrainingRun", state: TrainState) -> dict[str, str]: ...

    def log_fields(self) -> dict[str, Any]: ...


@dataclass
class TrainingRun:
    """What the loop needs besides the :class:`TrainState`, built once per process."""

    cfg: TrainConfig
    dist: distributed.DistInfo
    dir: Path
    program: Program
    total: int                                  # optimizer steps of the whole run
    net: torch.nn.Module | None = None          # the model as called: DDP- and compile-wrapped
    log: RunLoggers | None = None               # metrics.jsonl and the config's loggers (loggers.py)
    feedback: Feedback | None = None
    guard: NonFiniteGuard | None = None         # non-finite losses and gradients (training/divergence.py)
    seen: int = 0                               # samples since the last log record
    tick: float = 0.0

    @property
    def device(self) -> torch.device:
        return self.dist.device

    def samples_per_second(self) -> float:
        return self.seen / max(time.perf_counter() - self.tick, 1e-9)
