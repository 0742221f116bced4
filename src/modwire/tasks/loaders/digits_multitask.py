"""NI's digits multi-task (NI §4.2, App. C.1): SVHN, MNIST-M and MNIST with shared labels.

"The Digits dataset is a concatenation of three datasets of labelled images of digits: SVHN,
MNISTM, and MNIST. All images are up-sampled to RGB images of size 32 × 32 ... we also
preserve information about which of the constituent datasets a sampled image originates
from." Each dataset has its own CLS token and classification head (NI §4.2).

Item: ``({"x": float [3, 32, 32] in [0, 1], "task": LongTensor []}, label)`` where ``task``
is the source dataset, fixed by name: 0 SVHN, 1 MNIST-M, 2 MNIST (``SOURCES``), and the
label a digit 0-9. ``TaskInfo``: ``inputs={"x": InputSpec.image(3, 32, 32), "task":
InputSpec.index(3)}``, ``heads = 3``, ``num_classes = 10``; a model with one CLS token per
dataset scores each sample with the head of its ``task`` (``model(x, task=task) -> [B, 10]``).

Items are the sources' items in order (all of SVHN, then MNIST-M, then MNIST). Splits:
``train`` (NI: 73,257 + 60,000 + 60,000 = 193,257) and ``test`` (26,032 + 10,000 + 10,000 =
46,032, NI's "validation set"); ``val`` is ``test``. Each source reads its official files
(:mod:`.svhn`, :mod:`.mnistm`, :mod:`.mnist`) from its own root; ``sources`` may name a
subset (the task ids stay those of ``SOURCES``, so the heads keep their meaning). Training
images are augmented with RandAugment (NI App. C): ``data.augment: randaugment``.
``digits_multitask_offline`` (:mod:`modwire.tasks.synthetic.digits_offline`) is a stand-in
that needs no files.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..base import DIGIT_CLASSES, InputSpec, TaskInfo, class_targets, register_task
from .mnist import build_mnist
from .mnistm import build_mnist_m
from .svhn import build_svhn
from ...errors import UserError

SOURCES = ("svhn", "mnist_m", "mnist")          # the task id of a source is its position here
INPUTS = {"x": InputSpec.image(3, 32, 32), "task": InputSpec.index(len(SOURCES))}


def per_source(names: Sequence[str]) -> dict[str, Callable]:
    """``{name: inputs -> bool [B]}``, the samples of each source: metrics per dataset (NI Table 4,
    e.g. ``top1_svhn``)."""
    return {name: (lambda inputs, k=k: inputs["task"] == k) for k, name in enumerate(names)}


class MultiTaskDataset(Dataset):
    """The items of several single-task datasets in order, each input ``x`` paired with its
    dataset's id: ``({"x": x, "task": LongTensor []}, label)``. ``transform`` applies to ``x``."""

    def __init__(self, parts: Sequence[tuple[int, Dataset]], transform: Callable | None = None) -> None:
        self.parts, self.transform = list(parts), transform
        self.ends = torch.tensor([len(d) for _, d in self.parts]).cumsum(0).tolist()  # exclusive end of each part

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    @property
    def targets(self) -> Tensor | None:
        """The digit of every item, when every source declares its labels (:func:`~..base.class_targets`),
        else None (``data.max_samples`` then takes the first items)."""
        parts = [class_targets(d) for _, d in self.parts]
        if any(p is None for p in parts):
            return None
        return torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.long)

    def __getitem__(self, index: int) -> tuple[dict[str, Tensor], Tensor]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} items")
        index %= n
        k = bisect_right(self.ends, index)
        task, dataset = self.parts[k]
        x, y = dataset[index - (self.ends[k - 1] if k else 0)]
        if self.transform is not None:
            x = self.transform(x)
        return {"x": x, "task": torch.tensor(task, dtype=torch.long)}, y

    def sample_path(self, index: int):
        """The file of item ``index`` when its source reads one per item (MNIST-M), else None."""
        k = bisect_right(self.ends, index % len(self))
        dataset = self.parts[k][1]
        inner = index % len(self) - (self.ends[k - 1] if k else 0)
        return dataset.sample_path(inner) if hasattr(type(dataset), "sample_path") else None

    def task_of(self, index: int) -> int:
        """The dataset id of item ``index`` (without reading it)."""
        return self.parts[bisect_right(self.ends, index % len(self))][0]


def build_digits_multitask(split: str, svhn_root: Any = None, mnist_m_root: Any = None, mnist_root: Any = None,
                           sources: Sequence[str] = SOURCES, transform: Callable | None = None) -> MultiTaskDataset:
    """The ``split`` of every source in ``sources``, each from its root (official formats)."""
    if split not in ("train", "val", "test"):
        raise UserError(f"digits_multitask: split must be 'train', 'val' or 'test' (val = test), got {split!r}")
    chosen = list(sources) if not isinstance(sources, str) else [sources]     # each one of SOURCES: param_choices
    if not chosen or len(set(chosen)) != len(chosen):
        raise UserError(f"digits_multitask: sources must be distinct names from {list(SOURCES)}, got {sources!r}")
    split = "test" if split == "val" else split
    build = {"svhn": lambda: build_svhn(split, svhn_root),
             "mnist_m": lambda: build_mnist_m(split, mnist_m_root),
             "mnist": lambda: build_mnist(split, mnist_root, upsample_to=32, channels=3)}
    return MultiTaskDataset([(SOURCES.index(s), build[s]()) for s in SOURCES if s in chosen], transform)


register_task(TaskInfo(
    name="digits_multitask", kind="loader",
    description="NI's digits multi-task (SVHN .mat, MNIST-M folders, MNIST idx; each its own root): "
                "{'x': [3, 32, 32], 'task': 0 SVHN / 1 MNIST-M / 2 MNIST}, 3 heads of 10 classes",
    num_classes=10, inputs=INPUTS, heads=len(SOURCES), splits=("train", "val", "test"), class_names=DIGIT_CLASSES,
    subsets=per_source(SOURCES),
    params={"svhn_root": None, "mnist_m_root": None, "mnist_root": None, "sources": SOURCES, "transform": None},
    param_choices={"sources": SOURCES},         # each element
), build_digits_multitask)
