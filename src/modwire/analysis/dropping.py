"""The module-dropping curve of ``modwire analyze`` (NAC §3 "Effect of Dropping Modules",
Fig. 5a/b, 15): for each fraction ``f`` a run's model loses ``round(f·U)`` modules of its
per-module axis — for a NAC with a kernel those with the smallest importance
``q_i = Σ_j P_ij`` (App. F Eq. 10), for a Perceiver IO latents
(:func:`~modwire.analysis.sparsify.drop_modules`) — and the copy is evaluated on the
validation split (every metric of the task), timed (samples/s, eval mode,
``torch.inference_mode``, median of a few batches, all models interleaved) and its FLOPs
counted (:func:`~modwire.analysis.flops.count_flops` on one batch / batch size)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .runs import AnalyzedRun, evaluate_run, forward, timing_batch
from ..errors import UserError

__all__ = ["check_drop_fractions", "module_dropping_curve"]


def check_drop_fractions(runs: Sequence[AnalyzedRun], fractions: Sequence[float]) -> None:
    """Every fraction leaves each run at least one module."""
    for r in runs:
        for f in fractions:
            k = round(f * r.num_modules)
            if k >= r.num_modules:
                raise UserError(f"--drop {f:g}: would drop all {r.num_modules} {r.noun} of {r.path} "
                                f"(round({f:g}·{r.num_modules}) = {k}); at least one must stay")


def module_dropping_curve(runs: Sequence[AnalyzedRun], fractions: Sequence[float], *, batch: int, iters: int,
                          device: torch.device) -> list[dict[str, Any]]:
    """One row per (run, fraction): ``run, model, fraction_dropped, modules_kept``, the
    task's metrics, ``samples_per_s`` and ``gflops_per_sample``."""
    rows, copies = _evaluate_dropped(runs, fractions)
    _time_dropped(runs, rows, copies, batch=batch, iters=iters, device=device)
    return rows


def _evaluate_dropped(runs: Sequence[AnalyzedRun], fractions: Sequence[float]):
    """Rows with the metrics of every dropped copy, and the copies ``{(run, f): model}``."""
    from .sparsify import drop_modules

    rows: list[dict[str, Any]] = []
    copies: dict[tuple[str, float], torch.nn.Module] = {}
    for r in runs:
        for f in fractions:
            k = round(f * r.num_modules)
            m = r.model if k == 0 else drop_modules(r.model, f).eval()
            copies[(r.name, f)] = m
            rows.append({"run": r.name, "model": r.cfg.model.name, "fraction_dropped": f,
                         "modules_kept": r.num_modules - k, **evaluate_run(r, m)})
    return rows, copies


def _time_dropped(runs: Sequence[AnalyzedRun], rows: list[dict[str, Any]], copies: dict, *, batch: int, iters: int,
                  device: torch.device) -> None:
    """Add throughput (interleaved over every copy) and FLOPs per sample to ``rows``."""
    from ..training import call_model
    from .flops import count_flops, time_interleaved

    fns, flops = {}, {}
    for r in runs:
        x = timing_batch(r, batch, device)
        for (name, f), m in copies.items():
            if name == r.name:
                fns[(name, f)] = (lambda m=m, x=x, r=r: forward(m, x, device, r.cfg.precision))
                flops[(name, f)] = count_flops(lambda m=m, x=x: call_model(m, x))
    with torch.inference_mode():
        seconds = time_interleaved(fns, iters=iters, warmup=1)
    for row in rows:
        key = (row["run"], row["fraction_dropped"])
        row["samples_per_s"] = batch / seconds[key]
        row["gflops_per_sample"] = flops[key] / batch / 1e9
