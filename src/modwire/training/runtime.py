"""What training, evaluation and analysis share: putting a batch on a device, calling a
model on it, mixed precision, loaders, the task loss, label checks and ``evaluate``.
Public, so ``modwire.analysis`` and the CLI import nothing private from the trainer."""
from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader

from ..tasks import compute_metrics
from ..tasks.metrics import IGNORE_INDEX, token_metrics, token_sums
from ..errors import UserError
from .precision import autocast

Batch = Tensor | dict[str, Tensor]


def to_device(x: Batch, device: torch.device) -> Batch:
    """A batch's inputs on ``device``: a tensor, or a dict of tensors (multimodal tasks). Copies to a
    CUDA device are asynchronous (``non_blocking``; from the pinned memory of :func:`make_loader`)."""
    non_blocking = device.type == "cuda"
    if isinstance(x, dict):
        return {k: v.to(device, non_blocking=non_blocking) for k, v in x.items()}
    return x.to(device, non_blocking=non_blocking)


def call_model(model: torch.nn.Module, x: Batch) -> Tensor:
    """``model(x)``, or ``model(**x)`` for a multimodal batch (e.g. ``{"x": image, "condition": question}``)."""
    return model(**x) if isinstance(x, dict) else model(x)


def batch_len(x: Batch) -> int:
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


PREFETCH_FACTOR = 4         # batches each loader worker keeps ready


def release_inherited_locks(worker_id: int = 0) -> None:
    """A loader worker's first act (``worker_init_fn``): close its copies of the run directory's lock
    (:data:`~modwire.training.lock.LOCK_FILE`). A forked worker inherits the training process's open
    files, an ``flock`` is held while any copy is open, and a worker outlives a killed training process
    by up to seconds (until it sees its parent gone): its copy would keep the run locked, refusing an
    immediate ``--resume``. Linux (``/proc/self/fd``); elsewhere nothing is closed."""
    from .lock import LOCK_FILE

    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return
    for fd in fds:
        try:
            if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == LOCK_FILE:
                os.close(int(fd))
        except (OSError, ValueError):
            continue


def make_loader(dataset, batch: int, sampler, info, workers: int | str, drop_last: bool, *,
                device: torch.device | None = None, collate: Callable | None = None) -> DataLoader:
    """A DataLoader with the task's collation and its own generator: a DataLoader otherwise
    draws a seed from the global RNG at every epoch start, which would make the model's
    kernel samples depend on where a run resumed.

    ``workers``: loader processes, or ``"auto"`` (``data.num_workers``; sized to the machine by
    :func:`~modwire.training.config.resolve_num_workers`). Items are functions of their index (the
    built-in generators: ``(seed, split, index)``; augmentation: ``(seed, epoch, index)``), so the
    batches do not depend on the worker count. Workers are kept between epochs
    (``persistent_workers``) unless the dataset draws by epoch (``set_epoch``: each epoch's
    workers must start from the epoch just set). ``device`` CUDA: batches in pinned memory, for
    the asynchronous copies of :func:`to_device`. ``collate``: in place of the task's (e.g. one that
    drops unreadable samples, :class:`~modwire.tasks.base.SkipBadSamples`)."""
    from ..tasks.base import EpochDataset, SkipBadSamples
    from .config import resolve_num_workers

    workers = resolve_num_workers(workers, device=device)
    inner = dataset.dataset if isinstance(dataset, SkipBadSamples) else dataset
    extra = {"persistent_workers": not isinstance(inner, EpochDataset), "prefetch_factor": PREFETCH_FACTOR,
             "worker_init_fn": release_inherited_locks} if workers > 0 else {}
    return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=drop_last, num_workers=workers,
                      collate_fn=collate or info.collate, generator=torch.Generator().manual_seed(0),
                      pin_memory=device is not None and device.type == "cuda", **extra)


