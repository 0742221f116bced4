"""MNIST and Fashion-MNIST from idx files (plain or gzipped).

Inputs are float ``[1, pad_to, pad_to]`` in [0, 1]: the 28×28 digit zero-padded
centrally to ``pad_to`` (default 32), because the conv tokenizer needs an image size
that is a multiple of 8 and 28 is not. ``pad_to=28`` (or ``None``) keeps 28×28 — then
use a model with another tokenizer, or override ``image_size`` accordingly.
``upsample_to=S`` resizes the digit (bilinear) to ``S×S`` instead of padding it, and
``channels=3`` repeats the grey level as RGB: NI App. C.1 "up-samples" every digit
dataset to 32×32 RGB (``upsample_to=32, channels=3``), e.g. Fashion-MNIST or K-MNIST
(:mod:`.kmnist`) as a few-shot target for a model pre-trained on the digits multi-task.
Fashion-MNIST's root defaults to ``/usr/share/datasets/fashion-mnist/``, where
Debian's package ``dataset-fashion-mnist`` installs the four ``*.gz`` files
(``$MODWIRE_SYSTEM_DATASETS/fashion-mnist/`` when that variable is set: :func:`._common.system_dataset`).

idx format: a big-endian header ``0x00 0x00 <type> <ndim>`` then ``ndim`` uint32
sizes, then the data; only unsigned bytes (type 0x08) are accepted, images with 3
dimensions (magic 0x00000803) and labels with 1 (0x00000801).
"""
from __future__ import annotations

import gzip
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import DIGIT_CLASSES, InputSpec, TaskInfo, register_task
from ._common import (LoaderDataset, check_binary, first_existing, malformed, malformed_reason, require_root,
                      system_dataset)
from ...errors import UserError
from ...fields import Bounds, Choices

LAYOUT = """\
<root>/                                (also accepted: <root>/raw/, <root>/{name}/raw/)
  train-images-idx3-ubyte[.gz]         idx: magic 0x00000803, N, 28, 28, then N*28*28 bytes
  train-labels-idx1-ubyte[.gz]         idx: magic 0x00000801, N, then N label bytes 0-9
  t10k-images-idx3-ubyte[.gz]          (split "test")
  t10k-labels-idx1-ubyte[.gz]"""

IDX_MAGIC = {3: 0x00000803, 1: 0x00000801}


def debian_fashion_mnist() -> Path:
    """Where Debian's package ``dataset-fashion-mnist`` installs the four ``.gz`` files (Fashion-MNIST's
    default root; moved by ``$MODWIRE_SYSTEM_DATASETS``)."""
    return system_dataset("fashion-mnist")


def _layout(task: str) -> str:
    if task == "fashion_mnist":
        return (LAYOUT.replace("{name}", "FashionMNIST") + f"\n(root=None: {debian_fashion_mnist()}, where Debian's "
                "package dataset-fashion-mnist installs the four .gz files, if it exists)")
    return LAYOUT.replace("{name}", "MNIST")


def read_idx(path: Path, ndim: int, task: str = "mnist", layout: str | None = None) -> np.ndarray:
    """The uint8 array of an idx file (gzip detected by its magic bytes, not the name); errors
    show ``layout`` (default: the MNIST / Fashion-MNIST layout of ``task``)."""
    layout = layout or _layout(task)
    check_binary(task, path, "an idx file (raw or gzipped)", layout)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise malformed(task, path, f"broken gzip stream ({exc})", layout) from None
    if len(raw) < 4 + 4 * ndim:
        raise malformed(task, path, f"{len(raw)} bytes, shorter than an idx header", layout)
    magic = int.from_bytes(raw[:4], "big")
    if magic != IDX_MAGIC[ndim]:
        raise malformed(task, path, f"idx magic 0x{magic:08x}, expected 0x{IDX_MAGIC[ndim]:08x} "
                                    f"(unsigned bytes, {ndim} dimension{'s' if ndim > 1 else ''})", layout)
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    body = memoryview(raw)[4 + 4 * ndim:]
    size = int(np.prod(dims))
    if len(body) != size:
        what = "truncated" if len(body) < size else "has trailing bytes"
        raise malformed(task, path, f"{what}: header says {dims} = {size} bytes of data, found {len(body)}",
                        layout)
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


