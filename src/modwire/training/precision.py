"""Precision and compilation (``precision``, ``compile``), one unit: their choices and checks, the
autocast every forward runs under, the fp16 loss scaler and the ``torch.compile`` wrapper.

* ``precision``: ``fp32`` | ``bf16`` | ``fp16``: :func:`autocast` around each training and evaluation
  forward; ``fp16`` adds a loss scaler (:func:`loss_scaler`), a CUDA mechanism, so it needs a CUDA
  device (:func:`check_device`). Every model returns its parameters' dtype under autocast
  (``models.base``).
* ``compile``: ``false`` | ``true`` (= ``"default"``) | a ``torch.compile`` mode: :func:`compile_net`
  wraps the model as called by the loop (after DDP), with the model's own inductor options (an NFM's:
  ``PretrainedModel.compile_options``); ``"reduce-overhead"`` uses CUDA graphs on CUDA
  and compiles as ``"default"`` on the CPU. A resume may change it (``--allow-change compile``).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..errors import UserError
from ..models.base import PretrainedModel
from ..nn.attention import uses_flex
from ..fields import Choices

__all__ = ["AUTOCAST", "COMPILE_CHOICES", "PRECISIONS", "autocast", "check_compile_setting", "check_compile_target",
           "check_device",
           "compile_mode", "compile_net", "loss_scaler"]

PRECISIONS = ("fp32", "bf16", "fp16")
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_CHOICES = Choices((False, True, "default", "reduce-overhead", "max-autotune"),
                          note="true = 'default'; the mode of torch.compile(mode=...)")


def autocast(device: torch.device, precision: str):
    """``torch.autocast`` for ``bf16`` / ``fp16``; a no-op context for ``fp32``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST[precision])


def check_device(precision: str, device: torch.device) -> None:
    """fp16's loss scaler is a CUDA mechanism: elsewhere it skips steps while the counter advances."""
    if precision == "fp16" and device.type != "cuda":
        raise UserError(f"config key 'precision': fp16 needs a CUDA device, the run is on {device.type}: use bf16 "
                        f"(or fp32)")


def loss_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """The fp16 loss scaler (a disabled one, which passes steps through, for fp32 / bf16)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def check_compile_setting(value: Any) -> None:
    """``compile`` is a bool or a mode name (the choices table alone would take 1 for true, 0 for false)."""
    if not isinstance(value, (bool, str)):
        raise UserError(f"config key 'compile': got {value!r}, expected one of {list(COMPILE_CHOICES)} "
                        f"({COMPILE_CHOICES.note})")


def compile_mode(value: Any) -> str | None:
    """The ``torch.compile`` mode of a ``compile`` setting: None (off), ``"default"`` for ``true``, or
    the mode named."""
    if value is False or value is None:
        return None
    return "default" if value is True else str(value)


def check_compile_target(value: Any, model: torch.nn.Module, device: torch.device) -> None:
    """Refuse, before the run writes anything, a compiled model whose FlexAttention torch cannot build
    on this device: on the CPU inductor fails to lower FlexAttention inside a model (torch 2.13,
    ``benchmarks/results/flex_cpu_compiled.json``), which would otherwise stop the run at its first step."""
    if compile_mode(value) is not None and device.type == "cpu" and uses_flex(model):
        raise UserError("config key 'compile': torch.compile cannot build FlexAttention into a model on the CPU "
                        "(torch's inductor fails to lower it), and this model's attention_backend is 'flex': set "
                        "model.overrides.attention_backend=sdpa on the CPU (the same maths), or compile: false")


def compile_net(net: torch.nn.Module, value: Any, model: PretrainedModel) -> torch.nn.Module:
    """``net`` (``model``, or its DDP wrapper) compiled as ``compile`` says, with the model's own inductor
    options (:meth:`~modwire.models.base.PretrainedModel.compile_kwargs`); itself when off."""
    mode = compile_mode(value)
    return net if mode is None else torch.compile(net, **model.compile_kwargs(mode=mode))
