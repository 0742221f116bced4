"""An offline stand-in for NI's digits multi-task (NI §4.2, App. C.1), built from scikit-learn's
8×8 digits (which ship with scikit-learn: no files, no download).

NI pre-trains on three digit datasets with shared labels (SVHN, MNIST-M, MNIST), each with its
own CLS token and head. This generator makes three "datasets" of 32×32 RGB images with the
same 10 labels and the same ids as :mod:`modwire.tasks.loaders.digits_multitask`:

* 0 ``svhn_like``: a coloured digit on a plain background of another colour, with parts of
  other digits left and right of it (SVHN's crops of house numbers); the label is the centre digit.
* 1 ``mnist_m_like``: a white digit blended onto a random colour texture as MNIST-M does,
  ``|texture - digit|`` per channel (Ganin & Lempitsky 2015).
* 2 ``mnist_like``: the plain grey digit on black, repeated as RGB.

The 1,797 digits are split once by a fixed permutation (independent of ``seed``) into disjoint
pools of base images: 300 for ``test``, 300 for ``val``, the other 1,197 for ``train``; no base
image is seen in two splits. Item ``i`` of a split is dataset ``i % 3``, and everything about it
(the base digit, its size and position, colours, texture, neighbours) is drawn from
``SeedSequence([seed, split_id, i])``: a split is a fixed dataset.

Item: ``({"x": float [3, 32, 32] in [0, 1], "task": LongTensor []}, label)``; ``heads = 3``,
``num_classes = 10``. The few-shot target that is installed offline is Fashion-MNIST at 32×32
RGB (``fashion_mnist`` with ``upsample_to=32, channels=3``), in place of NI's K-MNIST.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import DIGIT_CLASSES, InputSpec, TaskInfo, register_task
from ..loaders.digits import sklearn_digits
from ..loaders.digits_multitask import per_source
from ._common import GENERATOR_BOUNDS, GeneratedDataset, sample_rng, split_size

SOURCES = ("svhn_like", "mnist_m_like", "mnist_like")   # ids as digits_multitask: 0 SVHN, 1 MNIST-M, 2 MNIST
SIDE = 32
DEFAULT_SIZE = {"train": 12_000, "val": 1_500, "test": 1_500}


@lru_cache(maxsize=None)
def base_images(split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(glyphs float32 [n, 8, 8] in [0, 1], labels int64 [n])``: the split's pool of base digits."""
    data = sklearn_digits("digits_multitask_offline")
    order = np.random.RandomState(12345).permutation(len(data.target))
    cut = {"test": order[:300], "val": order[300:600], "train": order[600:]}[split]
    return (data.images[cut] / 16.0).astype(np.float32), data.target[cut].astype(np.int64)


def _glyph(g: np.ndarray, side: int) -> np.ndarray:
    """An 8×8 glyph resized (bilinear) to ``side × side``."""
    t = torch.from_numpy(g)[None, None]
    return F.interpolate(t, size=(side, side), mode="bilinear", align_corners=False)[0, 0].numpy()


def _paste(mask: np.ndarray, glyph: np.ndarray, top: int, left: int) -> None:
    """``mask = max(mask, glyph)`` with ``glyph``'s top-left corner at ``(top, left)``; clipped."""
    h, w = glyph.shape
    t0, l0 = max(top, 0), max(left, 0)
    t1, l1 = min(top + h, SIDE), min(left + w, SIDE)
    if t1 > t0 and l1 > l0:
        region = mask[t0:t1, l0:l1]
        np.maximum(region, glyph[t0 - top:t1 - top, l0 - left:l1 - left], out=region)


def _centred(g: np.ndarray, side: int, rng: np.random.Generator, jitter: int) -> np.ndarray:
    mask = np.zeros((SIDE, SIDE), np.float32)
    top, left = (SIDE - side) // 2 + rng.integers(-jitter, jitter + 1, size=2)
    _paste(mask, _glyph(g, side), int(top), int(left))
    return mask


def mnist_like(g: np.ndarray, rng: np.random.Generator, pool: np.ndarray) -> np.ndarray:
    """The grey digit on black, ``[3, 32, 32]``."""
    mask = _centred(g, int(rng.integers(22, 27)), rng, 2)
    return np.repeat(mask[None], 3, 0)


