"""The default run kind, supervised learning: the task's loss (plus the model's weighted auxiliary
losses) on micro-batches of the training split, validation on ``data.val_split`` at each epoch's end.

Its :class:`Supervised` program is what :func:`modwire.training.trainer.train` steps for every model
without another kind's capability (:mod:`modwire.training.kinds`); :func:`build_supervised_run`
builds it. Also here, because only this kind has them: the model fitted to the task's inputs
(:func:`model_overrides_for_task`), the datasets (``data.max_samples``, few-shot subsets),
augmentation and mixup (``data.augment``, ``data.mixup``), gradient accumulation, the fp16 scaler,
the EMA update and the non-finite guard's view of each step.

The objective, its epoch hook and its parameter groups are :class:`~modwire.training.objective.Objective`
(public, for other training loops): the task loss plus ``Σ weight · loss`` over the auxiliary losses the
model reports (e.g. NAC's graph regularizer, App. A), each logged as ``aux/<name>``. The epoch hook is
called at each training epoch's start, not on a resume part-way through an epoch.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import Tensor
from torch.utils.data import DataLoader

from ..errors import ConfigWarning, UserError
from ..fields import is_import_path
from ..models import create_model, get_config
from ..models.base import PretrainedModel
from ..models.config import deep_merge
from ..models.inputs import named_inputs
from ..tasks import build_dataset, describe_task, get_task
from ..tasks.base import EpochDataset, SkipBadSamples
from ..tasks.metrics import LOWER_IS_BETTER
from . import distributed
from .config import TrainConfig
from .divergence import grad_norm
from .ema import WeightEMA
from .finetune_setup import few_shot_splits, pretrained_model, select_trainable
from .kinds import RunKind, register_kind
from .mixup import make_mixer, mix
from .objective import Objective
from .optim import build_optimizer, build_scheduler
from .run import TrainingRun
from .precision import autocast, check_device, loss_scaler
from .runtime import batch_len, call_model, check_labels, evaluate, make_loader, to_device
from .signals import StopSignals
from .state import TrainState

__all__ = ["SUPERVISED", "Supervised", "apply_augmentation", "build_datasets", "build_model_for_task",
           "build_supervised_run", "model_overrides_for_task"]


def build_model_for_task(cfg: TrainConfig) -> PretrainedModel:
    """The preset ``cfg.model.name`` with :func:`model_overrides_for_task`."""
    return create_model(cfg.model.name, **model_overrides_for_task(cfg))


def model_overrides_for_task(cfg: TrainConfig) -> dict[str, Any]:
    """The preset's input layers fitted to the task's description at ``cfg.data.params``
    (``ModelConfig.input_overrides``), then the user's overrides, which win (nested settings such
    as ``tokenizer`` merge: a user's ``tokenizer.max_len`` keeps the tokenizer kind the task's inputs
    call for). A ``num_classes`` other than the task's is refused. Validates the task, its params and the
    whole model config; builds no weights."""
    info = describe_task(cfg.data.task, cfg.data.params)
    preset = get_config(cfg.model.name)
    user = OmegaConf.to_container(cfg.model.overrides) if OmegaConf.is_config(cfg.model.overrides) \
        else dict(cfg.model.overrides)
    fitted = preset.normalize(preset.input_overrides(info.inputs, info.num_classes, info.heads))
    mine = preset.normalize(user)
    if "num_classes" in fitted and mine.get("num_classes", fitted["num_classes"]) != fitted["num_classes"]:
        raise UserError(f"config key 'model.overrides.num_classes': got {mine['num_classes']!r}, but task "
                        f"{info.name!r} needs {fitted['num_classes']} outputs from model {cfg.model.name!r} (leave it "
                        f"out: the task sets it; 0, timm's model without classifier, is for features, not training)")
    overrides = deep_merge(fitted, mine)
    given, taken = sorted(named_inputs(info.inputs)), sorted(get_config(cfg.model.name, **overrides).input_names())
    if given != taken:
        raise UserError(f"model {cfg.model.name!r} (with model.overrides) takes the inputs {taken}, but task "
                        f"{info.name!r} gives {given}")
    return overrides


def build_datasets(cfg: TrainConfig) -> tuple[Any, Any]:
    """The run's training and validation datasets (``data.params`` go to the task's build;
    ``data.max_samples > 0`` keeps N samples of each: a class-stratified draw of the run's seed where
    the dataset declares its labels, else the first N; the header says which)."""
    d = cfg.data
    train_set = build_dataset(d.task, d.train_split, max_samples=d.max_samples, sample_seed=cfg.seed, **d.params)
    if d.max_samples > len(train_set):
        warnings.warn(f"config key 'data.max_samples': {d.max_samples} is more than the {d.train_split!r} split's "
                      f"{len(train_set)} samples: all of them are used", ConfigWarning, stacklevel=3)
    val_set = build_dataset(d.task, d.val_split, max_samples=d.max_samples, sample_seed=cfg.seed, **d.params)
    if d.few_shot.shots or d.few_shot.ways:        # k-shot n-way subset of the run's seed (finetune_setup.py)
        train_set, val_set = few_shot_splits(cfg, describe_task(d.task, d.params), train_set, val_set)
    return train_set, val_set


def apply_augmentation(cfg: TrainConfig, info, train_set, val_set):
    """Per-sample transforms (``data.augment``) and batch-level Mixup/CutMix with label smoothing
    (``data.mixup``: :func:`modwire.training.mixup.make_mixer`). ``augment``: ``true`` / ``"deit"``, the NAC App. C regimen for image tasks
    (crop, flip, RandAugment, normalise, erasing); ``"crop_flip"`` / ``"resized_crop_flip"``, AiT
    App. A.1's CIFAR (padded random crop) / Pet (random resized crop) pipelines, flip and normalise
    (evaluation normalised alike: ``TRAIN_PIPELINES``); ``"randaugment"``, RandAugment alone (NI App.
    C, digits: no crop or flip), on the image ``x`` of a single- or multi-input task (e.g. the
    digits multi-task's ``{"x", "task"}``: ``task`` passes through); evaluation is untouched. An import
    path ``"package.module:attribute"``: the user's transform (:func:`~modwire.tasks.augment.user_transform`:
    a factory called with the image size and channels, or a transform as-is; evaluation untouched unless
    the factory returns a ``(train, eval)`` pair), on ``x`` as ``randaugment``."""
    augment = "deit" if cfg.data.augment is True else cfg.data.augment
    if not (augment or cfg.data.mixup):
        return train_set, val_set, None
    from ..tasks.augment import (TRAIN_PIPELINES, AugmentedDataset, eval_transform, rand_augment_transform,
                                 standard_train_transform, user_transform)

    info = info.resolve(cfg.data.params)  # the class count and image size of these params
    named = named_inputs(info.inputs)
    spec = named.get("x")
    single = len(named) == 1
    if spec is None or spec.kind != "image" or info.loss != "cross_entropy" or (
            not single and (augment == "deit" or cfg.data.mixup)):
        kinds = {name: s.kind for name, s in named.items()}
        raise UserError(f"data.augment / data.mixup need an image classification task; task {info.name!r} gives "
                        f"{kinds!r} inputs and a {info.loss!r} loss (with several inputs, only data.augment: "
                        f"randaugment, without mixup, which augments the image 'x' and passes the others through)")
    mixer = make_mixer(cfg, info.num_classes)
    if is_import_path(augment):                     # the user's own transform (tasks/augment/pipelines.py)
        train_t, eval_t = user_transform(augment, (spec.height, spec.width), spec.channels)
        train_set = AugmentedDataset(train_set, train_t, cfg.seed)
        if eval_t is not None:
            val_set = AugmentedDataset(val_set, eval_t, cfg.seed)
    elif augment == "randaugment":
        fill = 0.5 if spec.channels != 3 else (0.485, 0.456, 0.406)   # timm fills with the ImageNet mean
        train_set = AugmentedDataset(train_set, rand_augment_transform(fill=fill), cfg.seed)
    elif augment:
        c = spec.channels
        norm = {} if c == 3 else {"mean": (0.5,) * c, "std": (0.5,) * c}
        make = TRAIN_PIPELINES.get(augment, standard_train_transform)
        train_set = AugmentedDataset(train_set, make(spec.height, **norm), cfg.seed)
        val_set = AugmentedDataset(val_set, eval_transform(spec.height, **norm), cfg.seed)
    return train_set, val_set, mixer


@dataclass
class Supervised:
    """The supervised :class:`~modwire.training.run.Program`: micro-batches of the task's training
    split, its loss plus the model's auxiliary losses, validation on ``data.val_split`` at the end of
    each epoch (and of the run)."""

    info: Any                                   # the task's TaskInfo
    train_set: Any
    sampler: distributed.EpochSampler
    train_loader: DataLoader
    val_loader: DataLoader
    mixer: Any                                  # MixupCutmix or None
    local_batch: int                            # micro-batch per process
    steps_per_epoch: int
    grad_accum: int
    objective: Objective                        # the loss, the epoch hook (objective.py)
    batches: Any = None                         # the current epoch's batch iterator

    @property
    def best_metric(self) -> tuple[str, bool]:
        key = self.info.metrics[0]
        return key, key in LOWER_IS_BETTER

    @property
    def micro_used(self) -> int:
        """Micro-batches per epoch that fill whole steps (a ragged tail is skipped)."""
        return self.steps_per_epoch * self.grad_accum

    def step(self, run: TrainingRun, state: TrainState) -> dict[str, Tensor]:
        # ---- micro-steps: forward and backward over grad_accum micro-batches
        losses = accumulate(run, state)
        # ---- clip the gradient, step the optimizer, the schedule (LambdaLR: warm-up, cosine) and the EMA
        optimizer_step(run, state, losses["loss"])
        return losses

    def evaluate(self, run: TrainingRun, state: TrainState, stop: StopSignals) -> dict[str, float] | None:
        return evaluate(state.eval_model, self.val_loader, self.info, run.device, run.cfg.precision, stop=stop,
                        progress=run.feedback.validation)

    @property
    def bad_samples_skipped(self) -> int:
        """Unreadable training samples dropped so far (``data.bad_samples: skip``; 0 otherwise)."""
        data = self.train_loader.dataset
        return data.skipped if isinstance(data, SkipBadSamples) else 0

    def log_fields(self) -> dict[str, Any]:
        bad = self.bad_samples_skipped
        return {"bad_samples_skipped": bad} if bad else {}

    def summary(self, run: TrainingRun, state: TrainState) -> dict[str, str]:
        cfg = run.cfg
        n = self.train_loader.num_workers
        note = getattr(self.train_set, "note", None)      # data.max_samples' subset (tasks/base.py)
        return {"data": f"{len(self.train_set)} {cfg.data.train_split} / {len(self.val_loader.dataset)} "
                        f"{cfg.data.val_split} samples" + (f" (max_samples: {note})" if note else ""),
                "steps": f"{self.steps_per_epoch} per epoch, {run.total} in all (batch {cfg.data.batch_size} = "
                         f"{run.dist.world} × {cfg.grad_accum} × {self.local_batch})",
                "workers": f", {n} data worker{'s' if n != 1 else ''}" + (" (auto)" if cfg.data.num_workers == "auto"
                                                                            else "")}


def build_supervised_run(cfg: TrainConfig, dist_info: distributed.DistInfo, run_dir: Path,
                         overrides: dict[str, Any] | None = None) -> tuple[TrainingRun, TrainState]:
    """Model, data, loaders, optimizer, schedule: a :class:`TrainingRun` and a fresh :class:`TrainState`."""
    world = dist_info.world
    if cfg.data.batch_size % (world * cfg.grad_accum):
        raise UserError(f"data.batch_size={cfg.data.batch_size} must be divisible by processes × grad_accum "
                        f"= {world} × {cfg.grad_accum}")
    check_device(cfg.precision, dist_info.device)    # precision.py
    local_batch = cfg.data.batch_size // (world * cfg.grad_accum)
    info = get_task(cfg.data.task)
    torch.manual_seed(cfg.seed)
    model = pretrained_model(cfg, describe_task(cfg.data.task, cfg.data.params)) if cfg.finetune.init \
        else create_model(cfg.model.name, **(overrides if overrides is not None else model_overrides_for_task(cfg)))
    select_trainable(model, cfg.finetune.train)     # the rest frozen, left out of the optimizer (finetune_setup.py)
    model = model.to(dist_info.device)
    train_set, val_set, mixer = apply_augmentation(cfg, info, *build_datasets(cfg))
    sampler = distributed.EpochSampler(len(train_set), cfg.seed, dist_info.rank, world)
    loaded, collate = train_set, None
    if cfg.data.bad_samples == "skip":          # unreadable files dropped from their batch and counted
        loaded = SkipBadSamples(train_set)
        collate = loaded.collate_fn(info.collate)
    train_loader = make_loader(loaded, local_batch, sampler, info, cfg.data.num_workers, drop_last=True,
                               device=dist_info.device, collate=collate)
    val_loader = make_loader(val_set, local_batch, None, info, cfg.data.num_workers, drop_last=False,
                             device=dist_info.device)
    if len(train_loader) < cfg.grad_accum:
        raise UserError(f"the {cfg.data.train_split} split ({len(train_set)} samples) is smaller than one "
                        f"global batch ({cfg.data.batch_size})")
    if len(val_set) == 0:          # found now, not after the first epoch
        raise UserError(f"config key 'data.val_split': the {cfg.data.val_split!r} split of task {cfg.data.task!r} "
                        f"is empty, so the run could never be validated; choose another split or give it samples")
    steps_per_epoch = len(train_loader) // cfg.grad_accum
    total = cfg.epochs * steps_per_epoch if cfg.max_steps <= 0 else min(cfg.max_steps, cfg.epochs * steps_per_epoch)
    if cfg.max_steps > cfg.epochs * steps_per_epoch:
        warnings.warn(f"config key 'max_steps': {cfg.max_steps} is beyond epochs={cfg.epochs} × {steps_per_epoch} "
                      f"steps per epoch: the run stops after {total} steps (raise epochs to reach max_steps)",
                      ConfigWarning, stacklevel=3)
    program = Supervised(info, train_set, sampler, train_loader, val_loader, mixer, local_batch, steps_per_epoch,
                         cfg.grad_accum, Objective.from_config(cfg))
    run = TrainingRun(cfg, dist_info, run_dir, program, total)
    optimizer = build_optimizer(model, cfg.optim)
    ema = WeightEMA.for_config(model, cfg.ema_decay)
    scaler = loss_scaler(cfg.precision, dist_info.device)
    return run, TrainState(model, optimizer, build_scheduler(optimizer, total, cfg.optim), scaler, ema)


def next_batch(run: TrainingRun, state: TrainState) -> tuple[Any, Tensor]:
    """The next micro-batch on the device: labels checked, mixup applied. An epoch's iterator
    starts at ``state.micro`` (exact resume part-way through an epoch)."""
    p = run.program
    if p.batches is None:
        if state.micro == 0:                     # AiT's "reset memory" (Table 2); not mid-epoch
            p.objective.start_epoch(state.model, state.epoch)
        p.sampler.set_epoch(state.epoch, start=state.micro * p.local_batch)
        if isinstance(p.train_set, EpochDataset):
            p.train_set.set_epoch(state.epoch)
        p.batches = iter(p.train_loader)
    batch = next(p.batches)
    if batch is None:                            # data.bad_samples: skip, and no item of the batch was readable
        raise UserError(f"every sample of a training batch was unreadable ({p.bad_samples_skipped} skipped so "
                        f"far): run modwire data check on this config to list the files")
    x, y = batch
    check_labels(y, p.info, state.model.num_classes)
    x, y = mix(p.mixer, x, y, run.cfg.seed, run.dist.rank, state.epoch, state.micro)   # mixup.py
    return to_device(x, run.device), to_device(y, run.device)


def accumulate(run: TrainingRun, state: TrainState) -> dict[str, Tensor]:
    """``grad_accum`` micro-steps of forward and backward of the run's :class:`Objective`. Returns the
    step's losses (the task's as ``loss``, each auxiliary one unweighted as ``aux/<name>``), averaged
    over micro-batches."""
    cfg, n = run.cfg, run.cfg.grad_accum
    shown: dict[str, Tensor] = {}
    for i in range(n):
        x, y = next_batch(run, state)
        sync = run.net.no_sync() if i < n - 1 and run.dist.world > 1 else contextlib.nullcontext()
        with sync:
            with autocast(run.device, cfg.precision):
                out = call_model(run.net, x)
            loss = run.program.objective.of_output(state.model, out, y, n)   # objective.py
            state.scaler.scale(loss.total).backward()
        state.micro += 1
        run.seen += batch_len(x) * run.dist.world
        for k, v in loss.logged().items():
            shown[k] = shown.get(k, 0) + v.float() / n
    return shown


def optimizer_step(run: TrainingRun, state: TrainState, loss: Tensor | None = None) -> None:
    """Clip, step (through the fp16 scaler), schedule, EMA; then advance the counters. ``loss``: the
    step's task loss, watched with the gradients' norm by the run's :class:`NonFiniteGuard`."""
    norm = None
    if run.cfg.optim.grad_clip > 0:
        state.scaler.unscale_(state.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(state.model.parameters(), run.cfg.optim.grad_clip)
    elif run.cfg.precision != "fp16":      # fp16: the scaler itself skips steps with inf gradients
        norm = grad_norm(state.model.parameters())
    # fp16: inf gradients are the loss scaler's to skip (it lowers the scale), not a divergence; its
    # first steps overflow by design. The guard then watches the loss (and, at checkpoints, the weights).
    watched = None if state.scaler.is_enabled() else norm
    take = True if loss is None or run.guard is None else run.guard.observe(state.step, loss, watched)
    if take or state.scaler.is_enabled():   # fp16: the scaler skips a step with inf gradients itself
        state.scaler.step(state.optimizer)
    state.scaler.update()
    state.optimizer.zero_grad(set_to_none=True)
    state.scheduler.step()
    if state.ema is not None:
        state.ema.update(state.model)
    state.step += 1
    if state.micro == run.program.micro_used:       # the epoch is over (a ragged tail is skipped)
        state.epoch, state.micro, run.program.batches = state.epoch + 1, 0, None
        state.val_pending = True
    state.val_pending |= state.step >= run.total


# ----------------------------------------------------------------------------- its row of the run-kind table

SUPERVISED = register_kind(RunKind("supervised", None, model_overrides=model_overrides_for_task,
                                   build_run=build_supervised_run))
