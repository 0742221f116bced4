"""Kuzushiji-MNIST (K-MNIST, Clanuwat et al. 2018): 10 classes of Hiragana characters, 28×28 grey.

NI §4.2 fine-tunes a model pre-trained on the digits multi-task on K-MNIST (Fig. 5a, 6).
Two official formats are read (the first found wins):

* NumPy: ``kmnist-{train,test}-{imgs,labels}.npz``, each an ``np.savez`` archive with one
  array (``arr_0``): images uint8 ``[N, 28, 28]``, labels ``[N]`` 0-9. Read with
  ``numpy.load(allow_pickle=False)``: nothing in them is unpickled.
* MNIST-style idx: ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`` (the MNIST idx reader).

Items as :mod:`.mnist`: ``(float [channels, S, S] in [0, 1], long)``, zero-padded to ``pad_to``
or resized to ``upsample_to``; NI's setting is ``upsample_to=32, channels=3`` (32×32 RGB, as
the digits it was pre-trained on).
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..base import TaskInfo, register_task
from ._common import check_binary, malformed, missing, require_root
from .mnist import PARAM_BOUNDS, PARAM_CHOICES, PARAMS, MnistDataset, _describe, idx_candidates, read_idx
from ...errors import UserError

LAYOUT = """\
<root>/                              (e.g. kmnist/; also accepted: <root>/raw/)
  kmnist-train-imgs.npz              np.savez archive, one array: uint8 [N, 28, 28]
  kmnist-train-labels.npz            one array: integer labels [N], 0-9
  kmnist-test-imgs.npz               (split "test")
  kmnist-test-labels.npz
or the MNIST-style idx files:
  train-images-idx3-ubyte[.gz]       idx: magic 0x00000803, N, 28, 28, then N*28*28 bytes
  train-labels-idx1-ubyte[.gz]       idx: magic 0x00000801, N, then N label bytes 0-9
  t10k-images-idx3-ubyte[.gz]        (split "test")
  t10k-labels-idx1-ubyte[.gz]"""


def read_npz_array(path: Path, what: str, task: str = "kmnist", layout: str = LAYOUT) -> np.ndarray:
    """The one array of an ``np.savez`` archive (``allow_pickle=False``), or a ``FormatError``
    naming the file: not a zip, no array, several arrays, an object array."""
    check_binary(task, path, "a .npz (zip) archive", layout)
    try:
        with np.load(path, allow_pickle=False) as z:
            if len(z.files) != 1:
                raise malformed(task, path, f"expected one array ({what}), found {z.files}", layout)
            return z[z.files[0]]
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise malformed(task, path, f"not a readable .npz ({type(exc).__name__}: {exc})", layout) from None
    except ValueError as exc:             # e.g. an object array, which would need unpickling
        if str(exc).startswith(task):
            raise
        raise malformed(task, path, f"unreadable array ({exc})", layout) from None


def _files(path: Path, split: str) -> tuple[str, dict[str, Path]]:
    """``("npz" | "idx", {"images": ..., "labels": ...})``: the first complete format in ``path``."""
    folders = [path, path / "raw"]
    for folder in folders:
        npz = {kind: folder / f"kmnist-{split}-{name}.npz" for kind, name in (("images", "imgs"), ("labels", "labels"))}
        if all(p.is_file() for p in npz.values()):
            return "npz", npz
    prefix = "train" if split == "train" else "t10k"
    idx = {kind: next((c for c in idx_candidates(folders, prefix, kind) if c.is_file()), None)
           for kind in ("images", "labels")}
    if all(idx.values()):
        return "idx", idx
    raise missing("kmnist", f"no complete K-MNIST {split!r} split (kmnist-{split}-imgs.npz + "
                            f"kmnist-{split}-labels.npz, or {prefix}-images/labels idx files)", LAYOUT, path)


def build_kmnist(split: str, root: Any = None, pad_to: int | None = 32, transform: Callable | None = None,
                 channels: int = 1, upsample_to: int | None = None) -> MnistDataset:
    """K-MNIST ``train`` (60,000) / ``test`` (10,000) from ``root`` (either official format)."""
    if split not in ("train", "test"):
        raise UserError(f"kmnist: split must be 'train' or 'test', got {split!r}")
    fmt, files = _files(require_root("kmnist", root, LAYOUT), split)
    if fmt == "npz":
        images, labels = (read_npz_array(files["images"], "images [N, 28, 28]"),
                          read_npz_array(files["labels"], "labels [N]"))
    else:
        images, labels = read_idx(files["images"], 3, "kmnist", LAYOUT), read_idx(files["labels"], 1, "kmnist", LAYOUT)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise malformed("kmnist", files["images"], f"images must be uint8 [N, H, W], got {images.dtype} "
                                                   f"{list(images.shape)}", LAYOUT)
    labels = labels.reshape(-1) if labels.ndim == 2 and 1 in labels.shape else labels
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise malformed("kmnist", files["labels"], f"labels must be integers [N], got {labels.dtype} "
                                                   f"{list(labels.shape)}", LAYOUT)
    if labels.shape[0] != images.shape[0]:
        raise malformed("kmnist", files["labels"], f"{labels.shape[0]} labels for {images.shape[0]} images", LAYOUT)
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise malformed("kmnist", files["labels"], f"labels must be 0-9, found {labels.min()}..{labels.max()}", LAYOUT)
    return MnistDataset(images, labels, pad_to, transform, channels=channels, upsample_to=upsample_to)


#: Kuzushiji-MNIST's classes in label order, romanised (Clanuwat et al. 2018, kmnist_classmap.csv)
KMNIST_CLASSES = ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo")

register_task(TaskInfo(
    name="kmnist", kind="loader",
    description="Kuzushiji-MNIST (10 Hiragana classes) from the official .npz or idx files; padded 28->32, "
                "or upsample_to=32, channels=3 as NI's adaptation target",
    describe=_describe, splits=("train", "test"), params=dict(PARAMS), class_names=KMNIST_CLASSES,
    param_bounds=PARAM_BOUNDS, param_choices=PARAM_CHOICES,
), build_kmnist)