def mnist_m_like(g: np.ndarray, rng: np.random.Generator, pool: np.ndarray) -> np.ndarray:
    """``|texture - digit|`` on a smooth random colour texture with fine noise, ``[3, 32, 32]``."""
    mask = _centred(g, int(rng.integers(22, 27)), rng, 2)
    coarse = torch.from_numpy(rng.random((1, 3, 4, 4), dtype=np.float32))
    texture = F.interpolate(coarse, size=(SIDE, SIDE), mode="bicubic", align_corners=False)[0].numpy()
    texture = np.clip(0.75 * texture + 0.25 * rng.random((3, SIDE, SIDE), dtype=np.float32), 0, 1)
    return np.abs(texture - mask[None])


def _colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A background and a foreground colour whose luminances differ by at least 0.35."""
    luma = np.array([0.299, 0.587, 0.114], np.float32)
    while True:
        bg, fg = rng.random(3, dtype=np.float32), rng.random(3, dtype=np.float32)
        if abs(float(luma @ (bg - fg))) >= 0.35:
            return bg, fg


def svhn_like(g: np.ndarray, rng: np.random.Generator, pool: np.ndarray) -> np.ndarray:
    """A coloured centre digit with neighbours cut by the crop, on another colour, ``[3, 32, 32]``."""
    side = int(rng.integers(18, 25))
    mask = _centred(g, side, rng, 1)
    top, left = (SIDE - side) // 2, (SIDE - side) // 2
    for direction in (-1, 1):                      # a digit to the left and/or right, partly outside
        if rng.random() < 0.7:
            other = pool[rng.integers(len(pool))]
            offset = direction * int(side * rng.uniform(0.75, 0.95))
            _paste(mask, _glyph(other, side), top + int(rng.integers(-2, 3)), left + offset)
    bg, fg = _colours(rng)
    img = bg[:, None, None] * (1 - mask) + fg[:, None, None] * mask
    return np.clip(img + 0.03 * rng.standard_normal((3, SIDE, SIDE), dtype=np.float32), 0, 1)


RENDER = (svhn_like, mnist_m_like, mnist_like)


class DigitsOfflineDataset(GeneratedDataset):
    """``size`` items; item ``i`` is dataset ``i % 3`` (module docstring)."""

    def __init__(self, split: str, seed: int, size) -> None:
        super().__init__(split, seed, split_size(size, split))
        self.glyphs, self.labels = base_images(split)

    def item(self, index: int) -> tuple[dict[str, Tensor], Tensor]:
        task = index % len(SOURCES)
        rng = sample_rng(self.seed, self.split, index)
        k = int(rng.integers(len(self.labels)))
        x = RENDER[task](self.glyphs[k], rng, self.glyphs).astype(np.float32)
        return ({"x": torch.from_numpy(np.ascontiguousarray(x)), "task": torch.tensor(task, dtype=torch.long)},
                torch.tensor(self.labels[k], dtype=torch.long))


def build(split: str, seed: int = 0, size=None) -> DigitsOfflineDataset:
    """``size``: items per split (int or ``{split: n}``; default 12000 / 1500 / 1500)."""
    return DigitsOfflineDataset(split, seed, DEFAULT_SIZE if size is None else size)


register_task(TaskInfo(
    name="digits_multitask_offline", kind="generator",
    description="Offline stand-in for NI's digits multi-task from scikit-learn's 8x8 digits: "
                "{'x': [3, 32, 32], 'task': 0 SVHN-like / 1 MNIST-M-like / 2 MNIST-like}, 3 heads of 10 classes; "
                "disjoint base digits per split",
    num_classes=10, heads=len(SOURCES), subsets=per_source(SOURCES),    # top1_svhn_like, ...
    inputs={"x": InputSpec.image(3, SIDE, SIDE), "task": InputSpec.index(len(SOURCES))},
    splits=("train", "val", "test"), params={"seed": 0, "size": dict(DEFAULT_SIZE)}, param_bounds=GENERATOR_BOUNDS,
    class_names=DIGIT_CLASSES,
), build)