def read_first_idx(task: str, candidates: list[Path], ndim: int, layout: str, where: Path,
                   what: str) -> tuple[Path, np.ndarray]:
    """``(path, array)`` of the first of ``candidates`` that is a readable idx file. Candidates that
    exist but cannot be read (empty, an HTML page, a wrong magic, truncated) are skipped with a
    warning naming each and why; when none is readable the error names every one (a single one: its
    own error); when none exists, the ``LayoutError`` lists every path tried."""
    present = [c for c in candidates if c.is_file()]
    if not present:
        first_existing(task, what, candidates, layout, where)      # raises, listing every path tried
    skipped: list[tuple[Path, UserError]] = []
    for path in present:
        try:
            array = read_idx(path, ndim, task, layout)
        except UserError as exc:
            skipped.append((path, exc))
            continue
        if skipped:
            warnings.warn(f"{task}: read {path}, skipping the unreadable {what}(s) found before it: "
                          + "; ".join(f"{p} ({malformed_reason(e)})" for p, e in skipped), stacklevel=4)
        return path, array
    if len(skipped) == 1:
        raise skipped[0][1]
    raise malformed(task, skipped[0][0], f"none of the {len(skipped)} candidates for the {what} is readable: "
                    + "; ".join(f"{p}: {malformed_reason(e)}" for p, e in skipped), layout)


def idx_candidates(folders: list[Path], prefix: str, kind: str) -> list[Path]:
    """Every name an idx file of ``prefix`` (train / t10k) and ``kind`` (images / labels) may have."""
    dims = 3 if kind == "images" else 1
    return [folder / f"{prefix}-{kind}{sep}idx{dims}-ubyte{gz}" for folder in folders
            for sep in ("-", ".")  # "train-images-idx3-ubyte" and the "train-images.idx3-ubyte" variant
            for gz in ("", ".gz")]


