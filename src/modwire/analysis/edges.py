"""The edge curve of ``modwire analyze`` (NAC App. F, Fig. 10) and the learned graph
(Fig. 8), for runs with link probabilities ``P`` (a NAC with a kernel).

* **Eliminating edges**: for each fraction the smallest off-diagonal ``P_ij`` are set to 0
  (:func:`~modwire.analysis.sparsify.eliminate_edges`) and the copy is evaluated; its
  propagators are timed dense-masked and block-sparse
  (:func:`~modwire.analysis.sparsify.block_sparse`, modules ordered by the matched blocks
  of a planted-partition / ring-of-cliques prior, else by reverse Cuthill-McKee), and the
  two outputs compared.
* **The graph**: ``P`` in the frame of the run's graph prior (modules ordered by the
  matching to ``P0``) or, without a prior, by descending ``q_i``; a summary of the graph
  ``P_ij > 0.5``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .runs import AnalyzedRun, evaluate_run, forward, timing_batch

__all__ = ["GRAPH_THRESHOLD", "edge_curve", "graph_frame", "graph_summary", "link_probs", "prior_of"]

GRAPH_THRESHOLD = 0.5  # NAC Fig. 8


# ----------------------------------------------------------------------------- eliminating edges

def edge_curve(runs: Sequence[AnalyzedRun], fractions: Sequence[float], *, batch: int, iters: int,
               block_size: int | None, device: torch.device) -> list[dict[str, Any]]:
    """One row per (run with a graph, fraction): ``run, fraction_removed, edges_kept``, the
    task's metrics, dense-masked and block-sparse throughput, ``block_size``,
    ``block_density`` and ``block_sparse_max_abs_diff``."""
    rows: list[dict[str, Any]] = []
    for r in runs:
        if r.has_graph:
            rows += _edge_rows(r, fractions, batch=batch, iters=iters, block_size=block_size, device=device)
    return rows


def _edge_rows(run: AnalyzedRun, fractions: Sequence[float], *, batch: int, iters: int, block_size: int | None,
               device: torch.device) -> list[dict[str, Any]]:
    """The edge curve of one run; its propagators dense-masked vs block-sparse (the modules
    reordered so that kept edges form blocks), timed interleaved on the same batch."""
    from ..training import call_model
    from .flops import time_interleaved
    from .sparsify import block_sparse, eliminate_edges

    x = timing_batch(run, batch, device)
    groups, size = _block_plan(run, block_size)
    fns, rows = {}, []
    for f in fractions:
        m, mask = eliminate_edges(run.model, f)
        m.eval()
        kept = int((mask.sum().item() - mask.diagonal().sum().item()) // 2)
        row = {"run": run.name, "fraction_removed": f, "edges_kept": kept, **evaluate_run(run, m)}
        fast = block_sparse(m, size, groups)
        with torch.inference_mode():
            row["block_sparse_max_abs_diff"] = (call_model(fast, x) - call_model(m, x)).abs().max().item()
        row["block_size"] = size
        row["block_density"] = fast.propagator_kernel.pattern.layout.density
        fns[(f, "dense")] = (lambda m=m: forward(m, x, device, run.cfg.precision))
        fns[(f, "block")] = (lambda m=fast: forward(m, x, device, run.cfg.precision))
        rows.append(row)
    with torch.inference_mode():
        seconds = time_interleaved(fns, iters=iters, warmup=1)
    for row in rows:
        f = row["fraction_removed"]
        row["samples_per_s_dense_masked"] = batch / seconds[(f, "dense")]
        row["samples_per_s_block_sparse"] = batch / seconds[(f, "block")]
    return rows


def _block_plan(run: AnalyzedRun, block_size: int | None) -> tuple[torch.Tensor | None, int]:
    """How :func:`block_sparse` orders a run's modules: by the matched blocks of a
    planted-partition / ring-of-cliques prior (block size = U / number of blocks), else
    by reverse Cuthill-McKee (block size ``block_size`` or U / 8)."""
    from .sparsify import prior_groups

    name, params = prior_of(run)
    u = run.num_modules
    if name in ("planted_partition", "ring_of_cliques"):
        groups = prior_groups(run.model, name, **params)
        return groups, block_size or int(torch.bincount(groups).max())
    return None, block_size or max(1, -(-u // 8))


# ----------------------------------------------------------------------------- the learned graph

def link_probs(run: AnalyzedRun) -> torch.Tensor:
    """``P`` ``[U, U]`` of the run's model (NAC Eq. 2), float32 on the CPU."""
    with torch.no_grad():
        return run.model.link_probs().detach().float().cpu()


def prior_of(run: AnalyzedRun) -> tuple[str | None, dict[str, Any]]:
    """The run's graph prior: the model's ``graph_prior`` (NAC App. A), else its ``frozen_graph``
    (NAC Table 1 "sparse graph, not learnable"); (None, {}) if none."""
    if not run.has_graph:          # only a NAC with a kernel has P, and a NAC config these fields
        return None, {}
    gp, frozen = run.model.config.graph_prior, run.model.config.frozen_graph
    if gp.name:
        return gp.name, dict(gp.params or {})
    if frozen.name:
        return frozen.name, dict(frozen.params)
    return None, {}


def graph_frame(run: AnalyzedRun, p: torch.Tensor):
    """``(order, prior P0 or None, prior name, note)``: modules in the prior's frame
    (``argsort(σ)``, σ from ``modwire.graphs.match``) when the run has a prior, else by
    descending ``q_i``."""
    name, params = prior_of(run)
    by_q = torch.sort(p.sum(dim=1), descending=True, stable=True).indices
    if name is None:
        return by_q, None, None, "modules by descending q_i"
    from ..graphs import match, prior

    p0 = prior(name, p.shape[0], **params).float().cpu()
    gp = run.model.config.graph_prior
    align = gp.align if gp.name == name else None
    sigma = match(p, p0) if align is None else match(p, p0, align=align)   # as the regularizer matched
    sigma = torch.as_tensor(sigma, dtype=torch.long).cpu()
    return torch.argsort(sigma), p0, name, f"modules in the frame of prior {name!r} (matched)"


def graph_summary(run: AnalyzedRun) -> dict[str, Any]:
    """Edges of ``P_ij > 0.5`` (either direction), mean degree, and the range of ``q_i``."""
    p = link_probs(run)
    u = p.shape[0]
    above = (p > GRAPH_THRESHOLD) | (p.T > GRAPH_THRESHOLD)
    above.fill_diagonal_(False)
    n_edges = int(above.sum().item()) // 2
    q = p.sum(dim=1)
    return {"num_modules": u, "threshold": GRAPH_THRESHOLD, "edges_above_threshold": n_edges,
            "mean_degree": 2 * n_edges / u, "q_min": q.min().item(), "q_median": q.median().item(),
            "q_max": q.max().item(), "prior": prior_of(run)[0]}
