"""Robustness to occlusion (NFM §4.4): test accuracy when every test image has one square occlusion
box, "the same parameters as from the Cutout paper" (DeVries & Taylor 2017): a 16×16 box whose
centre is drawn uniformly over the image, clipped at the border (so boxes near an edge are smaller),
its pixels set to 0. NFM §4.4 reports 82.46 % (PreActResNet-18) vs 84.11 % (NFM) on CIFAR-10.

Cutout zeroes the *normalised* image (0 = the dataset mean); here the box is applied to what the
evaluation pipeline gives the model: normalised images for runs trained with a normalising
``data.augment`` (``crop_flip``, ``deit``), raw [0, 1] images (0 = black) otherwise. ``fill`` changes it.

Each image's box is a function of ``(seed, index)`` only (:class:`~modwire.tasks.augment.AugmentedDataset`'s generator, epoch 0): the same boxes for every model, batch
size and worker count. ``modwire eval RUN --occlusion 16`` scores a trained run this way.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..tasks.augment import AugmentedDataset
from ..errors import UserError

__all__ = ["OccludedDataset", "cutout_box", "occlude"]


def cutout_box(height: int, width: int, size: int, generator: torch.Generator) -> tuple[int, int, int, int]:
    """One Cutout box ``(y0, y1, x0, x1)`` (half-open): centre uniform over the ``height × width``
    pixels, side ``size``, clipped to the image."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise UserError(f"occlusion box size: got {size!r}, expected an integer >= 1 (pixels; NFM §4.4: 16)")
    cy = int(torch.randint(0, height, (), generator=generator))
    cx = int(torch.randint(0, width, (), generator=generator))
    half = size // 2
    return max(cy - half, 0), min(cy - half + size, height), max(cx - half, 0), min(cx - half + size, width)


def occlude(x: Tensor, box: tuple[int, int, int, int], fill: float = 0.0) -> Tensor:
    """``x [C, H, W]`` (or ``[..., H, W]``) with the pixels of ``box`` set to ``fill`` (a copy)."""
    y0, y1, x0, x1 = box
    out = x.clone()
    out[..., y0:y1, x0:x1] = fill
    return out


class OccludedDataset(AugmentedDataset):
    """``dataset`` whose images each carry one Cutout box (:func:`cutout_box`, drawn from
    ``(seed, index)`` by :class:`~modwire.tasks.augment.AugmentedDataset`'s per-item generator);
    labels unchanged. Items are ``(image [C, H, W], label, ...)`` or, for a multi-input task,
    ``({"x": image, ...}, label)`` (only ``x`` is occluded)."""

    def __init__(self, dataset: Dataset, size: int = 16, *, seed: int = 0, fill: float = 0.0) -> None:
        cutout_box(1, 1, size, torch.Generator())                # the size check, before any item is read
        self.size, self.fill = size, float(fill)
        super().__init__(dataset, self._occlude, seed)

    def _occlude(self, image: Any, generator: torch.Generator) -> Tensor:
        if not isinstance(image, Tensor) or image.dim() < 2 or not image.is_floating_point():
            got = f"{tuple(image.shape)} {image.dtype}" if isinstance(image, Tensor) else type(image).__name__
            raise UserError(f"occlusion needs float images [C, H, W] (input 'x'), got {got}")
        return occlude(image, cutout_box(image.shape[-2], image.shape[-1], self.size, generator), self.fill)

    def __getattr__(self, name: str) -> Any:          # the wrapped dataset's other attributes (classes, ...)
        if name.startswith("__") or name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
