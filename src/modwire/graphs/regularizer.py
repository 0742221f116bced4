"""The graph structure regularizer of NAC App. A.1 (Eq. 6 and 9).

With ``P`` ``[U, U]`` the learned link probabilities (NAC Eq. 2) and ``P0`` ``[U, U]``
a prior (``modwire.graphs.priors``, Eq. 7-8)::

    L_graph = Σ_{i≠j} (P_ij - P0_{σ(i)σ(j)})²                 (Eq. 6)
    C_vw    = Σ_i (P_vi - P0_wi)²                             (Eq. 9)

where ``σ`` (``σ[v]`` = the prior node assigned to module ``v``) solves the linear
assignment problem on ``C`` (Hungarian method, ``scipy.optimize.linear_sum_assignment``,
on the CPU, once per call).

**Default: the paper's loss.** ``align="none"`` (default) evaluates Eq. 9 on ``P`` as
labelled, exactly as App. A writes it and as the authors' code does: row ``v`` of ``P``
is compared with row ``w`` of ``P0`` position by position, i.e. column ``i`` of ``P``
(module ``i``) is paired with column ``i`` of ``P0`` (prior node ``i``). The result
therefore depends on how the modules happen to be numbered, although App. A
("Permutation over Graph Nodes") intends the loss not to.

**Option: relabelling invariance.** ``align="degree"`` first puts ``P``'s columns in the
prior's frame: the module with the k-th largest degree ``q_v = Σ_i P_vi`` is paired with
the prior node with the k-th largest degree of ``P0`` (stable sorts, ties by index), an
assignment ``a0``; Eq. 9 is then evaluated on ``P[:, a0⁻¹]`` (column ``i`` ↔ module
``a0⁻¹(i)``). ``σ`` is then equivariant and the loss invariant to relabelling the
modules (for ``P`` without tied degrees or tied optimal assignments). Its effect on the
loss value is measured by ``modwire.experiments.graph_align``.
"""
from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from .priors import _resolve, prior
from ..errors import UserError
from ..fields import check_argument

__all__ = ["GraphRegularizer", "graph_loss", "match", "matching_cost"]

Align = Literal["degree", "none"]
ALIGNS = ("none", "degree")
LOSSES = ("mse", "kl")
REDUCTIONS = ("sum", "mean")
KL_EPS = 1e-6


def _check_square(P: Tensor, name: str = "P") -> int:
    if P.dim() != 2 or P.shape[0] != P.shape[1]:
        raise UserError(f"{name} must be a square [U, U] link-probability matrix, "
                        f"got shape {tuple(P.shape)}")
    return P.shape[0]


def matching_cost(P: Tensor, P0: Tensor) -> Tensor:
    """NAC Eq. 9: ``C_vw = Σ_i (P_vi - P0_wi)²``, ``[U, U]`` from ``P, P0`` ``[U, U]``
    (rows ``v`` of ``P`` against rows ``w`` of ``P0``; also works for ``[U, N]``
    and ``[W, N]``). Computed as ``rowsum(P²)[:, None] - 2 P P0ᵀ + rowsum(P0²)[None, :]``
    (one matmul, no ``U³`` tensor) and clamped at 0 against rounding."""
    sq = P.square().sum(1)[:, None] + P0.square().sum(1)[None, :]
    return torch.addmm(sq, P, P0.T, alpha=-2.0).clamp_(min=0.0)


def _degree_order(M: Tensor) -> Tensor:
    """Indices of the rows of ``M`` by decreasing row sum (stable: ties by index)."""
    return torch.sort(M.sum(1), descending=True, stable=True).indices


def _hungarian(cost: Tensor) -> Tensor:
    """``σ`` ``[U]`` (on ``cost``'s device) minimising ``Σ_v cost[v, σ(v)]``."""
    c = cost.detach().to("cpu", torch.float64).numpy()
    rows, cols = linear_sum_assignment(c)
    sigma = np.empty_like(cols)
    sigma[rows] = cols
    return torch.from_numpy(sigma).to(cost.device)


