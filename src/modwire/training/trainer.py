"""The training loop, in plain PyTorch (nanoGPT/timm style).

``train(config)`` builds the model for the task, then runs epochs of optimizer steps
(gradient accumulation, clipping, autocast, optional ``torch.compile`` and EMA),
evaluates each epoch, logs to ``metrics.jsonl`` (and TensorBoard when installed) and
writes ``last``/``best`` checkpoints atomically. ``train(config, resume=True)``
continues exactly where the last checkpoint left off: data order is a function of
``(seed, epoch)``, the position inside the epoch and every RNG state are saved, so a
run killed between checkpoints and resumed ends with the same weights as one never
interrupted. SIGINT saves a checkpoint before stopping. A ``graph_prior`` section adds
NAC's graph structure regularizer (App. A, Eq. 6-9) on the link probabilities once per
optimizer step.
"""
from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor
from torch.utils.data import DataLoader

from ..models import create_model, get_config
from ..models.base import PretrainedModel, deep_merge
from ..models.inputs import named_inputs
from ..tasks import build_dataset, compute_metrics, describe_task, get_task
from . import distributed
from .checkpoint import load_state, save_checkpoint
from .config import TrainConfig, to_yaml
from .optim import build_optimizer, build_scheduler

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_model_for_task(cfg: TrainConfig) -> PretrainedModel:
    """The preset ``cfg.model.name``, its input layers fitted to the task's description at
    ``cfg.data.params`` (``ModelConfig.input_overrides``), then the user's overrides, which win
    (nested settings such as ``tokenizer`` merge: a user's ``tokenizer.max_len`` keeps the
    tokenizer kind the task's inputs call for)."""
    info = describe_task(cfg.data.task, cfg.data.params)
    preset = get_config(cfg.model.name)
    user = OmegaConf.to_container(cfg.model.overrides) if OmegaConf.is_config(cfg.model.overrides) \
        else dict(cfg.model.overrides)
    overrides = deep_merge(preset.normalize(preset.input_overrides(info.inputs, info.num_classes)),
                           preset.normalize(user))
    given, taken = sorted(named_inputs(info.inputs)), sorted(get_config(cfg.model.name, **overrides).input_names())
    if given != taken:
        raise ValueError(f"model {cfg.model.name!r} (with model.overrides) takes the inputs {taken}, but task "
                         f"{info.name!r} gives {given}")
    return create_model(cfg.model.name, **overrides)


def to_device(x: Tensor | dict[str, Tensor], device: torch.device) -> Tensor | dict[str, Tensor]:
    """A batch's inputs on ``device``: a tensor, or a dict of tensors (multimodal tasks)."""
    return {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)


def call_model(model: torch.nn.Module, x: Tensor | dict[str, Tensor]) -> Tensor:
    """``model(x)``, or ``model(**x)`` for a multimodal batch (e.g. ``{"x": image, "condition": question}``)."""
    return model(**x) if isinstance(x, dict) else model(x)


def batch_len(x: Tensor | dict[str, Tensor]) -> int:
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


def build_graph_regularizer(cfg: TrainConfig, model: torch.nn.Module):
    """The graph structure regularizer of ``cfg.graph_prior`` (NAC App. A), or None."""
    gp = cfg.graph_prior
    if gp.name is None or gp.weight == 0:
        return None
    generator = getattr(getattr(getattr(model, "config", None), "generator", None), "kind", "unconditional")
    if generator != "unconditional":
        raise ValueError(f"config key 'graph_prior.name': a graph prior needs one learned graph, but model "
                         f"{cfg.model.name!r} designs a circuit per sample (conditional generator; the paper "
                         f"trains conditional NACs without a graph prior)")
    if getattr(model, "link_probs", lambda: None)() is None:
        raise ValueError(f"config key 'graph_prior.name': {gp.name!r} needs a model with link probabilities "
                         f"(a NAC with kernel.enabled=True); model {cfg.model.name!r} has none")
    from ..graphs import GraphRegularizer

    return GraphRegularizer(gp.name, dict(gp.params), loss=gp.loss, reduction=gp.reduction, align=gp.align)


