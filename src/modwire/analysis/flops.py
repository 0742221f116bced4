"""Counting FLOPs and timing forwards, for the analysis (NAC Fig. 5b, Fig. 15) and the benchmarks.

* :func:`count_flops` — FLOPs of one call, counted by ``torch.utils.flop_counter``
  (matmuls, convolutions and attention only; elementwise work such as the ModFC
  modulation, GELU or LayerNorm is not counted). ``FlopCounterMode`` has formulas for
  the CUDA scaled-dot-product-attention kernels but not for the CPU one
  (``aten._scaled_dot_product_flash_attention_for_cpu``), which NAC and Perceiver IO
  use on CPU; :data:`CPU_SDPA_FLOPS` adds it.
* :func:`time_interleaved` — median seconds per call of several functions, timed
  round-robin (A, B, C, A, B, C, ...) so that slow phases of a shared machine hit all
  of them alike; CUDA work is synchronized before and after each call.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ..errors import UserError

__all__ = ["CPU_SDPA_FLOPS", "count_flops", "time_interleaved", "time_once"]

aten = torch.ops.aten


def _cpu_sdpa_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


CPU_SDPA_FLOPS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
}


def count_flops(fn: Callable[[], object], grad: bool = False) -> int:
    """FLOPs of one call of ``fn`` (matmul/conv/attention; elementwise ops excluded).
    A multiply-add counts as 2 FLOPs: ``nn.Linear(i, o)`` on ``[B, i]`` is ``2·B·i·o``.

    Runs with autograd on (``grad``: also counting the backward of whatever ``fn``
    backpropagates), never under ``inference_mode`` or ``no_grad``: FlopCounterMode's module
    tracker fails on a parameter passed to a module as an input (NI's relative positions pass
    their embedding tables) when no graph is recorded. The FLOPs are the same."""
    del grad   # the forward is counted either way; a backward only if fn runs one
    with torch.inference_mode(False), torch.enable_grad(), \
            FlopCounterMode(display=False, custom_mapping=CPU_SDPA_FLOPS) as counter:
        fn()
    return counter.get_total_flops()


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_once(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call (CUDA synchronized before and after)."""
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - start


def time_interleaved(fns: Mapping[str, Callable[[], object]], iters: int = 3,
                     warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each function: ``warmup`` untimed calls each, then
    ``iters`` rounds in which every function is called once, in turn."""
    if iters < 1 or warmup < 0:
        raise UserError(f"time_interleaved: iters must be >= 1 and warmup >= 0, got {iters}, {warmup}")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            times[name].append(time_once(fn))
    return {name: statistics.median(t) for name, t in times.items()}
