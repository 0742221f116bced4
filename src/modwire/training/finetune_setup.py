"""What a fine-tuning run is built from: the model of ``finetune.init`` (:func:`pretrained_model`),
the parameter sets that train (:func:`select_trainable`) and the k-shot n-way data
(:func:`few_shot_splits`).

The trainer builds every run with these (``build_run``, ``build_datasets``). Running the seeds
of ``modwire finetune`` and its config are :mod:`modwire.training.finetune`'s, which calls the
trainer; these pieces live apart from it so that the trainer does not import a module that
imports the trainer.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from ..models.capabilities import FineTunable, GrowsFunctions
from ..seeding import numpy_rng
from .config import TrainConfig
from ..errors import UserError, UserTypeError

__all__ = ["FEW_SHOT_STREAM", "FewShotSubset", "dataset_labels", "draw_few_shot", "few_shot_indices",
           "few_shot_splits", "pretrained_model", "same_classes", "select_trainable"]

FEW_SHOT_STREAM = 0x46455753    # derive_seed(seed, FEW_SHOT_STREAM): the few-shot draw's own stream


# ----------------------------------------------------------------------------- the model

def pretrained_model(cfg: TrainConfig, info) -> torch.nn.Module:
    """The model of ``finetune.init`` (its ``config.json`` and weights, never unpickled), with new
    task outputs when ``finetune.new_task``: ``num_classes`` = ``data.few_shot.ways`` or the task's
    class count, ``heads`` = the task's heads; then ``model.add_functions(n)`` when
    ``finetune.add_functions`` (a Neural Interpreter). Without ``new_task`` the model's class count
    must fit the task (the number of heads is the model's to check: configs name it apart).
    Random draws (a new head, new functions) come from the global RNG the trainer seeded."""
    from .checkpoint import choose_checkpoint
    from .ema import checkpoint_model
    from .kinds import kind_of_model

    if not Path(cfg.finetune.init).exists():
        raise FileNotFoundError(f"config key 'finetune.init': no run directory or checkpoint at {cfg.finetune.init}")
    ckpt, _ = choose_checkpoint(cfg.finetune.init)     # FileNotFoundError names the expected layout
    model, _ = checkpoint_model(ckpt, cfg.finetune.weights)   # what its validation scored, unless asked
    kind = kind_of_model(type(model))           # the run-kind table (kinds.py)
    if not kind.task_outputs:
        raise UserError(f"config key 'finetune.init': {cfg.finetune.init} holds a {kind.noun} model, which has no "
                        f"task outputs to fine-tune. {kind.instead}")
    heads = getattr(info, "heads", 1)
    classes = cfg.data.few_shot.ways or info.num_classes
    if cfg.finetune.new_task:
        if not isinstance(model, FineTunable):
            raise UserTypeError(f"config key 'finetune.new_task': a {model.config.model_type!r} model has no new_task()")
        model.new_task(classes, heads=heads)
    if cfg.finetune.add_functions:         # NI §4.2, Fig. 5b: train them with finetune.train=[signatures_codes]
        if not isinstance(model, GrowsFunctions):
            raise UserTypeError(f"config key 'finetune.add_functions': a {model.config.model_type!r} model has no "
                                f"functions to add (a Neural Interpreter has)")
        model.add_functions(cfg.finetune.add_functions)
    if not cfg.finetune.new_task and model.num_classes != classes:
        raise UserError(f"the model of finetune.init ({ckpt}) has {model.num_classes} outputs per head, but task "
                        f"{info.name!r} needs {classes}: set finetune.new_task=true for new outputs")
    return model


def select_trainable(model: torch.nn.Module, names: Sequence[str]) -> tuple[int, int]:
    """Freeze every parameter outside the sets ``names`` (``model.parameter_sets()``); a parameter
    frozen already (e.g. a NAC's fixed graph signatures) stays frozen. Returns ``(trainable,
    total)`` parameter counts."""
    sets = model.parameter_sets() if isinstance(model, FineTunable) else {"all": ("",)}
    unknown = [n for n in names if n not in sets]
    if unknown:
        raise UserError(f"config key 'finetune.train': unknown parameter set(s) {unknown} for a "
                        f"{getattr(model.config, 'model_type', type(model).__name__)!r} model; valid: {sorted(sets)}")
    prefixes = tuple(p for n in names for p in sets[n])
    for set_name in names:
        if not any(name.startswith(sets[set_name]) for name, _ in model.named_parameters()):
            raise UserError(f"config key 'finetune.train': the parameter set {set_name!r} holds no parameter of "
                            f"this model (prefixes {list(sets[set_name])})")
    for name, p in model.named_parameters():
        p.requires_grad_(p.requires_grad and name.startswith(prefixes))
    return (sum(p.numel() for p in model.parameters() if p.requires_grad),
            sum(p.numel() for p in model.parameters()))


# ----------------------------------------------------------------------------- few-shot data

class FewShotSubset(Dataset):
    """The items ``indices`` of ``dataset`` with labels renumbered by ``class_ids`` (the kept
    classes in increasing order: ``class_ids[j]`` becomes ``j``). ``classes``: their names, from the
    dataset's ``classes`` (its labels as strings where it has none). Other attributes
    (``set_epoch``, ...) are the dataset's; its ``labels`` / ``targets`` are not exposed."""

    def __init__(self, dataset: Dataset, indices: Sequence[int], class_ids: Sequence[int]) -> None:
        self.dataset, self.indices, self.class_ids = dataset, list(indices), [int(c) for c in class_ids]
        self._new_label = {c: j for j, c in enumerate(self.class_ids)}
        names = getattr(dataset, "classes", None)
        self.classes = [str(names[c]) if names is not None else str(c) for c in self.class_ids]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        x, y = self.dataset[self.indices[i]]
        return x, torch.tensor(self._new_label[int(y)])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "indices", "class_ids", "classes", "labels", "targets",
                                             "_new_label"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def dataset_labels(dataset: Dataset, what: str) -> Tensor:
    """The class label of every item ``[len(dataset)]`` (long): from a ``labels`` / ``targets``
    attribute when the dataset (or, for a ``Subset`` such as ``data.max_samples``' ``FirstN``, the
    dataset under it) keeps one, else read item by item."""
    kept = _label_attribute(dataset)
    if kept is not None and len(kept) == len(dataset):
        return kept
    if isinstance(dataset, Subset) and _label_attribute(dataset.dataset) is not None:
        return _label_attribute(dataset.dataset)[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    ys = [torch.as_tensor(dataset[i][1]) for i in range(len(dataset))]
    bad = next((y for y in ys if y.ndim != 0 or y.is_floating_point()), None)
    if bad is not None:
        raise UserError(f"data.few_shot: the {what} split's targets are {bad.dtype} of shape {tuple(bad.shape)}, "
                        f"expected one integer class label per sample")
    return torch.stack(ys).long() if ys else torch.zeros(0, dtype=torch.long)


def _label_attribute(dataset: Dataset) -> Tensor | None:
    for attr in ("labels", "targets"):
        v = getattr(dataset, attr, None)
        v = torch.as_tensor(v) if isinstance(v, (Tensor, list)) else None
        if v is not None and v.ndim == 1 and not v.is_floating_point():
            return v.long()
    return None


def few_shot_indices(labels: Tensor, *, shots: int, ways: int, seed: int) -> tuple[list[int], list[int]]:
    """``(indices, classes)``: ``ways`` classes (0 = all) drawn from those in ``labels`` and
    ``shots`` items of each (0 = all), both drawn by ``seed`` alone (``derive_seed(seed,
    FEW_SHOT_STREAM)``); both lists in increasing order."""
    rng = numpy_rng(seed, FEW_SHOT_STREAM)
    present = sorted(labels.unique().tolist())
    if ways > len(present):
        raise UserError(f"config key 'data.few_shot.ways': got {ways}, but the training split holds "
                        f"{len(present)} classes")
    classes = sorted(int(c) for c in rng.choice(present, size=ways, replace=False)) if ways else present
    chosen: list[int] = []
    for c in classes:
        idx = (labels == c).nonzero().flatten().tolist()
        if shots > len(idx):
            raise UserError(f"config key 'data.few_shot.shots': got {shots}, but class {c} has only {len(idx)} "
                            f"training samples")
        chosen += [int(i) for i in rng.choice(idx, size=shots, replace=False)] if shots else idx
    return sorted(chosen), classes


def few_shot_splits(cfg: TrainConfig, info, train_set: Dataset, val_set: Dataset) -> tuple[Dataset, Dataset]:
    """``data.few_shot`` applied: the k-shot n-way training subset of the run's seed, and the
    validation split cut to the same classes, renumbered alike (:class:`FewShotSubset`)."""
    indices, classes = draw_few_shot(cfg, info, train_set)
    return FewShotSubset(train_set, indices, classes), same_classes(val_set, classes, cfg.data.val_split)


def same_classes(dataset: Dataset, classes: Sequence[int], split: str) -> FewShotSubset:
    """Every item of ``dataset`` whose label is in ``classes``, renumbered."""
    keep = torch.isin(dataset_labels(dataset, split), torch.tensor(classes)).nonzero().flatten().tolist()
    return FewShotSubset(dataset, keep, classes)


def draw_few_shot(cfg: TrainConfig, info, train_set: Dataset) -> tuple[list[int], list[int]]:
    """``(indices, classes)`` of ``data.few_shot`` in ``train_set``, drawn by the run's seed."""
    fs = cfg.data.few_shot
    if info.loss != "cross_entropy" or getattr(info, "heads", 1) != 1:
        raise UserError(f"config key 'data.few_shot': task {info.name!r} is not single-head classification "
                        f"(loss {info.loss!r}, heads {getattr(info, 'heads', 1)}): k-shot n-way subsets need "
                        f"one class label per sample")
    if fs.ways > info.num_classes:
        raise UserError(f"config key 'data.few_shot.ways': got {fs.ways}, but task {info.name!r} has "
                        f"{info.num_classes} classes")
    return few_shot_indices(dataset_labels(train_set, cfg.data.train_split), shots=fs.shots, ways=fs.ways,
                            seed=cfg.seed)