def compute_loss(info, out: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    if info.loss == "mse":
        return F.mse_loss(out.float(), y.float().view_as(out))
    if y.dim() == 2:  # soft targets (mixup / cutmix)
        return torch.sum(-y * F.log_softmax(out.float(), dim=-1), dim=-1).mean()
    return F.cross_entropy(out.float(), y, label_smoothing=label_smoothing)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, info, device: torch.device,
             precision: str = "fp32") -> dict[str, float]:
    """Loss and the task's metrics over a whole split."""
    was_training = model.training
    model.eval()
    outs, ys, masks = [], [], {name: [] for name in info.subsets}
    for x, y in loader:
        with _autocast(device, precision):
            outs.append(call_model(model, to_device(x, device)).float().cpu())
        ys.append(y)
        for name, select in info.subsets.items():
            masks[name].append(select(x))
    model.train(was_training)
    out, y = torch.cat(outs), torch.cat(ys)
    metrics = {"loss": compute_loss(info, out, y).item(), **compute_metrics(info.metrics, out, y)}
    for name, parts in masks.items():
        m = torch.cat(parts)
        if m.any():
            metrics.update({f"{k}_{name}": v for k, v in compute_metrics(info.metrics, out[m], y[m]).items()})
    return metrics


def apply_augmentation(cfg: TrainConfig, model, info, train_set, val_set):
    """NAC App. C regimen for image tasks: per-sample transforms (``data.augment``) and
    batch-level Mixup/CutMix with label smoothing (``data.mixup``)."""
    if not (cfg.data.augment or cfg.data.mixup):
        return train_set, val_set, None
    from ..tasks.augment import AugmentedDataset, MixupCutmix, eval_transform, standard_train_transform

    info = info.resolve(cfg.data.params)  # the class count and image size of these params
    spec = info.inputs
    if getattr(spec, "kind", None) != "image" or info.loss != "cross_entropy":
        kinds = {name: s.kind for name, s in named_inputs(spec).items()}
        raise ValueError(f"data.augment / data.mixup need an image classification task; task {info.name!r} "
                         f"gives {kinds!r} inputs and a {info.loss!r} loss")
    mixer = MixupCutmix(num_classes=info.num_classes, label_smoothing=cfg.optim.label_smoothing) \
        if cfg.data.mixup else None
    if cfg.data.augment:
        c = spec.channels
        norm = {} if c == 3 else {"mean": (0.5,) * c, "std": (0.5,) * c}
        train_set = AugmentedDataset(train_set, standard_train_transform(spec.height, **norm), cfg.seed)
        val_set = AugmentedDataset(val_set, eval_transform(spec.height, **norm), cfg.seed)
    return train_set, val_set, mixer


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST[precision])


def make_loader(dataset, batch: int, sampler, info, workers: int, drop_last: bool) -> DataLoader:
    # Its own generator: a DataLoader otherwise draws a seed from the global RNG at every
    # epoch start, which would make the model's kernel samples depend on where a run resumed.
    return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=drop_last, num_workers=workers,
                      collate_fn=info.collate, generator=torch.Generator().manual_seed(0))


