"""Tasks: a dataset per split, how the model reads its inputs, the loss and the metrics.

A task is registered once with :func:`register_task`: a :class:`TaskInfo` (what a
model needs to know to be built for it, and how it is scored) and a ``build``
function ``build(split, **params) -> torch.utils.data.Dataset`` whose items are
``(input, target)`` tensors; a multimodal task for a conditional model (NAC §2.2, App. G)
gives ``input`` as a dict ``{"x": executor input, "condition": circuit generator input}``,
which a model takes as ``model(x, condition=c)``. Built-in generators need no files and make each sample
a pure function of ``(seed, index)``, so a split is a fixed dataset; loaders read the
official on-disk formats from ``root`` and never download.
"""
from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from torch.utils.data import Dataset, Subset

LOSSES = ("cross_entropy", "mse")


def pad_collate(batch: Sequence[tuple[Tensor, Tensor]], pad_value: int = 0) -> tuple[Tensor, Tensor]:
    """Stack ``(ids [L_i], target)`` pairs into ``ids [B, max L_i]`` right-padded with ``pad_value``."""
    inputs = [b[0] for b in batch]
    length = max(1, max(x.shape[0] for x in inputs))
    out = inputs[0].new_full((len(inputs), length), pad_value)
    for row, x in zip(out, inputs):
        row[: x.shape[0]] = x
    return out, torch.stack([torch.as_tensor(b[1]) for b in batch])



@dataclass(frozen=True)
class TaskInfo:
    """What a model and a trainer need to know about a task.

    name: registry name. kind: ``"generator"`` (built in) or ``"loader"`` (reads files).
    num_classes: output width (1 for scalar regression).
    model_overrides: config fields that fit a model's tokenizer to the inputs, e.g.
        ``{"tokenizer": "embedding", "vocab_size": 16, "max_len": 2000}``, or grouped per component
        for a conditional NAC: ``{"tokenizer": {"kind": ...}, "generator": {"kind": "conditional",
        "tokenizer": {...}}}``.
    loss: one of ``LOSSES``. metrics: names from :mod:`modwire.tasks.metrics`.
    splits: the split names ``build`` accepts. params: defaults of ``build``'s keyword
        parameters (documented there). collate: optional batch collation (padding).
    subsets: named masks over a batch of inputs (``inputs [B, ...] -> bool [B]``; a dict of
        batched tensors for the dict inputs of a conditional task); every
        metric is also reported on each subset as ``<metric>_<subset>`` (e.g. Sort-of-CLEVR's
        relational and non-relational questions).
    categories: ``(label, names)``: a categorical label of each input of a batch
        (``inputs -> LongTensor [B]`` indexing ``names``) that analyses colour samples by,
        e.g. Sort-of-CLEVR's question type for NAC Fig. 6.
    """

    name: str
    kind: str
    description: str
    num_classes: int
    model_overrides: dict[str, Any]
    loss: str = "cross_entropy"
    metrics: tuple[str, ...] = ("top1",)
    splits: tuple[str, ...] = ("train", "val", "test")
    params: dict[str, Any] = field(default_factory=dict)
    collate: Callable | None = None
    subsets: dict[str, Callable] = field(default_factory=dict)
    categories: tuple[Callable, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("generator", "loader"):
            raise ValueError(f"task {self.name!r}: kind must be 'generator' or 'loader', got {self.kind!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"task {self.name!r}: loss must be one of {LOSSES}, got {self.loss!r}")


_TASKS: dict[str, tuple[TaskInfo, Callable[..., Dataset]]] = {}


def register_task(info: TaskInfo, build: Callable[..., Dataset]) -> None:
    if info.name in _TASKS:
        raise ValueError(f"task {info.name!r} is already registered")
    _TASKS[info.name] = (info, build)


def list_tasks(pattern: str = "*", kind: str | None = None) -> list[str]:
    return sorted(n for n, (i, _) in _TASKS.items() if fnmatch.fnmatch(n, pattern) and kind in (None, i.kind))


def get_task(name: str) -> TaskInfo:
    if name not in _TASKS:
        valid = list_tasks()
        close = difflib.get_close_matches(name, valid, n=3)
        raise KeyError(f"unknown task {name!r}.{f' Did you mean {close}?' if close else ''} Valid: {valid}")
    return _TASKS[name][0]


class FirstN(Subset):
    """The first ``n`` items of ``dataset``: a ``Subset`` that also forwards the dataset's other
    attributes (``set_epoch``, ``classes``, ...), so a wrapped dataset keeps working as before."""

    def __init__(self, dataset: Dataset, n: int) -> None:
        super().__init__(dataset, range(n))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "indices"):  # unpickling: no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)


def build_dataset(name: str, split: str, *, max_samples: int | None = None, **params: Any) -> Dataset:
    """The dataset of one split of task ``name``; ``params`` override the task's defaults.

    ``max_samples``: keep only the first N items (a :class:`FirstN` view; all of them when the
    split is smaller); ``None`` or 0 = all (``data.max_samples`` in a training config).
    """
    if max_samples is not None and (isinstance(max_samples, bool) or not isinstance(max_samples, int)):
        raise TypeError(f"max_samples must be an int (0 = all), got {max_samples!r} ({type(max_samples).__name__})")
    if max_samples is not None and max_samples < 0:
        raise ValueError(f"max_samples must be >= 0 (0 = all), got {max_samples}")
    info = get_task(name)
    if split not in info.splits:
        raise ValueError(f"task {name!r} has splits {list(info.splits)}, got {split!r}")
    unknown = sorted(set(params) - set(info.params))
    if unknown:
        raise KeyError(f"unknown parameter(s) {unknown} for task {name!r}; valid: {sorted(info.params)}")
    dataset = _TASKS[name][1](split, **{**info.params, **params})
    if max_samples and max_samples < len(dataset):
        return FirstN(dataset, max_samples)
    return dataset
