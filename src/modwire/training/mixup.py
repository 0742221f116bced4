"""Batch mixing (``data.mixup``), one unit: its choices, its config checks, the mixer it builds and
the seeded draw of each micro-batch.

* ``true`` / ``"deit"``: DeiT's Mixup (α 0.8) / CutMix (α 1.0) with label smoothing
  ``optim.label_smoothing`` (NAC App. C);
* ``"input"``: Input Mixup as in NFM Table 2 / Verma et al. 2019: every batch mixed with a random
  permutation of itself, ``lam ~ Beta(α, α)`` (``data.mixup_alpha``, 1.0), no CutMix;
* ``false``: none.

A draw depends only on ``(seed, rank, epoch, position in the epoch)`` (:func:`mix`), so a resumed run
mixes as an uninterrupted one did; it keeps no state. The task must be an image classification task
with one input (``supervised.apply_augmentation`` checks it against the task).
"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from ..errors import UserError
from ..seeding import torch_generator

__all__ = ["MIXUP_CHOICES", "check_mixup_config", "make_mixer", "mix"]

MIXUP_CHOICES = (False, True, "deit", "input")   # data.mixup; True = "deit"


def check_mixup_config(c: Any) -> None:
    """The relations of ``data.mixup`` with the other settings (``c``: a TrainConfig)."""
    if c.data.mixup_alpha != 1.0 and c.data.mixup != "input":
        raise UserError(f"config key 'data.mixup_alpha': got {c.data.mixup_alpha:g}, but it sets Input Mixup only "
                        f"(data.mixup: input); data.mixup is {c.data.mixup!r}")
    if c.data.few_shot.ways and c.data.mixup:
        raise UserError("config key 'data.mixup': mixup mixes the task's labels, but data.few_shot.ways "
                        "renumbers them: switch one off")


def make_mixer(cfg: Any, num_classes: int):
    """The batch mixer of ``data.mixup`` (module docstring), or None."""
    from ..tasks.augment import MixupCutmix

    if cfg.data.mixup == "input":
        return MixupCutmix(mixup_alpha=cfg.data.mixup_alpha, cutmix_alpha=0.0, prob=1.0, num_classes=num_classes,
                           label_smoothing=cfg.optim.label_smoothing, pairing="permutation")
    if cfg.data.mixup:
        return MixupCutmix(num_classes=num_classes, label_smoothing=cfg.optim.label_smoothing)
    return None


def mix(mixer, x: Tensor, y: Tensor, seed: int, rank: int, epoch: int, micro: int) -> tuple[Tensor, Tensor]:
    """``mixer(x, y)`` with a draw seeded by ``(seed, rank, epoch, micro)``; unchanged without a mixer."""
    if mixer is None:
        return x, y
    return mixer(x, y, torch_generator(seed, rank, epoch, micro))
