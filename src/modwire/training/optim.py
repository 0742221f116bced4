"""Optimizer, parameter groups and learning-rate schedule (NAC App. C, Table 4)."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..models.base import PretrainedModel, no_weight_decay_names
from .config import OptimSection


def param_groups(model: nn.Module, weight_decay: float, *, filter_bias_and_norm: bool = True) -> list[dict]:
    """Two groups of the trainable parameters: ``weight_decay`` for all but those the model names in
    ``no_weight_decay()`` (full names: biases whatever their shape, normalisation layers' parameters,
    ≤1-D parameters, and what its paper exempts, e.g. NAC App. C's signatures and codes;
    :func:`modwire.models.base.no_weight_decay_names`), none for those. A module that is not a modwire
    model (a GAN's generator or discriminator) gets the same rule without paper exemptions.
    ``filter_bias_and_norm=False``: every trainable parameter is decayed (the AiT authors' ``ait.py``:
    ``AdamW(net.parameters(), weight_decay=0.01)``; the second group is empty)."""
    if not filter_bias_and_norm:
        skip: set[str] = set()
    else:
        skip = set(model.no_weight_decay() if isinstance(model, PretrainedModel) else no_weight_decay_names(model))
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimSection) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay, filter_bias_and_norm=cfg.filter_bias_and_norm)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.betas[0])
    return torch.optim.RAdam(groups, lr=cfg.lr, betas=tuple(cfg.betas), decoupled_weight_decay=True)


def lr_at(step: int, total: int, cfg: OptimSection) -> float:
    """Linear warm-up from ``warmup_lr`` to ``lr`` over ``warmup_steps``, then cosine to ``min_lr``,
    reached at the last step or, with ``decay_steps > 0``, at step ``decay_steps`` and kept after
    (NI App. A.1.5: "anneal ... over 80-90% of the training steps, and keep the learning rate at
    the minimum for the remainder"; Table 4: 120000 decay steps). ``schedule="step"``: after the
    warm-up, ``lr · gamma^(number of milestones <= step)`` (Verma et al.'s step decay); ``"linear"``: from ``lr`` to ``min_lr`` in a straight line (Mimicry's GAN
    schedule with ``min_lr = 0``); ``"constant"``: ``lr`` after the warm-up."""
    if step < cfg.warmup_steps:
        return cfg.warmup_lr + (cfg.lr - cfg.warmup_lr) * step / cfg.warmup_steps
    if cfg.schedule == "step":   # Verma et al. 2019 (NFM Table 2's procedure): lr × gamma at each milestone
        return cfg.lr * cfg.gamma ** sum(step >= m for m in cfg.milestones)
    if cfg.schedule == "constant":
        return cfg.lr
    end = cfg.decay_steps if cfg.decay_steps > 0 else total
    span = max(1, end - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":  # Mimicry's GAN schedule (NFM §4.1): lr falls linearly to min_lr (there 0)
        return cfg.lr + (cfg.min_lr - cfg.lr) * t
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * t))


def build_scheduler(opt: torch.optim.Optimizer, total_steps: int, cfg: OptimSection):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_at(step, total_steps, cfg) / cfg.lr)