class MnistDataset(LoaderDataset):
    """uint8 images ``[N, 28, 28]`` → ``(float [channels, S, S] in [0, 1], long)``: centrally
    zero-padded to ``S = pad_to``, or (``upsample_to``) resized bilinearly to ``S = upsample_to``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, pad_to: int | None,
                 transform: Callable | None = None, *, channels: int = 1, upsample_to: int | None = None) -> None:
        super().__init__(transform)
        self.images = torch.from_numpy(images.copy())
        self.labels = torch.from_numpy(labels.astype(np.int64))
        self.channels, self.upsample_to = int(channels), upsample_to
        h, w = images.shape[1:]
        size = pad_to or max(h, w)
        if size < max(h, w) and upsample_to is None:
            raise UserError(f"pad_to={pad_to} is smaller than the images ({h}x{w})")
        top, left = (size - h) // 2, (size - w) // 2
        self.pad = (0,) * 4 if upsample_to else (left, size - w - left, top, size - h - top)  # F.pad: W then H

    @property
    def targets(self) -> Tensor:
        """One class label per item: the declared way (:func:`~modwire.tasks.base.class_targets`)."""
        return self.labels

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x = self.images[index].float().div_(255.0)[None]                      # [1, 28, 28]
        if any(self.pad):
            x = F.pad(x, self.pad)
        if self.upsample_to:
            x = upsample(x, self.upsample_to)
        return self._out(x.expand(self.channels, -1, -1).contiguous(), self.labels[index])


def upsample(x: Tensor, size: int) -> Tensor:
    """Bilinear resize of ``x [C, H, W]`` to ``[C, size, size]`` (antialiased when shrinking)."""
    if tuple(x.shape[-2:]) == (size, size):
        return x
    return F.interpolate(x[None], size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0]


def _build(task: str, split: str, root: Any, pad_to: int | None, transform: Callable | None,
           channels: int = 1, upsample_to: int | None = None) -> MnistDataset:
    layout = _layout(task)
    path = require_root(task, root, layout)
    folders = [path, path / "raw", path / ("FashionMNIST" if task == "fashion_mnist" else "MNIST") / "raw"]
    prefix = "train" if split == "train" else "t10k"
    files, arrays = {}, {}
    for kind, ndim in (("images", 3), ("labels", 1)):
        files[kind], arrays[kind] = read_first_idx(task, idx_candidates(folders, prefix, kind), ndim, layout, path,
                                                   f"{prefix}-{kind}-idx{ndim}-ubyte[.gz] file")
    images, labels = arrays["images"], arrays["labels"]
    if images.shape[0] != labels.shape[0]:
        raise malformed(task, files["labels"], f"{labels.shape[0]} labels for {images.shape[0]} images", layout)
    if labels.size and labels.max() > 9:
        raise malformed(task, files["labels"], f"labels must be 0-9, found {labels.max()}", layout)
    return MnistDataset(images, labels, pad_to, transform, channels=channels, upsample_to=upsample_to)


def build_mnist(split: str, root: Any = None, pad_to: int | None = 32, transform: Callable | None = None,
                channels: int = 1, upsample_to: int | None = None):
    """MNIST ``train`` (60,000) / ``test`` (10,000) digits, padded to ``pad_to`` (or resized to
    ``upsample_to``), with ``channels`` 1 or 3."""
    return _build("mnist", split, root, pad_to, transform, channels, upsample_to)


def build_fashion_mnist(split: str, root: Any = None, pad_to: int | None = 32, transform: Callable | None = None,
                        channels: int = 1, upsample_to: int | None = None):
    """Fashion-MNIST ``train`` / ``test``; ``root=None`` uses Debian's install path if it exists."""
    if root is None and debian_fashion_mnist().is_dir():
        root = debian_fashion_mnist()
    return _build("fashion_mnist", split, root, pad_to, transform, channels, upsample_to)


def _describe(params: dict) -> tuple[InputSpec, int]:
    """Digits ``[channels, S, S]``: ``S = upsample_to``, else ``pad_to`` (28 when None); 10 classes."""
    side = params.get("upsample_to") or (28 if params["pad_to"] is None else params["pad_to"])
    return InputSpec.image(params.get("channels", 1), side, side), 10


PARAMS = {"root": None, "pad_to": 32, "transform": None, "channels": 1, "upsample_to": None}
#: The rules of :data:`PARAMS` (``TaskInfo.param_bounds`` / ``param_choices``), shared with K-MNIST.
PARAM_BOUNDS = {"upsample_to": Bounds(lo=1, integer=True, note="or None: pad to pad_to instead")}
PARAM_CHOICES = {"channels": Choices((1, 3), note="1: grey, 3: the grey level repeated as RGB")}


#: Fashion-MNIST's classes in label order (Xiao et al. 2017)
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

register_task(TaskInfo(
    name="mnist", kind="loader", description="MNIST digits from idx files, zero-padded 28->32",
    describe=_describe, splits=("train", "test"), params=dict(PARAMS), class_names=DIGIT_CLASSES,
    param_bounds=PARAM_BOUNDS, param_choices=PARAM_CHOICES,
), build_mnist)
register_task(TaskInfo(
    name="fashion_mnist", kind="loader",
    description="Fashion-MNIST from idx files (default root /usr/share/datasets/fashion-mnist if present, "
                "or $MODWIRE_SYSTEM_DATASETS/fashion-mnist), padded 28->32",
    describe=_describe, splits=("train", "test"), params=dict(PARAMS), class_names=FASHION_MNIST_CLASSES,
    param_bounds=PARAM_BOUNDS, param_choices=PARAM_CHOICES,
), build_fashion_mnist)