def _eq6(P: Tensor, P0: Tensor, sigma: Tensor) -> float:
    off = ~torch.eye(P.shape[0], dtype=torch.bool, device=P.device)
    return float((P - P0[sigma][:, sigma]).square()[off].sum())


@torch.no_grad()
def match(P: Tensor, P0: Tensor, align: Align = "none", iterations: int = 1) -> Tensor:
    """The permutation ``σ`` of NAC App. A.1: ``LongTensor [U]`` on ``P``'s device,
    ``σ[v]`` = the prior node (row of ``P0``) assigned to module ``v``.

    ``P, P0``: ``[U, U]``. The cost of Eq. 9 is formed on ``P``'s device in its dtype
    (``matching_cost``), then moved to the CPU as float64 for
    ``scipy.optimize.linear_sum_assignment``.

    ``align="none"`` (default): Eq. 9 on ``P`` as labelled, as App. A writes it and the
    authors' code computes it; NOT invariant to relabelling the modules.
    ``align="degree"``: Eq. 9 on ``P`` with its columns in the prior's frame, given by a
    degree matching (see the module docstring); relabelling-equivariant.
    ``iterations > 1``: each further Hungarian call re-aligns ``P``'s columns by the
    previous ``σ``; the ``σ`` with the lowest Eq. 6 value is kept.
    """
    U = _check_square(P)
    if P0.shape != P.shape:
        raise UserError(f"P0 must have P's shape {tuple(P.shape)}, got {tuple(P0.shape)}")
    check_argument("align", align, ALIGNS)
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise UserError(f"iterations must be an int >= 1, got {iterations!r}")
    P, P0 = P.detach(), P0.to(P.device, P.dtype)
    if align == "none":
        assign = torch.arange(U, device=P.device)           # module i ↔ prior node i
    else:
        assign = torch.empty(U, dtype=torch.long, device=P.device)
        assign[_degree_order(P)] = _degree_order(P0)          # a0: module → prior node
    best, best_loss = None, float("inf")
    for _ in range(iterations):
        # Σ_i P[v, a⁻¹(i)] P0[w, i] = Σ_m P[v, m] P0[w, a(m)]: permute P0's columns instead.
        sigma = _hungarian(matching_cost(P, P0[:, assign]))
        loss = _eq6(P, P0, sigma) if iterations > 1 else 0.0
        if loss < best_loss:
            best, best_loss = sigma, loss
        assign = sigma
    return best


def graph_loss(P: Tensor, P0: Tensor, sigma: Tensor, loss: str = "mse",
               reduction: str = "sum") -> Tensor:
    """NAC Eq. 6 over the off-diagonal entries (``P_ii = 1`` by definition), a scalar.

    ``P`` ``[U, U]`` (gradient flows to it), ``P0`` ``[U, U]`` (constant), ``sigma``
    ``LongTensor [U]`` from ``match``; the target is ``T = P0[σ][:, σ]``,
    ``T_ij = P0_{σ(i)σ(j)}``.

    * ``loss="mse"``: ``Σ_{i≠j} (P_ij - T_ij)²`` (Eq. 6).
    * ``loss="kl"``: ``Σ_{i≠j} KL(Bern(T_ij) ‖ Bern(P_ij))``
      ``= T log(T/P) + (1-T) log((1-T)/(1-P))`` (the "other distance" App. A allows).
      The prior is the reference: priors have exact 0/1 entries (``p_out = 0``,
      clipped Eq. 8), where ``KL(P ‖ T)`` would be infinite, while ``KL(T ‖ P)`` is
      finite (``0 log 0 = 0``) as long as ``P`` is clamped to ``[1e-6, 1 - 1e-6]``
      (no gradient to entries outside that range).

    ``reduction="mean"`` divides by the ``U(U-1)`` off-diagonal entries.
    """
    U = _check_square(P)
    check_argument("loss", loss, LOSSES)
    check_argument("reduction", reduction, REDUCTIONS)
    T = P0.to(P.device, P.dtype)[sigma][:, sigma].detach()
    if loss == "mse":
        per = (P - T).square()
    else:
        p = P.clamp(KL_EPS, 1.0 - KL_EPS)
        per = (torch.xlogy(T, T) - torch.xlogy(T, p)
               + torch.xlogy(1 - T, 1 - T) - torch.xlogy(1 - T, 1 - p))
    per = per.masked_fill(torch.eye(U, dtype=torch.bool, device=P.device), 0.0)
    total = per.sum()
    return total / max(U * (U - 1), 1) if reduction == "mean" else total