class _Stop:
    """Turns SIGINT into a flag checked after each optimizer step."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def _handle(self, *_):
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def train(cfg: TrainConfig, resume: bool = False) -> dict[str, Any]:
    """Run (or resume) training; returns ``{"status", "step", "val": metrics, "best": ...}``."""
    dist_info = distributed.setup(cfg.device)
    device, world = dist_info.device, dist_info.world
    if cfg.data.batch_size % (world * cfg.grad_accum):
        raise ValueError(f"data.batch_size={cfg.data.batch_size} must be divisible by processes × grad_accum "
                         f"= {world} × {cfg.grad_accum}")
    local_batch = cfg.data.batch_size // (world * cfg.grad_accum)
    run = Path(cfg.out_dir)
    info = get_task(cfg.data.task)

    torch.manual_seed(cfg.seed)
    model = build_model_for_task(cfg).to(device)
    train_set = build_dataset(cfg.data.task, cfg.data.train_split, **cfg.data.params)
    val_set = build_dataset(cfg.data.task, cfg.data.val_split, **cfg.data.params)
    train_set, val_set, mixer = apply_augmentation(cfg, model, info, train_set, val_set)
    sampler = distributed.EpochSampler(len(train_set), cfg.seed, dist_info.rank, world)
    train_loader = make_loader(train_set, local_batch, sampler, info, cfg.data.num_workers, drop_last=True)
    val_loader = make_loader(val_set, local_batch, None, info, cfg.data.num_workers, drop_last=False)
    micro_per_epoch = len(train_loader)
    if micro_per_epoch < cfg.grad_accum:
        raise ValueError(f"the {cfg.data.train_split} split ({len(train_set)} samples) is smaller than one "
                         f"global batch ({cfg.data.batch_size})")
    steps_per_epoch = micro_per_epoch // cfg.grad_accum
    total = cfg.epochs * steps_per_epoch if cfg.max_steps <= 0 else min(cfg.max_steps, cfg.epochs * steps_per_epoch)

    regularizer = build_graph_regularizer(cfg, model)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, total, cfg.optim)
    ema = None
    if cfg.ema_decay > 0:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema_decay))
    state: dict[str, Any] = {"step": 0, "epoch": 0, "micro": 0, "best": None, "val": {}}
    if resume:
        state = _restore(run, model, optimizer, scheduler, ema)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        net = torch.compile(net)

    logger = _Logger(run, dist_info.main, resume_step=state["step"] if resume else None)
    if dist_info.main:
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.yaml").write_text(to_yaml(cfg))
    bar = _progress(cfg, dist_info, total, state["step"])
    status, seen, tick = "finished", 0, time.perf_counter()
    model.train()
    micro_used = steps_per_epoch * cfg.grad_accum  # a ragged tail that cannot fill a step is skipped
    with _Stop() as stop:
        while status == "finished" and state["step"] < total:
            sampler.set_epoch(state["epoch"], start=state["micro"] * local_batch)
            if hasattr(train_set, "set_epoch"):
                train_set.set_epoch(state["epoch"])
            for x, y in train_loader:
                if mixer is not None:  # a draw that depends only on (seed, rank, epoch, position)
                    g = torch.Generator().manual_seed(
                        hash((cfg.seed, dist_info.rank, state["epoch"], state["micro"])) % 2**62)
                    x, y = mixer(x, y, g)
                x, y = to_device(x, device), y.to(device)
                last_micro = (state["micro"] + 1) % cfg.grad_accum == 0
                sync = contextlib.nullcontext() if last_micro or world == 1 else net.no_sync()
                with sync:
                    with _autocast(device, cfg.precision):
                        out = call_model(net, x)
                    loss = compute_loss(info, out, y, cfg.optim.label_smoothing)
                    objective = loss / cfg.grad_accum
                    if regularizer is not None and last_micro:  # once per optimizer step (App. A.1)
                        graph_loss = regularizer(model.link_probs())
                        objective = objective + cfg.graph_prior.weight * graph_loss
                    scaler.scale(objective).backward()
                state["micro"] += 1
                seen += batch_len(x) * world
                if not last_micro:
                    continue
                if cfg.optim.grad_clip > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                if ema is not None:
                    ema.update_parameters(model)
                state["step"] += 1
                rate = seen / max(time.perf_counter() - tick, 1e-9)
                if state["step"] % cfg.log_every == 0 or state["step"] == total:
                    shown = loss.detach().clone()
                    if world > 1:  # log the global batch's loss, not rank 0's share
                        torch.distributed.all_reduce(shown)  # gloo has no AVG: sum, then divide
                        shown /= world
                    record = {"step": state["step"], "epoch": state["epoch"], "loss": shown.item(),
                              "lr": scheduler.get_last_lr()[0], "samples_per_s": rate}
                    if regularizer is not None:
                        record["graph_loss"] = graph_loss.item()
                    logger.log(record)
                    seen, tick = 0, time.perf_counter()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}",
                                    samples_per_s=f"{rate:.0f}", **{f"val_{k}": f"{v:.3f}" for k, v in state["val"].items()})
                if stop.requested:
                    status = "interrupted"
                    break
                if state["micro"] == micro_used or state["step"] >= total:
                    break
                if cfg.checkpoint_every and state["step"] % cfg.checkpoint_every == 0:
                    _save(run, "last", model, optimizer, scheduler, ema, state, dist_info)
            if status != "finished":
                break
            if state["micro"] == micro_used:
                state["epoch"], state["micro"] = state["epoch"] + 1, 0
            state["val"] = _validate(ema.module if ema is not None else model, val_loader, info, device,
                                     cfg, dist_info, logger, state)
            is_best = _is_best(state, info)
            _save(run, "last", model, optimizer, scheduler, ema, state, dist_info)
            if is_best:
                _save(run, "best", model, optimizer, scheduler, ema, state, dist_info)
    if status == "interrupted":
        _save(run, "last", model, optimizer, scheduler, ema, state, dist_info)
    if bar is not None:
        bar.close()
    logger.close()
    distributed.teardown()
    return {"status": status, "step": state["step"], "val": state["val"], "best": state["best"],
            "model": model, "run_dir": str(run)}


def _validate(model, loader, info, device, cfg, dist_info, logger, state) -> dict[str, float]:
    metrics = evaluate(model, loader, info, device, cfg.precision) if dist_info.main else {}
    if dist_info.world > 1:
        torch.distributed.barrier()
    logger.log({"step": state["step"], "epoch": state["epoch"], **{f"val_{k}": v for k, v in metrics.items()}})
    return metrics


def _is_best(state: dict[str, Any], info) -> bool:
    if not state["val"]:
        return False
    key = info.metrics[0]
    value = state["val"][key]
    if state["best"] is None or value > state["best"][key]:
        state["best"] = {key: value, "step": state["step"]}
        return True
    return False


def _save(run, tag, model, optimizer, scheduler, ema, state, dist_info) -> None:
    if not dist_info.main:
        return
    full = {**state, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "rng": _rng_state()}
    if ema is not None:
        full["ema_n_averaged"] = ema.n_averaged
    save_checkpoint(run, tag, model, full, ema.module.state_dict() if ema is not None else None)


def _restore(run: Path, model, optimizer, scheduler, ema) -> dict[str, Any]:
    from safetensors.torch import load_file

    ckpt = run / "checkpoints" / "last"
    if not (ckpt / "state.pt").is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {ckpt} (expected {ckpt}/state.pt)")
    full = load_state(ckpt)
    model.load_state_dict(load_file(str(ckpt / "model.safetensors"), device=str(next(model.parameters()).device)))
    optimizer.load_state_dict(full.pop("optimizer"))
    scheduler.load_state_dict(full.pop("scheduler"))
    if ema is not None:
        ema.module.load_state_dict(load_file(str(ckpt / "ema.safetensors")))
        ema.n_averaged.copy_(full.pop("ema_n_averaged"))
    _set_rng_state(full.pop("rng"))
    return full


def _progress(cfg, dist_info, total, start):
    if not (cfg.progress and dist_info.main):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=start, desc=f"{cfg.model.name} on {cfg.data.task}", unit="step")


class _Logger:
    """metrics.jsonl (always) and TensorBoard (when installed), rank 0 only. On resume,
    records after the resumed step are dropped so the log matches an uninterrupted run."""

    def __init__(self, run: Path, main: bool, resume_step: int | None) -> None:
        self.path, self.main, self.tb = run / "metrics.jsonl", main, None
        if not main:
            return
        run.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            keep = [l for l in self.path.read_text().splitlines() if json.loads(l).get("step", 0) <= resume_step]
            self.path.write_text("".join(l + "\n" for l in keep))
        elif resume_step is None:
            self.path.write_text("")
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(run / "tensorboard"))
        except ImportError:
            self.tb = None

    def log(self, record: dict[str, Any]) -> None:
        if not self.main:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if k not in ("step", "epoch") and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
