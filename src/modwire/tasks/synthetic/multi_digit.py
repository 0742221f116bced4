"""Multi-digit images (NFM §4.2 "Stacked MNIST Generalization", Table 5).

A 64×64 one-channel image holds 1-5 handwritten digits placed without overlap; the target
says which of the 10 digit classes are present (a multi-label binary target, one output per
class, loss ``bce``). NFM trains on images with one or three digits ("Trained (1,3)") or one or
five ("Trained (1,5)") and tests on each count 1..5 separately, to measure how recognition
generalises to unseen numbers of objects. The paper's Appendix B (image details) is not in
the text we have: what follows is our specification, every choice below is ours.

Digits ("glyphs"):

* ``root`` given: MNIST from its idx files (:mod:`modwire.tasks.loaders.mnist`). ``val``
  draws from the last twelfth of the training file (the last 5,000 of 60,000 images), ``train``
  from the rest, ``test`` from ``t10k``; each glyph is the digit's ink bounding box (MNIST already normalises every digit
  into a 20×20 box), at native scale when ``digit_size=20``.
* ``root=None`` (the offline default, so no file is needed): scikit-learn's bundled 8×8
  digits, split into the same disjoint pools as ``digits_multitask_offline`` (1,197 train /
  300 val / 300 test base images); each 8×8 digit is cropped to its ink and upscaled
  bilinearly by ``digit_size / 8`` (a 20×20 box by default). These are *not* MNIST digits:
  the numbers are not comparable with Table 5's, only the baseline-vs-NFM comparison is.

Sample ``index`` of a split (all randomness from ``SeedSequence([seed, split_id, index])``):

* its digit count is ``counts[index % len(counts)]`` (each split is balanced over its counts);
* ``count`` classes drawn uniformly without replacement (``distinct=True``, so the count of
  digits is the count of positive labels), or with replacement (``distinct=False``); for each
  class, a glyph drawn uniformly from the split's pool of that class;
* placement: glyph bounding boxes must not intersect (touching is allowed). Each glyph's
  top-left corner is drawn uniformly among the positions whose box misses every box placed
  before; when none is left the whole layout is redrawn (up to ``MAX_RESTARTS`` times).
  Pixels are the glyphs' grey levels in [0, 1] on a black (0) canvas.

Items: ``(image float32 [1, S, S], target float32 [10])`` with ``target[c] = 1`` iff class
``c`` is present. :meth:`MultiDigitDataset.layout` gives the classes and boxes behind an item.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import DIGIT_CLASSES, InputSpec, TaskInfo, register_task
from ._common import GENERATOR_BOUNDS, SPLIT_IDS, GeneratedDataset, sample_rng, split_size
from ...errors import UserError
from ...fields import Bounds

NUM_CLASSES = 10
IMAGE_SIZE = 64                 # NFM §4.2: "synthetic 64x64 images"
DIGIT_SIZE = 20                 # MNIST's normalised digit box (LeCun et al. 1998)
MAX_RESTARTS = 200
DEFAULT_SIZE = {"train": 50_000, "val": 5_000, "test": 10_000}
DEFAULT_COUNTS = {"train": [1, 3], "val": [1, 3], "test": [1, 2, 3, 4, 5]}   # Table 5, "Trained (1,3)"
MNIST_VAL_FRACTION = 12        # the last 1/12 of MNIST's training images (5,000) form the val pool


@dataclass(frozen=True)
class Layout:
    """What an item shows: ``classes [n]`` (one per digit, in drawing order), ``glyphs [n]``
    (index into the split's pool) and ``boxes [n, 4]`` as ``(top, left, height, width)``."""

    classes: np.ndarray
    glyphs: np.ndarray
    boxes: np.ndarray


def crop_to_ink(image: np.ndarray) -> np.ndarray:
    """The smallest sub-array of ``image [H, W]`` holding every non-zero pixel."""
    rows, cols = np.flatnonzero(image.any(1)), np.flatnonzero(image.any(0))
    if rows.size == 0:
        raise UserError("a digit image without ink (all zeros) cannot be placed")
    return image[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]


def resize(glyph: np.ndarray, scale: float, limit: int) -> np.ndarray:
    """``glyph [h, w]`` scaled by ``scale`` (bilinear; antialiased when shrinking), then shrunk
    if needed so that neither side exceeds ``limit``."""
    h, w = glyph.shape
    scale = min(scale, limit / max(h, w))
    size = (max(1, round(h * scale)), max(1, round(w * scale)))
    if size == (h, w):
        return glyph
    t = torch.from_numpy(np.ascontiguousarray(glyph, dtype=np.float32))[None, None]
    out = F.interpolate(t, size=size, mode="bilinear", align_corners=False, antialias=scale < 1)
    return out[0, 0].clamp_(0, 1).numpy()


class DigitPool:
    """A split's base digits ``images [N, H, W]`` (grey levels up to ``white``: kept as stored, e.g.
    MNIST's uint8, and converted one glyph at a time): ``glyph(k)`` is digit ``k`` in [0, 1], cropped
    to its ink and scaled to the ``digit_size`` box; ``by_class[c]`` lists the digits of class ``c``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, native_box: int, digit_size: int,
                 name: str = "digit", white: float = 1.0) -> None:
        self.images, self.labels, self.white = images, labels.astype(np.int64), float(white)
        self.scale, self.digit_size = digit_size / native_box, digit_size
        self.by_class = [np.flatnonzero(self.labels == c) for c in range(NUM_CLASSES)]
        missing = [c for c, idx in enumerate(self.by_class) if idx.size == 0]
        if missing:
            raise UserError(f"multi_digit: the {name} pool has no image of class(es) {missing}; every class "
                            f"needs at least one digit")

    def glyph(self, k: int) -> np.ndarray:
        return resize(crop_to_ink(self.images[k]).astype(np.float32) / self.white, self.scale, self.digit_size)


@lru_cache(maxsize=8)
def digit_pool(split: str, root: str | None, digit_size: int) -> DigitPool:
    """The pool of ``split``: MNIST under ``root``, else scikit-learn's 8×8 digits (module docstring)."""
    if root is None:
        from .digits_offline import base_images     # the same disjoint train / val / test pools
        glyphs, labels = base_images(split)
        return DigitPool(glyphs, labels, 8, digit_size, f"scikit-learn {split}")
    from ..loaders.mnist import build_mnist
    data = build_mnist("train" if split != "test" else "test", root=root, pad_to=28)
    images, labels = data.images.numpy(), data.labels.numpy()                      # uint8 [N, 28, 28], [N]
    if split != "test":
        start = len(labels) - len(labels) // MNIST_VAL_FRACTION
        cut = slice(None, start) if split == "train" else slice(start, None)
        images, labels = images[cut], labels[cut]
    return DigitPool(images, labels, DIGIT_SIZE, digit_size, f"MNIST {split} ({root})", white=255.0)


def place(sizes: Sequence[tuple[int, int]], canvas: int, rng: np.random.Generator) -> np.ndarray | None:
    """Top-left corners ``[n, 2]`` for boxes of ``sizes`` (h, w) inside ``canvas × canvas``, each
    uniform among the corners whose box misses the boxes placed before; None at a dead end."""
    boxes: list[tuple[int, int, int, int]] = []
    for h, w in sizes:
        free = np.ones((canvas - h + 1, canvas - w + 1), dtype=bool)           # candidate corners
        for t, l, bh, bw in boxes:   # corners whose box would intersect (t, l, bh, bw)
            free[max(0, t - h + 1):t + bh, max(0, l - w + 1):l + bw] = False
        options = np.flatnonzero(free)
        if options.size == 0:
            return None
        k = int(options[rng.integers(options.size)])
        boxes.append((k // free.shape[1], k % free.shape[1], h, w))
    return np.array([b[:2] for b in boxes], dtype=np.int64).reshape(-1, 2)


def check_counts(counts, split: str, canvas: int, digit_size: int, distinct: bool) -> tuple[int, ...]:
    """The digit counts of ``split`` from ``counts`` (a list for every split, or ``{split: list}``)."""
    if isinstance(counts, Mapping):
        bad = [k for k in counts if k not in SPLIT_IDS]
        if bad or split not in counts:
            raise UserError(f"multi_digit: counts must be a list of digit counts or a mapping of "
                            f"{list(SPLIT_IDS)} to lists; got {dict(counts)!r} for split {split!r}")
        counts = counts[split]
    if isinstance(counts, (int, np.integer)) and not isinstance(counts, bool):
        counts = [counts]
    if not isinstance(counts, Sequence) or isinstance(counts, str) or not counts or any(
            isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 for n in counts):
        raise UserError(f"multi_digit: counts of split {split!r} must be a non-empty list of positive ints, "
                        f"got {counts!r}")
    most = max(counts)
    if distinct and most > NUM_CLASSES:
        raise UserError(f"multi_digit: {most} digits of distinct classes requested, but there are only "
                        f"{NUM_CLASSES} classes (set distinct=False to allow repeats)")
    # a grid holds (canvas // digit_size)² boxes, but random placement jams well before: allow 2/3 of it
    room = max(1, (canvas // digit_size) ** 2 * 2 // 3)
    if most > room:
        raise UserError(f"multi_digit: {most} digits of up to {digit_size}x{digit_size} px do not fit at random "
                        f"without overlap in a {canvas}x{canvas} image; at most {room}")
    return tuple(int(n) for n in counts)


class MultiDigitDataset(GeneratedDataset):
    """``size`` images; item ``i`` holds ``counts[i % len(counts)]`` digits (module docstring)."""

    def __init__(self, split: str, seed: int, size, counts, root, image_size: int, digit_size: int,
                 distinct: bool) -> None:
        super().__init__(split, seed, split_size(size, split))
        if digit_size > image_size:
            raise UserError(f"multi_digit: digit_size {digit_size} exceeds image_size {image_size}")
        self.image_size, self.distinct = image_size, bool(distinct)
        self.counts = check_counts(counts, split, image_size, digit_size, self.distinct)
        self.pool = digit_pool(split, None if root is None else str(root), digit_size)

    def count(self, index: int) -> int:
        return self.counts[index % len(self.counts)]

    def layout(self, index: int) -> tuple[Layout, list[np.ndarray]]:
        """The classes, glyph ids and boxes of item ``index``, and the glyph images."""
        rng = sample_rng(self.seed, self.split, index)
        n = self.count(index)
        classes = rng.choice(NUM_CLASSES, size=n, replace=not self.distinct)
        ids = np.array([self.pool.by_class[c][rng.integers(self.pool.by_class[c].size)] for c in classes])
        glyphs = [self.pool.glyph(int(k)) for k in ids]
        for _ in range(MAX_RESTARTS):
            corners = place([g.shape for g in glyphs], self.image_size, rng)
            if corners is not None:
                sizes = np.array([g.shape for g in glyphs], dtype=np.int64).reshape(-1, 2)
                return Layout(classes, ids, np.concatenate([corners, sizes], 1)), glyphs
        raise RuntimeError(f"multi_digit: could not place {n} digits without overlap in {MAX_RESTARTS} tries "
                           f"(image_size {self.image_size}); use fewer or smaller digits")

    def item(self, index: int) -> tuple[Tensor, Tensor]:
        layout, glyphs = self.layout(index)
        image = np.zeros((self.image_size, self.image_size), dtype=np.float32)
        for (top, left, h, w), g in zip(layout.boxes, glyphs):
            image[top:top + h, left:left + w] = g                 # boxes are disjoint
        target = np.zeros(NUM_CLASSES, dtype=np.float32)
        target[layout.classes] = 1.0
        return torch.from_numpy(image)[None], torch.from_numpy(target)


def build(split: str, seed: int = 0, size=None, counts=None, root=None, image_size: int = IMAGE_SIZE,
          digit_size: int = DIGIT_SIZE, distinct: bool = True) -> MultiDigitDataset:
    """``size``: items (int or ``{split: n}``; default 50k / 5k / 10k). ``counts``: digits per image,
    a list (every split) or ``{split: list}`` (default train / val ``[1, 3]``, test ``[1..5]``).
    ``root``: MNIST idx files (None: scikit-learn's 8×8 digits). ``image_size``: canvas side (64).
    ``digit_size``: the box each digit is scaled into (20). ``distinct``: no repeated class."""
    return MultiDigitDataset(split, seed, DEFAULT_SIZE if size is None else size,
                             DEFAULT_COUNTS if counts is None else counts, root, image_size, digit_size, distinct)


def _describe(params: dict) -> tuple[InputSpec, int]:
    return InputSpec.image(1, params["image_size"], params["image_size"]), NUM_CLASSES


register_task(TaskInfo(
    name="multi_digit", kind="generator",
    description="NFM §4.2 multi-digit images: 64x64, 1-5 non-overlapping digits (MNIST idx files under root, "
                "else scikit-learn's 8x8 digits upscaled), multi-label target of the 10 classes present",
    describe=_describe, loss="bce", metrics=("exact_match", "label_accuracy"), class_names=DIGIT_CLASSES,
    splits=("train", "val", "test"),
    params={"seed": 0, "size": dict(DEFAULT_SIZE), "counts": {k: list(v) for k, v in DEFAULT_COUNTS.items()},
            "root": None, "image_size": IMAGE_SIZE, "digit_size": DIGIT_SIZE, "distinct": True},
    param_bounds={**GENERATOR_BOUNDS, "image_size": Bounds(lo=8, hi=1024, integer=True, note="canvas side, px"),
                  "digit_size": Bounds(lo=4, hi=1024, integer=True, note="side of a digit's box, px")},
), build)
