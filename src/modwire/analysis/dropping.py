"""The module-dropping curve of ``modwire analyze`` (NAC §3 "Effect of Dropping Modules",
Fig. 5a/b, 15): for each fraction ``f`` a run's model loses ``k = round(f·U)`` modules of its
per-module axis, and the copy is evaluated on the validation split (every metric of the
task), timed (samples/s, eval mode, ``torch.inference_mode``, median of a few batches, all
models interleaved) and its FLOPs counted (:func:`~modwire.analysis.flops.count_flops` on one
batch / batch size).

Which modules go:

* **the model's own order** (always; ``order`` ``"importance"`` or ``"last"``): for a NAC with
  a kernel the ``k`` with the smallest importance ``q_i = Σ_j P_ij`` (App. F Eq. 10, the
  paper's Fig. 5 protocol), otherwise (a Perceiver IO: the paper does not say which latents it
  drops) the last ``k`` (:func:`~modwire.analysis.sparsify.modules_to_keep`);
* **random draws** (``draws > 0``; ``order`` ``"random"``): ``draws`` random drop orders
  (:func:`drop_orders`), each a permutation of the ``U`` indices whose first ``k`` are dropped.
  Runs with the same ``U`` (the NAC and Perceiver IO of the demo: 64 modules, 64 latents) get
  the same orders, so their copies lose the same index subsets; within a draw the subsets are
  nested across fractions. :func:`drop_stats` gives each metric's mean and sample std over the
  draws.

Work the draws share is done once: the undropped model (``k = 0``) is evaluated once per run
and its metrics given to every draw, and throughput and FLOPs (which depend on ``U - k``, not
on which modules stay) are measured on the own-order copy and given to every draw of its
fraction.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .runs import AnalyzedRun, evaluate_run, forward, timing_batch
from ..errors import UserError

__all__ = ["check_drop_fractions", "check_draws", "drop_orders", "drop_stats", "module_dropping_curve"]

Progress = Callable[[int, int], None]   # (copies evaluated, copies in all)


def check_drop_fractions(runs: Sequence[AnalyzedRun], fractions: Sequence[float]) -> None:
    """Every fraction leaves each run at least one module."""
    for r in runs:
        for f in fractions:
            k = round(f * r.num_modules)
            if k >= r.num_modules:
                raise UserError(f"--drop {f:g}: would drop all {r.num_modules} {r.noun} of {r.path} "
                                f"(round({f:g}·{r.num_modules}) = {k}); at least one must stay")


def check_draws(draws: Any, seed: Any) -> tuple[int, int]:
    """``draws``: 0 (the model's own order only) or >= 2 (a spread needs two draws); ``seed`` an int."""
    for name, v in (("--draws", draws), ("--draw-seed", seed)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"{name}: expected an integer, got {v!r}")
    if draws == 1 or draws < 0:
        raise UserError(f"--draws: expected 0 (only the model's own drop order) or at least 2 random drop "
                        f"orders (a mean and a spread need two), got {draws}")
    return draws, seed


def drop_orders(u: int, draws: int, seed: int) -> list[torch.Tensor]:
    """``draws`` random drop orders of ``u`` modules (permutations of ``range(u)``, first dropped
    first), drawn in turn from ``torch.Generator().manual_seed(seed)``: the same ``(u, draws, seed)``
    always gives the same orders, whichever model they are applied to."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(u, generator=g) for _ in range(draws)]


def module_dropping_curve(runs: Sequence[AnalyzedRun], fractions: Sequence[float], *, batch: int, iters: int,
                          device: torch.device, draws: int = 0, draw_seed: int = 0,
                          progress: Progress | None = None) -> list[dict[str, Any]]:
    """One row per (run, fraction, drop order): ``run, model, fraction_dropped, modules_kept,
    order, draw, dropped`` (the dropped indices), the task's metrics, ``samples_per_s`` and
    ``gflops_per_sample``. ``draw`` is None for the model's own order, ``0..draws-1`` for the
    random draws (:func:`drop_orders` with ``draw_seed``); ``progress(done, total)`` is called after
    each evaluated copy."""
    rows, copies = _evaluate_dropped(runs, fractions, draws, draw_seed, progress)
    _time_dropped(runs, rows, copies, batch=batch, iters=iters, device=device)
    return rows


def _own_order(run: AnalyzedRun) -> str:
    """The name of the order :func:`~modwire.analysis.sparsify.modules_to_keep` uses without one given."""
    return "importance" if run.has_graph else "last"


def _evaluate_dropped(runs: Sequence[AnalyzedRun], fractions: Sequence[float], draws: int, seed: int,
                      progress: Progress | None):
    """Rows with the metrics of every dropped copy, and one copy per ``(run, f)`` to time."""
    from .sparsify import keep_modules, modules_to_keep

    ks = {r.name: [round(f * r.num_modules) for f in fractions] for r in runs}
    total = sum(1 + sum(1 + draws for k in ks[r.name] if k) for r in runs)
    done = 0
    rows: list[dict[str, Any]] = []
    copies: dict[tuple[str, float], torch.nn.Module] = {}

    def score(r: AnalyzedRun, model: torch.nn.Module) -> dict[str, float]:
        nonlocal done
        metrics = evaluate_run(r, model)
        done += 1
        if progress is not None:
            progress(done, total)
        return metrics

    for r in runs:
        orders = drop_orders(r.num_modules, draws, seed)
        undropped = score(r, r.model)
        for f, k in zip(fractions, ks[r.name]):
            base = {"run": r.name, "model": r.cfg.model.name, "fraction_dropped": f, "modules_kept": r.num_modules - k}
            own = modules_to_keep(r.model, k)
            copies[(r.name, f)] = r.model if k == 0 else keep_modules(r.model, own).eval()
            rows.append({**base, "order": _own_order(r), "draw": None, "dropped": _dropped(own, r.num_modules),
                         **(undropped if k == 0 else score(r, copies[(r.name, f)]))})
            for d, order in enumerate(orders):
                kept = modules_to_keep(r.model, k, order=order)
                metrics = undropped if k == 0 else score(r, keep_modules(r.model, kept).eval())
                rows.append({**base, "order": "random", "draw": d, "dropped": _dropped(kept, r.num_modules),
                             **metrics})
    return rows, copies


def _dropped(keep: torch.Tensor, u: int) -> list[int]:
    """The sorted indices not in ``keep``."""
    mask = torch.ones(u, dtype=torch.bool)
    mask[keep] = False
    return mask.nonzero().squeeze(1).tolist()


def drop_stats(rows: Sequence[dict[str, Any]], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Per (run, fraction), over the random draws: ``run, model, fraction_dropped, modules_kept,
    draws`` and each metric's ``<metric>_mean`` and ``<metric>_std`` (sample std, ``n - 1``)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        if row["order"] == "random":
            groups.setdefault((row["run"], row["fraction_dropped"]), []).append(row)
    stats = []
    for group in groups.values():
        first = group[0]
        stat = {k: first[k] for k in ("run", "model", "fraction_dropped", "modules_kept")}
        stat["draws"] = len(group)
        for m in metrics:
            values = [float(row[m]) for row in group]
            stat[f"{m}_mean"] = statistics.fmean(values)
            stat[f"{m}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        stats.append(stat)
    return stats


def _time_dropped(runs: Sequence[AnalyzedRun], rows: list[dict[str, Any]], copies: dict, *, batch: int, iters: int,
                  device: torch.device) -> None:
    """Add throughput (interleaved over every copy) and FLOPs per sample to ``rows``: one copy per
    ``(run, fraction)`` is measured, every draw of that fraction gets its numbers."""
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
