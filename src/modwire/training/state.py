"""Everything a run needs to continue exactly: :class:`TrainState`.

The counters locate the run: ``step`` (optimizer steps taken), ``epoch`` (epochs
completed), ``micro`` (micro-batches consumed inside the current epoch). ``val`` holds the
last validation metrics (measured at ``val_step``), ``best`` the best one (``{metric: value, "step": n}``) and
``val_pending`` says that an epoch ended (or training did) but its validation has not
finished yet (a run stopped during validation redoes it first on resume). ``save`` also
records every RNG state, so a resumed run draws what an uninterrupted one would.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_state, load_weights, save_checkpoint
from .ema import LIVE_FILE, WeightEMA, weight_files
from ..errors import UserError

COUNTERS = ("step", "epoch", "micro", "best", "val", "val_step", "val_pending")


@dataclass
class TrainState:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any                                  # torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    ema: WeightEMA | None = None                    # ema_decay > 0 (training/ema.py)
    step: int = 0
    epoch: int = 0
    micro: int = 0
    best: dict[str, float] | None = None
    val: dict[str, float] | None = None
    val_step: int | None = None                     # the step ``val`` was measured at
    val_pending: bool = False
    run_id: str | None = None                       # the run's identity, written into each checkpoint (resume.py)

    @property
    def eval_model(self) -> torch.nn.Module:
        """The weights that are validated and called "best": the EMA's when one is kept."""
        return self.ema.module if self.ema is not None else self.model

    def save(self, run_dir: str | os.PathLike, tag: str) -> Path:
        """Write ``<run_dir>/checkpoints/<tag>`` (atomic, checksummed; see ``checkpoint.py``)."""
        full = {k: getattr(self, k) for k in COUNTERS}
        full.update(optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict(),
                    scaler=self.scaler.state_dict(), rng=rng_state(), run_id=self.run_id, **self.extra_state())
        if self.ema is not None:
            full.update(self.ema.state())
        live = {LIVE_FILE: self.model.state_dict()} if self.ema is not None else None   # model.safetensors: scored
        summary = {"tag": tag, "weights": "ema" if self.ema is not None else "live",
                   **{k: getattr(self, k) for k in ("step", "epoch", "val", "val_step", "val_pending", "best", "run_id")}}
        return save_checkpoint(run_dir, tag, self.eval_model, full, live, summary=summary)

    def load(self, ckpt_dir: str | os.PathLike) -> "TrainState":
        """Restore weights, optimizer, schedule, scaler, EMA, counters and RNG states from a
        checkpoint directory (its checksums verified first)."""
        ckpt = Path(ckpt_dir)
        full = load_state(ckpt)                     # verifies manifest.json
        files, _ = weight_files(ckpt)
        load_weights(self.model, files["live"])
        load_optimizer(self.optimizer, full["optimizer"], ckpt)
        self.scheduler.load_state_dict(full["scheduler"])
        if full.get("scaler"):
            self.scaler.load_state_dict(full["scaler"])
        if self.ema is not None:
            self.ema.load(full, ckpt)
        self.load_extra_state(full, ckpt)
        for k in COUNTERS:
            setattr(self, k, full.get(k, getattr(self, k)))
        set_rng_state(full["rng"])
        return self

    def extra_state(self) -> dict[str, Any]:
        """What a subclass saves besides the above (a GAN's discriminator optimizer: ``gan.GANState``)."""
        return {}

    def load_extra_state(self, full: dict[str, Any], ckpt: Path) -> None:
        """Restore :meth:`extra_state` from a checkpoint's ``state.pt`` contents."""


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], ckpt: Path,
                   name: str = "optimizer") -> None:
    """``optimizer.load_state_dict(state)`` after checking that the checkpoint's parameter groups
    have this run's sizes (torch would only say that some group does not match)."""
    saved = [len(g["params"]) for g in state["param_groups"]]
    built = [len(g["params"]) for g in optimizer.param_groups]
    if saved != built:
        raise UserError(f"{ckpt}: the {name}'s parameter groups hold {saved} tensors in the checkpoint and "
                        f"{built} in this run: the model's trainable parameters or their grouping (weight "
                        f"decay, frozen sets) changed since it was written; resume with the code and config "
                        f"that wrote it, or start a new run directory")
    optimizer.load_state_dict(state)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