def compute_loss(info, out: Tensor, y: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """The task loss: MSE for regression, cross-entropy against labels ``[B]`` or soft targets
    ``[B, C]`` (mixup / cutmix); ``bce``: the mean over the ``B·C`` labels of the binary
    cross-entropy of one sigmoid per class against multi-label 0/1 targets ``[B, C]`` (NFM §4.2);
    ``token_cross_entropy``: the mean over tokens of the cross-entropy of logits ``[B, T, V]``
    against next-token ids ``[B, T]`` (``IGNORE_INDEX`` not scored; language modelling)."""
    if info.loss == "token_cross_entropy":
        if out.dim() != y.dim() + 1 or out.shape[:-1] != y.shape:
            raise UserError(f"task {info.name!r} scores every token: expected logits [B, T, V] for targets "
                            f"{list(y.shape)}, got logits {list(out.shape)}")
        return F.cross_entropy(out.flatten(0, -2).float(), y.flatten(), ignore_index=IGNORE_INDEX,
                               label_smoothing=label_smoothing)
    if info.loss == "mse":
        if out.numel() != y.numel():   # e.g. a 20-head model on a one-target layout (fuzzy_boolean's "pair")
            raise UserError(f"task {info.name!r} gives {tuple(y.shape[1:]) or 'one'} regression target(s) per "
                            f"sample (targets {list(y.shape)}), but the model outputs {list(out.shape)}: the model's "
                            f"heads do not match the task's layout (check the task's parameters, e.g. layout)")
        return F.mse_loss(out.float(), y.float().view_as(out))
    if info.loss == "bce":
        if label_smoothing:
            raise UserError(f"optim.label_smoothing applies to cross-entropy; task {info.name!r} has a "
                            f"multi-label 'bce' loss: set it to 0, got {label_smoothing}")
        return F.binary_cross_entropy_with_logits(out.float(), y.float())
    if y.dim() == 2:
        return torch.sum(-y * F.log_softmax(out.float(), dim=-1), dim=-1).mean()
    return F.cross_entropy(out.float(), y, label_smoothing=label_smoothing)


def check_labels(y: Tensor, info, num_classes: int) -> None:
    """Class labels must lie in ``[0, num_classes)``: cross-entropy on the CPU would fail with
    an opaque IndexError and on a GPU with a device-side assert. Cheap: run on the CPU batch.
    Float labels ``[B]`` are refused too (cross-entropy would fail on their dtype); soft
    targets ``[B, C]`` (mixup / cutmix) are not labels and pass. Multi-label targets (loss
    ``bce``) must be ``[B, num_classes]`` of 0 / 1 (:func:`check_multilabel`)."""
    if info.loss == "bce":
        check_multilabel(y, info, num_classes)
    if info.loss == "token_cross_entropy":
        y = y[y != IGNORE_INDEX]     # ids [B, T]; unscored positions carry IGNORE_INDEX
        if y.numel() == 0:           # the loss would be 0/0 = NaN, silently back-propagated
            raise UserError(f"task {info.name!r} gave a batch with no scored target token (every target is "
                            f"IGNORE_INDEX={IGNORE_INDEX})")
    if info.loss not in ("cross_entropy", "token_cross_entropy") or y.numel() == 0:
        return
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        if y.dim() == 1:
            raise UserError(f"task {info.name!r} gave {y.dtype} labels, but classification expects integer "
                            f"class indices in [0, {num_classes}) (e.g. torch.long)")
        return
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= num_classes:
        bad = lo if lo < 0 else hi
        raise UserError(f"task {info.name!r} gave label {bad}, but the model has {num_classes} classes "
                        f"(labels must lie in [0, {num_classes})); check the task's data or "
                         f"model.overrides.num_classes")


def check_multilabel(y: Tensor, info, num_classes: int) -> None:
    """Multi-label targets (loss ``bce``) must be ``[B, num_classes]`` of 0 / 1."""
    if y.dim() != 2 or y.shape[1] != num_classes:
        raise UserError(f"task {info.name!r} has a multi-label 'bce' loss: targets must be [B, {num_classes}] "
                        f"(one 0/1 per class of the model), got {tuple(y.shape)}")
    if y.numel() and not bool(((y == 0) | (y == 1)).all()):
        raise UserError(f"task {info.name!r}: multi-label targets must be 0 or 1, got values in "
                        f"[{y.min().item()}, {y.max().item()}]")


def _outputs(model: torch.nn.Module, loader: DataLoader, device: torch.device, precision: str, stop, progress):
    """``(x, y, out)`` per batch with the model in eval mode (its mode restored afterwards); one
    ``None`` and the end when ``stop()`` says True between batches."""
    was_training = model.training
    model.eval()
    try:
        for i, (x, y) in enumerate(loader):
            if stop is not None and stop():
                yield None
                return
            with autocast(device, precision):
                out = call_model(model, to_device(x, device)).float()
            yield x, y, out
            if progress is not None:
                progress(i + 1, len(loader))
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, info, device: torch.device, precision: str = "fp32",
             *, stop: Callable[[], bool] | None = None,
             progress: Callable[[int, int], None] | None = None) -> dict[str, float] | None:
    """Loss and the task's metrics over a whole split.

    ``stop()`` is asked between batches: when it says True the pass is abandoned and None
    returned (an interrupt during validation is honoured within a batch). ``progress(done,
    total)`` is called after each batch. A ``token_cross_entropy`` task (language modelling) is
    scored batch by batch from additive sums (:func:`~modwire.tasks.metrics.token_sums`): its
    ``[N, T, V]`` logits are never held at once."""
    if info.loss == "token_cross_entropy":
        return _evaluate_tokens(_outputs(model, loader, device, precision, stop, progress), info)
    outs, ys, masks = [], [], {name: [] for name in info.subsets}
    for item in _outputs(model, loader, device, precision, stop, progress):
        if item is None:
            return None
        x, y, out = item
        outs.append(out.cpu())
        ys.append(y)
        for name, select in info.subsets.items():
            masks[name].append(select(x))
    out, y = torch.cat(outs), torch.cat(ys)
    check_labels(y, info, out.shape[-1])  # e.g. `eval --task` of a task with more classes than the model
    metrics: dict[str, Any] = {"loss": compute_loss(info, out, y).item(), **compute_metrics(info.metrics, out, y)}
    for name, parts in masks.items():
        m = torch.cat(parts)
        if m.any():
            metrics.update({f"{k}_{name}": v for k, v in compute_metrics(info.metrics, out[m], y[m]).items()})
    return metrics


def _evaluate_tokens(batches, info) -> dict[str, float] | None:
    """Mean token cross-entropy (``loss``) and token metrics, summed over batches."""
    sums = torch.zeros(3, dtype=torch.float64)
    for item in batches:
        if item is None:
            return None
        _, y, out = item
        check_labels(y, info, out.shape[-1])
        sums += token_sums(out, y.to(out.device))
    return token_metrics(info.metrics, sums)
