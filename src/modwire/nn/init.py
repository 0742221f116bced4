"""Fast weight initialisation that keeps the documented distribution exactly.

Every truncated-normal weight in modwire is drawn here (:func:`trunc_normal_`,
:func:`init_linear_`); nothing else calls ``torch.nn.init.trunc_normal_``.

Why not ``torch.nn.init.trunc_normal_``: for a truncation at ±2σ (acceptance 95.4%)
torch redraws the *whole* tensor until no element is outside ``[a, b]`` (about five
full-size ``normal_`` + ``where`` passes per tensor), and when the cores are shared
every one of those multi-threaded passes waits at a barrier for a descheduled thread
(cost of building each preset either way: ``benchmarks/bench_startup.py``). Here only
the outliers are redrawn (one full-size pass, then passes over ~4.6%, ~0.2%, ... of the
elements), on one thread.

Exactness: each element is drawn from ``N(mean, std²)`` and redrawn, independently of
the others, until it falls in ``[a, b]`` — per-element rejection sampling, whose
result is exactly ``N(mean, std²)`` conditioned on ``[a, b]`` (the documented
distribution). For narrow windows (acceptance < 30%), where rejection would loop
long, the inverse CDF is used instead: ``u ~ U(Φ(α), Φ(β))``,
``x = mean + std·√2·erfinv(2u − 1)``, computed in float64 and clamped to ``[a, b]``
(the clamp only absorbs rounding). ``tests/nn/test_init.py`` checks both against
scipy's ``truncnorm`` with a Kolmogorov-Smirnov test.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import Tensor

from ..errors import UserError

_MIN_REJECTION_ACCEPTANCE = 0.3


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run the enclosed torch ops on one intra-op thread (restored afterwards).

    Sampling is serial in torch anyway; the masks and index ops around it are too
    small to gain from threads, and with shared cores each parallel op can stall
    for a scheduler quantum waiting on a descheduled worker."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _phi(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@torch.no_grad()
def trunc_normal_(tensor: Tensor, *, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: torch.Generator | None = None) -> Tensor:
    """Fill ``tensor`` in place with ``N(mean, std²)`` truncated to ``[a, b]`` (absolute
    bounds, as in ``torch.nn.init.trunc_normal_``); returns ``tensor``.

    Same distribution as torch's, different random stream. A tensor on the meta device
    is left as is (nothing to sample)."""
    if not (std > 0 and a < b and math.isfinite(std)):
        raise UserError(f"trunc_normal_: expected std > 0 and a < b, got std={std}, a={a}, b={b}")
    if tensor.is_meta or tensor.numel() == 0:
        return tensor
    alpha, beta = (a - mean) / std, (b - mean) / std
    lo, hi = _phi(alpha), _phi(beta)
    in_place = tensor.is_contiguous() and hi - lo >= _MIN_REJECTION_ACCEPTANCE
    with single_thread():
        if hi - lo >= _MIN_REJECTION_ACCEPTANCE:
            flat = tensor.view(-1) if in_place else tensor.new_empty(tensor.numel())
            _resample_outliers(flat, mean, std, a, b, generator)
        else:   # inverse CDF in float64: x = mean + std·√2·erfinv(2u − 1), u ~ U(Φ(α), Φ(β))
            u = torch.empty(tensor.numel(), dtype=torch.float64, device=tensor.device)
            u.uniform_(lo, hi, generator=generator)
            flat = u.mul_(2).sub_(1).erfinv_().mul_(std * math.sqrt(2.0)).add_(mean).clamp_(a, b)
        if not in_place:
            tensor.copy_(flat.view(tensor.shape))
    return tensor


def _resample_outliers(flat: Tensor, mean: float, std: float, a: float, b: float,
                       generator: torch.Generator | None) -> None:
    """Per-element rejection: draw all of ``flat`` ``[n]``, then redraw only the elements
    outside ``[a, b]`` until none is left (the bounds are compared in ``flat``'s dtype)."""
    flat.normal_(mean, std, generator=generator)
    bad = ((flat < a) | (flat > b)).nonzero().squeeze(1)
    while bad.numel():
        fresh = torch.empty(bad.numel(), dtype=flat.dtype, device=flat.device).normal_(mean, std, generator=generator)
        flat[bad] = fresh
        bad = bad[(fresh < a) | (fresh > b)]


def init_linear_(weight: Tensor, bias: Tensor | None = None, *, std: float = 0.02) -> None:
    """Truncated-normal weights ``N(0, std²)`` on ``[-2·std, 2·std]`` and zero bias (the
    ViT/Perceiver convention)."""
    trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
    if bias is not None and not bias.is_meta:
        with torch.no_grad():
            bias.zero_()
