"""Triangle (Goyal et al. 2022; AiT Table 1 and App. A.1; implementation notes §5).

A 64×64 one-channel image shows three clusters of points; the task is whether their
centres form an equilateral triangle. Label 0 = equilateral, 1 = three random vertices.

Generation of sample ``index`` (all randomness from its per-sample generator):

* Label: ``index % 2`` (even = equilateral, odd = random), so every split is balanced
  exactly (within one sample); nothing about the label is in the rng stream.
* Coordinates are ``(x, y)`` = (column, row) in pixel units; a pixel's centre is at its
  integer index.
* Equilateral: two distinct integer vertices ``v1, v2`` uniform in ``[1, 63]²``; the third
  is ``v2`` rotated by +60° or -60° (a fair coin) about ``v1``. It is not rounded (it
  generally is not an integer point), so the triangle is exactly equilateral. Resampled
  when ``v3`` falls outside ``[1, 63]²``.
* Random: three integer vertices uniform in ``[1, 63]²``, resampled when the triangle is
  *near-equilateral*: ``max side <= near_equilateral_ratio * min side`` (default 1.1, i.e.
  every side within 10% of every other; about 0.9% of draws), to remove label noise.
* Both classes: resampled while a side is shorter than ``min_side`` (default 8 px). This
  is our addition: a cluster reaches at most √2 + 2 ≈ 3.4 px from its vertex, so with
  sides ≥ 8 the three clusters never touch and stay separate blobs (without it, a tiny
  triangle is a single blob whatever its label).
* Each vertex is drawn as a cluster of 8 points: 4 offsets ``d`` uniform in ``[-1, 1]²``
  and the points ``v + d`` and their mirror images ``v - d`` (so the cluster's mean is
  exactly the vertex). Each point is a filled disc of radius 2: pixel ``(r, c)`` is 1
  where ``(c - x)² + (r - y)² <= 4`` for some point, else 0 (clipped at the border).

Items: ``(image, label)``: a float32 ``[1, 64, 64]`` tensor with values in {0, 1} and a
0-d ``LongTensor``. :func:`sample_triangle` gives the geometry behind an item.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import GENERATOR_BOUNDS, GeneratedDataset, sample_rng, split_size
from ...fields import Bounds

IMAGE_SIZE = 64
LO, HI = 1, 63  # vertex coordinate range (inclusive)
POINTS_PER_CLUSTER = 8
JITTER = 1.0
DISC_RADIUS = 2.0
EQUILATERAL, RANDOM = 0, 1


@dataclass(frozen=True)
class Triangle:
    """The geometry of one sample: ``vertices [3, 2]`` and cluster ``points [3, 8, 2]`` as (x, y)."""

    label: int
    vertices: np.ndarray
    points: np.ndarray


def side_lengths(v: np.ndarray) -> np.ndarray:
    """Side lengths ``|v0 v1|, |v1 v2|, |v2 v0|`` of a triangle ``v [3, 2]``."""
    return np.linalg.norm(v - np.roll(v, -1, axis=0), axis=1)


def is_near_equilateral(v: np.ndarray, ratio: float = 1.1) -> bool:
    s = side_lengths(v)
    return bool(s.max() <= ratio * s.min())


# cos / sin of the rotation by +60° (True) or -60° (False) of an equilateral triangle's third vertex
_ROTATIONS = {sign > 0: (np.cos(np.pi / 3 * sign), np.sin(np.pi / 3 * sign)) for sign in (1, -1)}


def _side(ax: float, ay: float, bx: float, by: float) -> float:
    """``|a b|`` as ``np.linalg.norm`` computes it for integer points (exact squares, one rounded sqrt)."""
    return math.sqrt((bx - ax) ** 2 + (by - ay) ** 2)


# The rejection loops below use Python floats on the generator's draws: the same IEEE operations
# (and the same draws) as numpy arrays of 2-3 points, at a fraction of the overhead.
def _equilateral(rng: np.random.Generator, min_side: float) -> np.ndarray:
    shortest = max(min_side, 1.0)
    while True:
        (x1, y1), (x2, y2) = rng.integers(LO, HI + 1, size=(2, 2)).astype(np.float64).tolist()
        c, s = _ROTATIONS[rng.random() < 0.5]
        dx, dy = x2 - x1, y2 - y1
        x3, y3 = x1 + (c * dx - s * dy), y1 + (s * dx + c * dy)
        if _side(x1, y1, x2, y2) >= shortest and LO <= x3 <= HI and LO <= y3 <= HI:
            return np.array([[x1, y1], [x2, y2], [x3, y3]])


def _random(rng: np.random.Generator, min_side: float, ratio: float) -> np.ndarray:
    shortest = max(min_side, 1.0)
    while True:
        v = rng.integers(LO, HI + 1, size=(3, 2)).astype(np.float64)
        (x1, y1), (x2, y2), (x3, y3) = v.tolist()
        sides = (_side(x1, y1, x2, y2), _side(x2, y2, x3, y3), _side(x3, y3, x1, y1))
        if min(sides) >= shortest and not max(sides) <= ratio * min(sides):  # not near-equilateral
            return v


def sample_triangle(seed: int, split: str, index: int, min_side: float = 8.0,
                    near_equilateral_ratio: float = 1.1) -> Triangle:
    """The label, vertices and cluster points of sample ``index`` of ``split``."""
    rng = sample_rng(seed, split, index)
    label = index % 2
    v = _equilateral(rng, min_side) if label == EQUILATERAL else _random(rng, min_side, near_equilateral_ratio)
    d = rng.uniform(-JITTER, JITTER, size=(3, POINTS_PER_CLUSTER // 2, 2))
    points = np.concatenate([v[:, None] + d, v[:, None] - d], axis=1)
    return Triangle(label, v, points)


_GRID_Y, _GRID_X = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float64)


def render(points: np.ndarray) -> np.ndarray:
    """``[64, 64]`` float32 image: 1 within ``DISC_RADIUS`` of any point ``(x, y)``, else 0 (the
    definition, over the whole grid; items are drawn by :func:`render_batch`, equal pixel for pixel)."""
    p = points.reshape(-1, 2)
    d2 = (_GRID_X[None] - p[:, 0, None, None]) ** 2 + (_GRID_Y[None] - p[:, 1, None, None]) ** 2
    return (d2 <= DISC_RADIUS ** 2).any(0).astype(np.float32)


_REACH = int(DISC_RADIUS) + 1                   # a window of ±3 px about each point holds its whole disc
_WINDOW = np.arange(-_REACH, _REACH + 1)


def render_batch(points: np.ndarray) -> np.ndarray:
    """``[B, 64, 64]`` float32 images of the points ``[B, ..., 2]`` of each sample: :func:`render` of
    each, pixel for pixel (the same float64 distances, compared alike), vectorised over the batch
    and evaluated only in a ``7 × 7`` window about each point instead of the whole grid."""
    p = points.reshape(len(points), -1, 2) if len(points) else np.zeros((0, 1, 2))
    x, y = p[..., 0], p[..., 1]                                               # [B, P]
    cols = np.floor(x).astype(np.int64)[..., None] + _WINDOW                  # [B, P, 7]
    rows = np.floor(y).astype(np.int64)[..., None] + _WINDOW
    dx2, dy2 = (cols - x[..., None]) ** 2, (rows - y[..., None]) ** 2          # as render: (c - x)², (r - y)²
    inside = (dx2[..., None, :] + dy2[..., :, None] <= DISC_RADIUS ** 2)       # [B, P, 7 rows, 7 cols]
    inside &= ((rows >= 0) & (rows < IMAGE_SIZE))[..., :, None] & ((cols >= 0) & (cols < IMAGE_SIZE))[..., None, :]
    b, k, i, j = np.nonzero(inside)
    img = np.zeros((len(p), IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    img[b, rows[b, k, i], cols[b, k, j]] = 1.0
    return img


class TriangleDataset(GeneratedDataset):
    def __init__(self, split: str, seed: int, size, min_side: float, near_equilateral_ratio: float) -> None:
        super().__init__(split, seed, split_size(size, split))
        self.min_side, self.ratio = float(min_side), float(near_equilateral_ratio)

    def triangle(self, index: int) -> Triangle:
        return sample_triangle(self.seed, self.split, index, self.min_side, self.ratio)

    def item(self, index: int) -> tuple[Tensor, Tensor]:
        return self.items([index])[0]

    def items(self, indices: list[int]) -> list[tuple[Tensor, Tensor]]:
        """The items of ``indices``, their images drawn at once (:func:`render_batch`)."""
        shapes = [self.triangle(i) for i in indices]
        if not shapes:
            return []
        images = torch.from_numpy(render_batch(np.stack([t.points for t in shapes])))[:, None]
        labels = torch.tensor([t.label for t in shapes], dtype=torch.long)
        return list(zip(images, labels))


DEFAULT_SIZE = {"train": 50_000, "val": 10_000, "test": 10_000}  # AiT App. A.1: 50k train, 10k test


def build(split: str, seed: int = 0, size=None, min_side: float = 8.0,
          near_equilateral_ratio: float = 1.1) -> TriangleDataset:
    """Triangle split. ``size``: an int or ``{split: n}`` (default 50k/10k/10k). ``min_side``:
    shortest allowed side (px). ``near_equilateral_ratio``: random triangles with
    ``max side <= ratio * min side`` are rejected."""
    return TriangleDataset(split, seed, DEFAULT_SIZE if size is None else size,
                           min_side, near_equilateral_ratio)


INFO = TaskInfo(
    name="triangle",
    kind="generator",
    description=("Triangle: is the 64x64 image of three point clusters an equilateral triangle? "
                 "Label 0 = equilateral, 1 = random (near-equilateral ones rejected); balanced by index parity."),
    num_classes=2,
    class_names=("equilateral", "random"),
    inputs=InputSpec.image(1, IMAGE_SIZE, IMAGE_SIZE),
    loss="cross_entropy",
    metrics=("top1",),
    splits=("train", "val", "test"),
    params={"seed": 0, "size": dict(DEFAULT_SIZE), "min_side": 8.0, "near_equilateral_ratio": 1.1},
    param_bounds={**GENERATOR_BOUNDS, "min_side": Bounds(lo=0, hi=30, note="px"),
                  "near_equilateral_ratio": Bounds(lo=1, note="max side / min side")},
)

register_task(INFO, build)
