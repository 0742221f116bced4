"""Graph priors for the NAC graph structure regularizer — NAC App. A.1, Eq. 7-8.

A prior is a *graphon* ``W: [0,1]² → [0,1]`` evaluated on the canonical grid
(NAC Eq. 7)::

    r_u = u / (U - 1),  u = 0, ..., U-1,        P0_ij = W(r_i, r_j)

(``r_0 = 0`` when ``U = 1``). The diagonal is set to 1, like the learned ``P``
(``P_ii = 1`` since ``d(s_i, s_i) = 0``, NAC Eq. 2); the regularizer ignores it.

Priors (``PRIORS`` / ``list_priors()``):

* ``erdos_renyi(p)`` — ``W = p`` (constant; NAC App. A, Erdős–Rényi).
* ``scale_free(beta=0.5, scale=None, offset=1.0)`` — NAC Eq. 8:
  ``W(r_i, r_j) = U^β/16 · (r_i + 1)^(-β) · (r_j + 1)^(-β)`` clipped to ``[0, 1]``.
  ``scale`` replaces ``U^β/16`` and ``offset`` replaces the ``+1`` (defaults: the
  paper). Note: with the paper's values on the Eq. 7 grid, expected degrees vary
  by at most a factor ``2^β ≈ 1.41`` (the graph is dense, not heavy-tailed), and
  once ``U^β/16 ≥ 4^β`` (``U ≥ 1024`` at β = 0.5) every entry clips to 1 (a
  complete graph). A small ``offset`` (e.g. ``1/U``)
  with a small ``scale`` gives a Chung–Lu graph with power-law degrees
  (``P(deg > k) ∝ k^(-1/β)``).
* ``planted_partition(num_clusters=8, p_in=0.5, p_out=0.02)`` — stochastic block
  model: node ``u`` is in block ``min(⌊r_u·K⌋, K-1)`` (contiguous blocks on the
  canonical ordering); ``p_in`` within a block, ``p_out`` between blocks.
* ``ring_of_cliques(num_cliques=8, p_in=0.9, p_bridge=0.05, p_out=0.0)`` —
  contiguous blocks as above; ``p_in`` within a clique, ``p_bridge`` between
  ring-adjacent cliques ``k`` and ``k+1 mod K`` (the last clique connects back
  to the first: a real ring, unlike the authors' chain), ``p_out`` otherwise.

Default parameters other than β are ours: the paper does not state them.
"""
from __future__ import annotations

import difflib
import inspect
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..errors import UnknownNameError, UserError, UserTypeError

if TYPE_CHECKING:  # networkx is optional (the ``analysis`` extra): imported in sample_graph
    import networkx as nx

__all__ = ["PRIORS", "list_priors", "prior", "grid", "block_assignment", "sample_adjacency",
           "sample_graph"]


def grid(num_modules: int) -> Tensor:
    """The canonical grid of NAC Eq. 7: ``r_u = u/(U-1)`` in float64, ``[U]``."""
    u = torch.arange(num_modules, dtype=torch.float64)
    return u / (num_modules - 1) if num_modules > 1 else u


