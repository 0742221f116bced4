"""Literal, loop-by-loop definitions of the signature-kernel functions of ``modwire.nn.kernel``
(NAC Eq. 2-3; NI Eq. 2-3), one pair at a time, written from the specification only."""
from __future__ import annotations

import itertools

import torch
from torch import Tensor


def _dot(a: Tensor, b: Tensor) -> Tensor:
    s = a.new_zeros(())
    for x in range(a.shape[0]):
        s = s + a[x] * b[x]
    return s


def cosine_distance_literal(a: Tensor, b: Tensor) -> Tensor:
    """``d_ij = 1 - a_i·b_j / (|a_i| |b_j|)``: ``[..., Uq, Uk]`` from ``[..., Uq, d]``, ``[..., Uk, d]``
    (leading axes broadcast)."""
    lead = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    a = a.broadcast_to(lead + tuple(a.shape[-2:]))
    b = b.broadcast_to(lead + tuple(b.shape[-2:]))
    n_q, n_k = a.shape[-2], b.shape[-2]
    blocks = []
    for idx in itertools.product(*(range(n) for n in lead)):
        rows = []
        for i in range(n_q):
            ai = a[idx + (i,)]
            row = []
            for j in range(n_k):
                bj = b[idx + (j,)]
                row.append(1 - _dot(ai, bj) / (torch.sqrt(_dot(ai, ai)) * torch.sqrt(_dot(bj, bj))))
            rows.append(torch.stack(row))
        blocks.append(torch.stack(rows))
    return torch.stack(blocks).reshape(lead + (n_q, n_k))


def log_link_prob_literal(s_recv: Tensor, s_send: Tensor, epsilon) -> Tensor:
    """NAC Eq. 2: ``P_ij = exp(-d(s_i, s_j)/ε)``, returned as ``log P_ij = -d_ij/ε``."""
    return -cosine_distance_literal(s_recv, s_send) / epsilon


def normalize_literal(K: Tensor, dim: int, delta: float, mask: Tensor | None = None) -> Tensor:
    """``K̂ = K·1[mask] / (δ + Σ_dim K·1[mask])`` entry by entry: for every index, the sum runs
    over the slice through that index along ``dim`` (NAC Eq. 3 with dim=-1 over senders; NI Eq. 3
    with dim = the functions axis)."""
    shape = tuple(K.shape)
    dim = dim % len(shape)
    keep = torch.ones(shape, dtype=torch.bool) if mask is None else mask.broadcast_to(shape)
    zero = K.new_zeros(())
    out = []
    for idx in itertools.product(*(range(n) for n in shape)):
        total = zero
        for r in range(shape[dim]):
            other = idx[:dim] + (r,) + idx[dim + 1:]
            if bool(keep[other]):
                total = total + K[other]
        out.append(K[idx] / (delta + total) if bool(keep[idx]) else zero)
    return torch.stack(out).reshape(shape)


def ni_compatibility_literal(s: Tensor, t: Tensor, sigma, tau: float, eps: float) -> Tensor:
    """NI Eq. 2-3: ``C_ui = C̃_ui / (ε + Σ_u C̃_ui)``, ``C̃_ui = exp(-d(s_u, t_i)/σ)`` where
    ``d(s_u, t_i) = 1 - s_u·t_i ≤ τ``, else 0. s ``[..., U, d]`` and t ``[..., N, d]`` are unit
    vectors (only their directions matter: d is computed as 1 - cos); returns ``[..., U, N]``.

    The paper's Eq. 3 prints "if d > τ"; its text ("if this compatibility is larger than a
    threshold (τ), f_u is permitted access to x_i") and the library's specification keep the
    *close* pairs, d ≤ τ, which is what is written here."""
    lead = tuple(s.shape[:-2])
    n_u, n_i = s.shape[-2], t.shape[-2]
    zero = s.new_zeros(())
    blocks = []
    for idx in itertools.product(*(range(n) for n in lead)):
        c_tilde = [[zero] * n_i for _ in range(n_u)]
        for u in range(n_u):
            for i in range(n_i):
                su, ti = s[idx + (u,)], t[idx + (i,)]
                # NI Eq. 2: d = 1 - s_u·t_i for unit vectors, written as 1 - cos so that the
                # gradient is that of the distance on the sphere (the library normalises)
                d = 1 - _dot(su, ti) / (torch.sqrt(_dot(su, su)) * torch.sqrt(_dot(ti, ti)))
                if float(d.detach()) <= tau:
                    c_tilde[u][i] = torch.exp(-d / sigma)
        rows = []
        for u in range(n_u):
            row = []
            for i in range(n_i):
                total = zero
                for w in range(n_u):
                    total = total + c_tilde[w][i]
                row.append(c_tilde[u][i] / (eps + total))
            rows.append(torch.stack(row))
        blocks.append(torch.stack(rows))
    return torch.stack(blocks).reshape(lead + (n_u, n_i))
