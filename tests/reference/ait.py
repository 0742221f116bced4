"""Literal, loop-by-loop re-statements of the Associative Transformer's global workspace
(AiT §4, Eq. 3-8), written from the paper's equations only, independently of
``modwire.nn.workspace``; float64 in the tests.

* Eq. 3 bottleneck attention, one head ``i``, slot ``j`` and pool position ``l`` at a time: each
  head's ``W^Q_i, W^K_i, W^V_i`` map to the slot width ``D`` (``A`` heads side by side), no biases
  (Eq. 1-3 print none), scores scaled by ``1/√D`` as printed, ``top-k`` taken from the softmax over
  the WHOLE pool (not renormalised), ``γ̂ = LN(Concat(heads) W^O)`` (the LayerNorm's own eps, 1e-6
  in the workspace): :func:`bottleneck_literal`.
  The workspace's options are re-stated there too: ``bias`` (biases on the four projections),
  ``head_split`` (heads of width ``D/A``, scale ``1/√(D/A)``), ``renormalise`` (the kept top-k),
  ``residual`` (the authors' code's ``γ̂ = LN(γ + Concat(heads) W^O)``);
* Eq. 4 EWMA and per-slot normalisation: :func:`memory_update_literal`;
* Eq. 5-6 balance loss with the unbiased variance (the authors' reading of "Var"): :func:`balance_literal`;
* Eq. 7-8 energy and one Hopfield step per token: :func:`energy_literal`, :func:`hopfield_literal`;
* the whole layer: ``Ξ = LN(h)``, the write, and ``Ξ + Ξ̂`` (§4.3's skip connection) for every
  token: :func:`workspace_literal` (without the write's Dropout: the tests turn it off).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .nac import layer_norm


def linear(x: Tensor, layer) -> Tensor:
    return x @ layer.weight.T + (0 if layer.bias is None else layer.bias)


def ln(x: Tensor, layer) -> Tensor:
    return layer_norm(x, layer.eps) * layer.weight + layer.bias


def bottleneck_literal(gamma: Tensor, pool: Tensor, ws, k: int | None, renormalise: bool = False,
                       residual: bool = False, head_split: bool = False) -> tuple[Tensor, Tensor]:
    """Eq. 3: ``γ [M, D]``, ``Ξ [L, E]``, the workspace's layers ``ws`` → ``(γ̂ [M, D], A [H, M, L])``.
    ``renormalise``: the kept weights divided by their sum (``bottleneck_softmax="kept"``);
    ``residual``: ``γ̂ = LN(γ + Concat(heads) W^O)`` (``write_residual``); ``head_split``: head ``i``
    owns columns ``i·D/A .. (i+1)·D/A`` of ``D``-wide projections, scale ``1/√(D/A)``."""
    m, d = gamma.shape
    n_pool, h = pool.shape[0], ws.num_heads
    dh = d // h if head_split else d                                  # Eq. 3: W^Q_i ∈ R^{D×D}, √D
    assert ws.q.weight.shape == (h * dh, d), "the projections' width does not match the reading"
    q, kk, v = linear(gamma, ws.q), linear(pool, ws.k), linear(pool, ws.v)
    heads, weights = [], torch.zeros(h, m, n_pool, dtype=pool.dtype)
    for i in range(h):
        cols = slice(i * dh, (i + 1) * dh)
        head_i = []
        for j in range(m):
            scores = torch.stack([q[j, cols] @ kk[l, cols] / math.sqrt(dh) for l in range(n_pool)])
            a = torch.exp(scores - scores.max())
            a = a / a.sum()                                           # softmax over the whole pool
            if k is not None and k < n_pool:                          # top-k(A): keep the k largest
                order = sorted(range(n_pool), key=lambda l: -float(a[l].detach()))
                kept = set(order[:k])
                a = torch.stack([a[l] if l in kept else a[l] * 0 for l in range(n_pool)])
                if renormalise:
                    a = a / a.sum()
            weights[i, j] = a
            head_i.append(sum(a[l] * v[l, cols] for l in range(n_pool)))
        heads.append(torch.stack(head_i))                             # [M, dh]
    concat = torch.cat(heads, dim=-1)                                 # [M, A·dh]
    out = linear(concat, ws.o)                                        # [M, D]
    return ln(gamma + out if residual else out, ws.write_norm), weights


def memory_update_literal(gamma: Tensor, gamma_hat: Tensor, alpha: float, unit_update: bool = False) -> Tensor:
    """Eq. 4: EWMA, then each slot divided by its L2 norm (implementation notes §4);
    ``unit_update``: each slot of ``γ̂`` divided by its norm first (``normalize_update``)."""
    if unit_update:
        gamma_hat = torch.stack([row / torch.sqrt(sum(x * x for x in row)) for row in gamma_hat])
    new = alpha * gamma + (1 - alpha) * gamma_hat
    return torch.stack([row / torch.sqrt(sum(x * x for x in row)) for row in new])


def balance_literal(weights: Tensor, eps: float) -> Tensor:
    """Eq. 5-6 for ``A [H, M, L]``: Σ_i of the two squared coefficients of variation (unbiased
    variance over the ``L`` positions; 0 for one position)."""
    h, m, n = weights.shape
    total = weights.new_zeros(())
    for i in range(h):
        importance = [sum(weights[i, j, l] for j in range(m)) for l in range(n)]
        loads = [sum(float(weights[i, j, l] > 0) for j in range(m)) for l in range(n)]
        for values in (importance, loads):
            mean = sum(values) / n
            if n > 1:
                var = sum((x - mean) ** 2 for x in values) / (n - 1)
                total = total + var / (mean ** 2 + eps)
    return total


def energy_literal(xi: Tensor, patterns: Tensor, beta: float) -> Tensor:
    """Eq. 7 for one state ``ξ [E]`` and attractors ``X [M, E]``."""
    m = patterns.shape[0]
    lse = torch.log(sum(torch.exp(beta * (x @ xi)) for x in patterns)) / beta
    zeta = max(torch.sqrt(x @ x) for x in patterns)
    return -lse + 0.5 * xi @ xi + math.log(m) / beta + 0.5 * zeta ** 2


def hopfield_literal(xi: Tensor, patterns: Tensor, beta: float, steps: int = 1) -> Tensor:
    """Eq. 8 by the update rule ``ξ ← Σ_i softmax_i(β X_i·ξ) X_i``, ``steps`` times; ``ξ [E]``."""
    for _ in range(steps):
        logits = torch.stack([beta * (x @ xi) for x in patterns])
        p = torch.exp(logits - logits.max())
        p = p / p.sum()
        xi = sum(p[i] * patterns[i] for i in range(len(patterns)))
    return xi


def workspace_literal(h: Tensor, ws, gamma: Tensor, k: int | None, pool: str) -> tuple[Tensor, Tensor]:
    """The whole layer: ``h [B, N, E]`` → ``(Ξ + Ξ̂ [B, N, E], γ^{t+1} [P, M, D])`` with ``Ξ = LN(h)``;
    ``pool`` is ``"batch"`` (one pool of all ``B·N`` tokens, §4.1) or ``"sample"``."""
    b, n, e = h.shape
    xi = torch.stack([torch.stack([ln(h[s, t], ws.norm) for t in range(n)]) for s in range(b)])
    pools = [xi.reshape(b * n, e)] if pool == "batch" else [xi[s] for s in range(b)]
    options = dict(renormalise=ws.bottleneck_softmax == "kept", residual=ws.write_residual, head_split=ws.head_split)
    memories = [memory_update_literal(gamma, bottleneck_literal(gamma, p, ws, k, **options)[0], ws.alpha,
                                      unit_update=ws.normalize_update) for p in pools]
    out = torch.empty_like(h)
    for s in range(b):
        patterns = linear(memories[0 if pool == "batch" else s], ws.up)       # f_LT(γ^{t+1})
        for t in range(n):
            out[s, t] = xi[s, t] + hopfield_literal(xi[s, t], patterns, ws.beta, ws.steps)
    return out, torch.stack(memories)
