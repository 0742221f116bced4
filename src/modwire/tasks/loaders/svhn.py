"""SVHN (Netzer et al. 2011), cropped digits, from the official ``*_32x32.mat`` files.

Each file holds ``X``: uint8 ``[32, 32, 3, N]`` (height, width, RGB, sample) and ``y``:
``[N, 1]`` labels 1-10, where 10 means the digit 0 (labels 0-9 are also accepted, as in
repackaged copies). Items: ``(float [3, 32, 32] in [0, 1], long label 0-9)``. Splits:
``train`` (73,257), ``test`` (26,032), ``extra`` (531,131).

The files are MATLAB v5 files, read with ``scipy.io.loadmat``, which parses the MAT format
and never unpickles; a MATLAB v7.3 (HDF5) file is refused with a message.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..base import DIGIT_CLASSES, InputSpec, TaskInfo, register_task
from ._common import LoaderDataset, first_existing, malformed, require_root, text_problem
from ...errors import UserError

LAYOUT = """\
<root>/                     (e.g. svhn/; also accepted: <root>/svhn/)
  train_32x32.mat           MATLAB v5: X uint8 [32, 32, 3, N] (H, W, RGB, sample), y [N, 1] labels 1-10 (10 = digit 0)
  test_32x32.mat            (split "test")
  extra_32x32.mat           (split "extra", optional)"""

SPLITS = ("train", "test", "extra")


def read_svhn_mat(path: Path, task: str = "svhn", layout: str = LAYOUT) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N, 3, 32, 32], labels int64 [N] in 0-9)`` of one official SVHN ``.mat``
    file, or a ``FormatError`` naming the file, the problem and the expected layout."""
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    with open(path, "rb") as f:
        head = f.read(128)
    if head.startswith(b"MATLAB 7.3"):                                   # the text header of an HDF5-based file
        raise malformed(task, path, "a MATLAB v7.3 (HDF5) file; the official SVHN files are MATLAB v5 "
                                    "(re-save with -v7, or use the official download)", layout)
    if not head.startswith(b"MATLAB 5.0 MAT-file"):                      # v5 files open with this text header
        raise malformed(task, path, text_problem(head, "a MATLAB v5 .mat file")
                        or "not a MATLAB v5 .mat file (no 'MATLAB 5.0 MAT-file' header)", layout)
    try:
        mat = loadmat(path, variable_names=("X", "y"))
    except (MatReadError, ValueError, TypeError, OSError, EOFError, IndexError, NotImplementedError) as exc:
        raise malformed(task, path, f"not a readable MATLAB file ({type(exc).__name__}: {exc})", layout) from None
    missing_keys = [k for k in ("X", "y") if k not in mat]
    if missing_keys:
        raise malformed(task, path, f"no variable(s) {missing_keys}", layout)
    x, y = mat["X"], np.asarray(mat["y"]).reshape(-1)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.dtype != np.uint8:
        raise malformed(task, path, f"X must be uint8 [32, 32, 3, N], got {x.dtype} {list(x.shape)}", layout)
    if y.shape[0] != x.shape[3]:
        raise malformed(task, path, f"{y.shape[0]} labels in y for {x.shape[3]} images in X", layout)
    if y.size and (not np.issubdtype(y.dtype, np.number) or y.min() < 0 or y.max() > 10 or (y != np.round(y)).any()):
        raise malformed(task, path, f"y must hold labels 1-10 (10 = digit 0), found values "
                                    f"{np.unique(y)[:12].tolist()}", layout)
    labels = y.astype(np.int64) % 10                                   # 10 → 0
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), labels       # [32, 32, 3, N] → [N, 3, 32, 32]


class SvhnDataset(LoaderDataset):
    """uint8 ``[N, 3, 32, 32]`` → ``(float [3, 32, 32] in [0, 1], long)``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.images, self.labels = torch.from_numpy(images), torch.from_numpy(labels)

    @property
    def targets(self) -> Tensor:
        """One class label per item: the declared way (:func:`~modwire.tasks.base.class_targets`)."""
        return self.labels

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self._out(self.images[index].float().div_(255.0), self.labels[index])


def svhn_file(root: Any, split: str, task: str = "svhn", layout: str = LAYOUT) -> Path:
    if split not in SPLITS:
        raise UserError(f"{task}: SVHN has the splits {list(SPLITS)}, got {split!r}")
    path = require_root(task, root, layout)
    name = f"{split}_32x32.mat"
    return first_existing(task, f"SVHN file {name}", [path / name, path / "svhn" / name], layout, path)


def build_svhn(split: str, root: Any = None, transform: Callable | None = None) -> SvhnDataset:
    """The SVHN ``split`` (``train`` / ``test`` / ``extra``) from ``root/<split>_32x32.mat``."""
    return SvhnDataset(*read_svhn_mat(svhn_file(root, split)), transform)


register_task(TaskInfo(
    name="svhn", kind="loader",
    description="SVHN cropped digits from the official *_32x32.mat files, [3, 32, 32] in [0,1]; label 10 -> 0",
    num_classes=10, inputs=InputSpec.image(3, 32, 32), splits=SPLITS, params={"root": None, "transform": None},
    class_names=DIGIT_CLASSES,
), build_svhn)
