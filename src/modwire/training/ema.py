"""The weight EMA (``ema_decay > 0``), one unit: its config check, its update, its state, its
checkpoint files and the side that reads them.

* **Training**: :class:`WeightEMA` keeps ``θ_ema ← d·θ_ema + (1 − d)·θ`` after each optimizer step
  (``torch.optim.swa_utils.AveragedModel`` with its EMA function), buffers copied from the live model
  (an AiT memory, BatchNorm statistics, which an average would leave at their first values).
  Validation scores the EMA and ``best`` is chosen by it.
* **Config**: :func:`horizon_note` warns when the average's horizon ``1 / (1 − d)`` is longer than
  the run (the EMA, which is saved as the run's weights, stays near the first steps').
* **Checkpoint files**: ``model.safetensors`` holds the weights validation scored (the EMA's when one is
  kept, so ``from_pretrained`` on a checkpoint reads them), ``live.safetensors`` the trained weights a
  resume continues, ``checkpoint.json`` says ``"weights": "ema" | "live"``; ``state.pt`` holds
  ``ema_n_averaged``. The layout before issue 36 (``model.safetensors`` live, ``ema.safetensors``) is read
  too.
* **Readers**: :func:`checkpoint_model` (eval, analyze, finetune: the scored weights, or ``"live"`` /
  ``"ema"`` asked for), :func:`weight_files`, :func:`weights_note`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..models.base import WEIGHTS_FILE
from .checkpoint import load_weights

__all__ = ["LIVE_FILE", "OLD_EMA_FILE", "WEIGHTS", "WeightEMA", "horizon_note", "check_weights_choice",
           "checkpoint_model", "weight_files", "weights_note"]

LIVE_FILE = "live.safetensors"      # the trained weights beside an EMA's model.safetensors
OLD_EMA_FILE = "ema.safetensors"    # the layout before issue 36: model.safetensors held the live weights
WEIGHTS = ("live", "ema")


class WeightEMA:
    """The EMA of a model's parameters (and a copy of its buffers). ``module``: the averaged model."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))

    @classmethod
    def for_config(cls, model: torch.nn.Module, decay: float) -> "WeightEMA | None":
        """The EMA of ``ema_decay`` (None when it is 0)."""
        return cls(model, decay) if decay > 0 else None

    @property
    def module(self) -> torch.nn.Module:
        return self.averaged.module

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """After an optimizer step: average the parameters, copy the buffers."""
        self.averaged.update_parameters(model)
        for dst, src in zip(self.module.buffers(), model.buffers()):
            dst.copy_(src)

    def state(self) -> dict[str, Any]:
        """What ``state.pt`` keeps besides the weights."""
        return {"ema_n_averaged": self.averaged.n_averaged}

    def load(self, full: dict[str, Any], ckpt: Path) -> None:
        """Restore from a checkpoint (its ``state.pt`` contents ``full``)."""
        files, _ = weight_files(ckpt)
        if "ema" not in files:
            raise UserError(f"{ckpt} holds no EMA weights, but the config keeps an EMA (ema_decay > 0)")
        load_weights(self.module, files["ema"])
        self.averaged.n_averaged.copy_(full["ema_n_averaged"])


def horizon_note(decay: float, total: int) -> str | None:
    """The warning for an EMA that averages over more steps than the run has (``check_run_length``)."""
    if decay and 1 / (1 - decay) > total:
        return (f"config key 'ema_decay': {decay:g} averages over about {1 / (1 - decay):.0f} steps, but the run "
                f"has {total} optimizer step{'s' if total != 1 else ''} in all: the EMA weights, which are "
                f"validated and saved as the run's, stay close to the first steps' (lower ema_decay, or train longer)")
    return None


# ----------------------------------------------------------------------------- the reader side

def weight_files(ckpt: str | os.PathLike) -> tuple[dict[str, Path], str]:
    """``({"live": file, "ema": file}, scored)``: a checkpoint's weight files by kind and which one
    validation scored (``"ema"`` when an EMA was kept). Reads the layout before issue 36 too, where
    ``model.safetensors`` held the live weights and ``ema.safetensors`` the EMA."""
    d = Path(ckpt)
    if (d / OLD_EMA_FILE).is_file():
        return {"live": d / WEIGHTS_FILE, "ema": d / OLD_EMA_FILE}, "ema"
    if (d / LIVE_FILE).is_file():
        return {"live": d / LIVE_FILE, "ema": d / WEIGHTS_FILE}, "ema"
    return {"live": d / WEIGHTS_FILE}, "live"


def check_weights_choice(weights: str | None) -> None:
    if weights is not None and weights not in WEIGHTS:
        raise UserError(f"weights: expected one of {list(WEIGHTS)} (or none: the weights validation scored), "
                        f"got {weights!r}")


def weights_note(ckpt: str | os.PathLike, weights: str | None) -> str:
    """``"ema (what validation scored; --weights live for the trained ones)"``: which weights a reader loads."""
    files, scored = weight_files(ckpt)
    if weights is not None and weights != scored:
        return f"{weights} (asked for; validation scored the {scored} weights)"
    if len(files) == 1:
        return "live (the run kept no EMA)"
    return f"{scored} (what validation scored and 'best' was chosen by; --weights live for the trained ones)"


def checkpoint_model(ckpt: str | os.PathLike, weights: str | None = None) -> tuple[torch.nn.Module, str]:
    """``(model, kind)``: the model of a checkpoint directory with the weights validation scored
    (``weights=None``: the EMA's when one was kept), or the ``"live"`` / ``"ema"`` ones asked for.
    Every reader of a run (eval, analyze, finetune) loads through here; ``from_pretrained`` on the
    checkpoint directory gives the scored weights too."""
    from ..models import from_pretrained

    check_weights_choice(weights)
    files, scored = weight_files(ckpt)
    kind = weights or scored
    if kind not in files:
        raise UserError(f"weights={kind!r}: checkpoint {ckpt} kept no EMA (the run's ema_decay was 0), so it holds "
                        f"one set of weights, the live ones; leave the choice out or ask for 'live'")
    model = from_pretrained(ckpt)
    if files[kind] != Path(ckpt) / WEIGHTS_FILE:
        load_weights(model, files[kind])
    return model, kind