def block_assignment(num_modules: int, num_blocks: int) -> Tensor:
    """Block of each node for the block graphons: ``min(⌊r_u·K⌋, K-1)`` with the
    Eq. 7 grid, computed in exact integer arithmetic. ``LongTensor [U]``."""
    u = torch.arange(num_modules)
    if num_modules == 1:
        return torch.zeros(1, dtype=torch.long)
    return torch.clamp((u * num_blocks) // (num_modules - 1), max=num_blocks - 1)


def _check_prob(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0):
        raise UserError(f"prior parameter {name!r} must be a probability in [0, 1], got {value!r}")
    return float(value)


def _check_count(name: str, value: int, num_modules: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= num_modules:
        raise UserError(f"prior parameter {name!r} must be an int in [1, num_modules={num_modules}], "
                        f"got {value!r}")
    return value


def erdos_renyi(num_modules: int, p: float = 0.1) -> Tensor:
    """Erdős–Rényi graphon (NAC App. A): ``W(r_i, r_j) = p``."""
    p = _check_prob("p", p)
    return torch.full((num_modules, num_modules), p, dtype=torch.float64)


def scale_free(num_modules: int, beta: float = 0.5, scale: float | None = None,
               offset: float = 1.0) -> Tensor:
    """Scale-free graphon of NAC Eq. 8 on the Eq. 7 grid, clipped to ``[0, 1]``:
    ``W(r_i, r_j) = scale · (r_i + offset)^(-β) · (r_j + offset)^(-β)`` with the
    paper's ``scale = U^β/16``, ``offset = 1``, ``β = 0.5``."""
    if not (isinstance(beta, (int, float)) and beta > 0):
        raise UserError(f"prior parameter 'beta' must be > 0, got {beta!r}")
    if not (isinstance(offset, (int, float)) and offset > 0):
        raise UserError(f"prior parameter 'offset' must be > 0, got {offset!r}")
    if scale is None:
        scale = num_modules ** beta / 16
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise UserError(f"prior parameter 'scale' must be > 0, got {scale!r}")
    w = (grid(num_modules) + offset) ** (-beta)
    return (scale * torch.outer(w, w)).clamp(0.0, 1.0)


def planted_partition(num_modules: int, num_clusters: int = 8, p_in: float = 0.5,
                      p_out: float = 0.02) -> Tensor:
    """Planted-partition / stochastic-block graphon (NAC App. A, [15, 25]): contiguous
    blocks on the canonical ordering, ``p_in`` within and ``p_out`` between blocks."""
    k = _check_count("num_clusters", num_clusters, num_modules)
    p_in, p_out = _check_prob("p_in", p_in), _check_prob("p_out", p_out)
    b = block_assignment(num_modules, k)
    same = b[:, None] == b[None, :]
    return torch.where(same, p_in, p_out).to(torch.float64)


def ring_of_cliques(num_modules: int, num_cliques: int = 8, p_in: float = 0.9,
                    p_bridge: float = 0.05, p_out: float = 0.0) -> Tensor:
    """Ring-of-cliques graphon (NAC App. A, [38]): ``p_in`` within a clique,
    ``p_bridge`` between cliques ``k`` and ``(k+1) mod K`` — including the last and
    the first, so the cliques form a ring — and ``p_out`` between other cliques."""
    k = _check_count("num_cliques", num_cliques, num_modules)
    p_in, p_bridge, p_out = (_check_prob("p_in", p_in), _check_prob("p_bridge", p_bridge),
                             _check_prob("p_out", p_out))
    b = block_assignment(num_modules, k)
    diff = (b[:, None] - b[None, :]) % k
    adjacent = (diff == 1) | (diff == k - 1)
    out = torch.full((num_modules, num_modules), p_out, dtype=torch.float64)
    out[adjacent] = p_bridge
    out[diff == 0] = p_in
    return out


PRIORS: dict[str, Callable[..., Tensor]] = {
    "erdos_renyi": erdos_renyi,
    "planted_partition": planted_partition,
    "ring_of_cliques": ring_of_cliques,
    "scale_free": scale_free,
}


def list_priors() -> list[str]:
    """Names of the available graph priors, sorted."""
    return sorted(PRIORS)


def _resolve(name: str, params: dict[str, Any]) -> Callable[..., Tensor]:
    if name not in PRIORS:
        close = difflib.get_close_matches(str(name), list_priors(), n=3)
        hint = f" Did you mean {close}?" if close else ""
        raise UnknownNameError(f"unknown graph prior {name!r}.{hint} Valid: {list_priors()}")
    fn = PRIORS[name]
    valid = [p for p in inspect.signature(fn).parameters if p != "num_modules"]
    bad = sorted(set(params) - set(valid))
    if bad:
        raise UserTypeError(f"graph prior {name!r} got unknown parameter(s) {bad}; valid: {valid}")
    return fn


def prior(name: str, num_modules: int, **params: Any) -> Tensor:
    """Prior link probabilities ``P0`` ``[U, U]`` (float32, symmetric, diagonal 1):
    graphon ``name`` on the grid of NAC Eq. 7 (see the module docstring)."""
    fn = _resolve(name, params)
    if isinstance(num_modules, bool) or not isinstance(num_modules, int) or num_modules < 1:
        raise UserError(f"num_modules must be a positive int, got {num_modules!r}")
    p0 = fn(num_modules, **params)
    p0.fill_diagonal_(1.0)
    return p0.to(torch.float32)


def sample_adjacency(name: str, num_modules: int, seed: int = 0, **params: Any) -> Tensor:
    """A random graph from prior ``name`` as a dense 0/1 adjacency matrix ``A``
    ``[U, U]`` (float32, symmetric): every edge ``i < j`` is drawn independently with
    probability ``P0_ij`` (NAC App. A) by a ``numpy`` Generator seeded by ``seed``.

    The diagonal is 1, like ``P`` and ``P0`` (``P_ii = 1``), so ``A`` can stand in for
    a link-probability matrix, e.g. as a target to fit signatures to; subtract 1 from
    the row sums for degrees. Needs no networkx; ``sample_graph`` draws the same graph."""
    p0 = prior(name, num_modules, **params).double().numpy()
    rng = np.random.default_rng(seed)
    i, j = np.triu_indices(num_modules, k=1)
    keep = rng.random(i.shape[0]) < p0[i, j]
    adj = np.eye(num_modules, dtype=np.float32)
    adj[i[keep], j[keep]] = 1.0
    adj[j[keep], i[keep]] = 1.0
    return torch.from_numpy(adj)


def sample_graph(name: str, num_modules: int, seed: int = 0, **params: Any) -> "nx.Graph":
    """The graph of ``sample_adjacency(name, num_modules, seed, **params)`` as a
    ``networkx.Graph`` (nodes ``0..U-1`` in the canonical order, no self-loops).
    Needs networkx: ``pip install modwire[analysis]``."""
    try:
        import networkx as nx
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("sample_graph needs networkx, an optional dependency: "
                          "pip install modwire[analysis] (or use sample_adjacency, which "
                          "returns a dense tensor and needs no networkx)") from err
    adj = sample_adjacency(name, num_modules, seed, **params).numpy()
    i, j = np.nonzero(np.triu(adj, k=1))
    g = nx.Graph()
    g.add_nodes_from(range(num_modules))
    g.add_edges_from(zip(i.tolist(), j.tolist()))
    return g