def _validate_prior(name: str, params: dict[str, Any]) -> None:
    """Eager check of a prior name and its parameters (values included, probed on a
    graph just large enough for any count parameter; counts > 1024 are checked later)."""
    _resolve(name, params)
    counts = [v for v in params.values() if isinstance(v, int) and not isinstance(v, bool)]
    probe = max([64, *counts])  # large enough for the default cluster / clique counts too
    if probe <= 1024:
        prior(name, probe, **params)


class GraphRegularizer(nn.Module):
    """NAC graph structure regularizer (App. A.1, Eq. 6-9): ``forward(P) → L_graph``.

    Args:
        prior: a prior name (``modwire.graphs.list_priors()``).
        params: keyword parameters of the prior (e.g. ``{"beta": 0.5}``).
        loss, reduction: see ``graph_loss``.
        align, iterations: see ``match``; the default ``align="none"`` is the paper's
            loss (Eq. 6 with the Eq. 9 cost on ``P`` as labelled).

    ``forward(P)`` with ``P`` ``[U, U]`` (e.g. ``model.link_probs()``) returns a scalar.
    ``σ`` is found once per call without gradient; afterwards ``last_permutation``
    (``LongTensor [U]``) and ``last_matching_seconds`` hold it and the wall time of
    the matching. The prior matrix is cached per ``(U, device, dtype)`` (not in the
    state dict). Scale the loss by a weight in the training objective.
    """

    def __init__(self, prior: str, params: dict[str, Any] | None = None, loss: str = "mse",
                 reduction: str = "sum", align: Align = "none", iterations: int = 1) -> None:
        super().__init__()
        self.prior_name, self.params = prior, dict(params or {})
        _validate_prior(prior, self.params)
        self.loss, self.reduction = check_argument("loss", loss, LOSSES), check_argument("reduction", reduction, REDUCTIONS)
        self.align = check_argument("align", align, ALIGNS)
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise UserError(f"iterations must be an int >= 1, got {iterations!r}")
        self.iterations = iterations
        self._cache: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}
        self.last_permutation: Tensor | None = None
        self.last_matching_seconds: float | None = None

    def prior_matrix(self, num_modules: int, device: torch.device | str | None = None,
                     dtype: torch.dtype = torch.float32) -> Tensor:
        """``P0`` ``[U, U]`` of this prior (NAC Eq. 7), cached per (U, device, dtype)."""
        key = (num_modules, torch.device(device or "cpu"), dtype)
        if key not in self._cache:
            self._cache[key] = prior(self.prior_name, num_modules, **self.params).to(key[1], dtype)
        return self._cache[key]

    def forward(self, P: Tensor) -> Tensor:
        U = _check_square(P)
        P0 = self.prior_matrix(U, P.device, P.dtype)
        start = time.perf_counter()
        sigma = match(P, P0, self.align, self.iterations)
        self.last_matching_seconds = time.perf_counter() - start
        self.last_permutation = sigma
        return graph_loss(P, P0, sigma, self.loss, self.reduction)

    @torch.no_grad()
    def permuted_prior(self, P: Tensor) -> Tensor:
        """``P0[σ][:, σ]`` ``[U, U]``: the prior in the modules' labelling, for plots
        next to ``P`` (``σ`` computed afresh for this ``P``)."""
        P0 = self.prior_matrix(_check_square(P), P.device, P.dtype)
        sigma = match(P, P0, self.align, self.iterations)
        return P0[sigma][:, sigma]

    def extra_repr(self) -> str:
        return (f"prior={self.prior_name!r}, params={self.params}, loss={self.loss!r}, "
                f"reduction={self.reduction!r}, align={self.align!r}, iterations={self.iterations}")
