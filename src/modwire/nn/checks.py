"""Input checks shared by every model's forward: a tensor, of the expected rank and sizes, float in the
weights' dtype and on their device, finite, not empty. Each raises a :class:`~modwire.errors.UserError`
naming the argument, what was expected and what was given.

The value checks (finite, of a magnitude float32 arithmetic survives, ids in range) cost one ``aminmax`` reduction and one device-to-host copy;
they are skipped while ``torch.compile`` traces (they are data-dependent) and on the meta device.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..errors import UserError, UserTypeError

__all__ = ["check_device", "check_float", "check_images", "check_not_empty", "check_tensor", "min_max",
           "values_checkable"]


def check_tensor(x: object, name: str, expected: str) -> None:
    """``x`` is a torch.Tensor (its rank, sizes and dtype: the callers)."""
    if isinstance(x, dict):  # a batch of a multi-input task (e.g. {'x', 'condition'}) passed whole
        raise UserTypeError(f"{name}: expected a torch.Tensor {expected}, got a dict with keys {sorted(map(str, x))}; "
                            f"pass a batch of named inputs as keywords: model(**batch)")
    if not isinstance(x, Tensor):
        raise UserTypeError(f"{name}: expected a torch.Tensor {expected}, got {type(x).__module__}."
                            f"{type(x).__qualname__}; convert it with torch.as_tensor (choosing the dtype)")


def check_not_empty(x: Tensor, name: str, expected: str) -> None:
    if 0 in x.shape[:2]:
        what = "an empty batch (B=0)" if x.shape[0] == 0 else "an empty token set (N=0)"
        raise UserError(f"{name}: expected {expected} with B, N >= 1, got {what}: shape {list(x.shape)}")


def check_float(x: Tensor, name: str, expected: str, weight: Tensor) -> None:
    """Floating point, the weights' dtype (unless autocast casts it), the weights' device, finite."""
    if x.dtype == torch.uint8:
        raise UserTypeError(f"{name}: expected float {expected}, got torch.uint8; convert with x.float() / 255 "
                            f"(then the normalisation used in training)")
    if not x.is_floating_point():
        raise UserTypeError(f"{name}: expected float {expected}, got {x.dtype}")
    check_device(x, name, weight)
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise UserTypeError(f"{name}: expected {weight.dtype} (the model's weights) {expected}, got {x.dtype}; "
                            f"convert with x.to({weight.dtype}) or run under torch.autocast")
    if values_checkable(x):
        lo, hi = min_max(x)             # NaN propagates into min and max
        if not (math.isfinite(lo) and math.isfinite(hi)):
            bad = "NaN" if math.isnan(lo) or math.isnan(hi) else "inf"
            raise UserError(f"{name}: expected finite values, got {bad} (min {lo}, max {hi}) in {list(x.shape)}")
        if max(-lo, hi) > MAX_ABS_INPUT:
            raise UserError(f"{name}: expected values of magnitude up to {MAX_ABS_INPUT:.0e}, got min {lo:.3g}, "
                            f"max {hi:.3g}: larger inputs overflow float32 inside the model (its output is not "
                            f"finite); rescale them")


# Inputs of magnitude 1e20 to 1e21 (depending on the weights) make the float32 outputs of NAC,
# Perceiver IO, NI, the ViT and AiT non-finite, 3e19 does not (tests/robustness/test_nonfinite_inputs.py
# checks 1e22): 1e18 leaves a margin and is far above any normalised data.
MAX_ABS_INPUT = 1e18


def values_checkable(x: Tensor) -> bool:
    """Value checks read the data: not while torch.compile traces, nor on the meta device."""
    return not torch.compiler.is_compiling() and not x.is_meta


def min_max(x: Tensor) -> list:
    """``[min, max]`` of ``x``: one reduction, one device-to-host copy."""
    return torch.stack(torch.aminmax(x.detach())).tolist()


def check_device(x: Tensor, name: str, weight: Tensor) -> None:
    if x.device != weight.device:
        raise UserError(f"{name}: expected a tensor on {weight.device} (the model's device), got {x.device}")



def check_images(x: Tensor, name: str, who: str, expected: tuple[int, ...], weight: Tensor,
                  what: str = "images", note: str = "") -> Tensor:
    """``x`` is a float ``[B, *expected]`` batch on ``weight``'s device and dtype, finite, not empty."""
    layout = f"{what} [B, {', '.join(map(str, expected))}]{note}"
    check_tensor(x, name, layout)
    if x.dim() != 4 or tuple(x.shape[1:]) != expected:
        raise UserError(f"{name}: {who} expects {layout}, got {list(x.shape)}")
    check_not_empty(x, name, layout)
    check_float(x, name, layout, weight)
    return x
