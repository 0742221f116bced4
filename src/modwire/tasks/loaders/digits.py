"""scikit-learn's 8×8 handwritten digits (UCI optdigits test set, 1,797 images, 10 classes).

The data ships inside scikit-learn (``sklearn.datasets.load_digits`` reads a file of the
installed package), so this task works offline on any machine with scikit-learn — it is
``make demo``'s fallback when Fashion-MNIST is not installed. Inputs are float
``[1, size, size]`` in [0, 1] (the 0-16 grey levels divided by 16), each pixel repeated
``size / 8`` times per axis (nearest-neighbour upsampling: the 8×8 values are kept
exactly), because the conv tokenizer needs an image size that is a multiple of 8 and
downsamples by 8 — an 8×8 image would become a single token.

Splits: a fixed permutation (seed 0, independent of everything else) puts 360 images
(20%) in ``test`` and the other 1,437 in ``train``; ``val`` is the same as ``test``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import DIGIT_CLASSES, InputSpec, TaskInfo, register_task
from ._common import LoaderDataset
from ...errors import UserError
from ...fields import Bounds

NUM_TEST = 360


class DigitsDataset(LoaderDataset):
    """``(float [1, size, size] in [0, 1], long)`` from uint8 ``[N, 8, 8]`` grey levels 0-16."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, size: int,
                 transform: Callable | None = None) -> None:
        super().__init__(transform)
        x = torch.from_numpy(images.astype(np.float32) / 16.0)[:, None]          # [N, 1, 8, 8]
        self.images = F.interpolate(x, size=(size, size), mode="nearest")       # [N, 1, size, size]
        self.labels = torch.from_numpy(labels.astype(np.int64))

    @property
    def targets(self) -> Tensor:
        """One class label per item: the declared way (:func:`~modwire.tasks.base.class_targets`)."""
        return self.labels

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self._out(self.images[index], self.labels[index])


def build_digits(split: str, size: int = 32, transform: Callable | None = None) -> DigitsDataset:
    """The ``train`` (1,437) or ``test`` / ``val`` (360) split, upsampled to ``size``×``size``."""
    if split not in ("train", "val", "test"):
        raise UserError(f"digits: split must be 'train', 'val' or 'test', got {split!r}")
    data = sklearn_digits("digits")
    order = np.random.RandomState(0).permutation(len(data.target))
    index = order[:NUM_TEST] if split != "train" else order[NUM_TEST:]
    return DigitsDataset(data.images[index], data.target[index], size, transform)


def _describe(params: dict) -> tuple[InputSpec, int]:
    """Grayscale ``[1, size, size]``; 10 classes."""
    return InputSpec.image(1, params["size"], params["size"]), 10


register_task(TaskInfo(
    name="digits", kind="loader",
    description="scikit-learn's 8x8 digits (offline, ships with scikit-learn), upsampled 8->32",
    describe=_describe, splits=("train", "val", "test"), params={"size": 32, "transform": None},
    class_names=DIGIT_CLASSES,
    param_bounds={"size": Bounds(lo=8, multiple_of=8, integer=True, note="the images are 8x8")},
), build_digits)


def sklearn_digits(task: str):
    """scikit-learn's bundled 8×8 digits (``load_digits()``), or an error naming ``task`` and the fix."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ModuleNotFoundError(f"{task}: the task reads the digits shipped with scikit-learn; "
                                  "pip install scikit-learn (or 'modwire[analysis]')") from None
    return load_digits()
