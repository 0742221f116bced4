"""Signatures that realise a given graph (NAC Table 1, "+ Sparse graph (not learnable)").

The ablation between "+ ModFC" and the full NAC freezes the connectivity: a graph is
sampled from a prior and the signatures are chosen so that the link probabilities
``P_ij = exp(-d(s_i, s_j)/ε)`` (NAC Eq. 2) reproduce it, then kept fixed. The paper
does not say how the signatures are chosen; we fit them by gradient descent on the
off-diagonal squared error ``Σ_{i≠j} (P_ij - A_ij)²`` (the form of Eq. 6 with the
identity permutation, since the target is given in the modules' own labels).

Note that ``d = 1 - cos ∈ [0, 2]`` bounds ``P`` below by ``exp(-2/ε)`` (0.135 at the
paper's ε = 1): a non-edge can be made improbable but not impossible.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..nn.kernel import cosine_distance
from ..errors import UserError

__all__ = ["fit_signatures"]


def fit_signatures(target: Tensor, d_sig: int, epsilon: float = 1.0, steps: int = 500,
                   lr: float = 0.05, seed: int = 0) -> Tensor:
    """Signatures ``[U, d_sig]`` whose ``P`` (NAC Eq. 2, bandwidth ``epsilon``) is closest
    to ``target`` ``[U, U]`` (an adjacency or link-probability matrix) off the diagonal.

    Deterministic given ``seed`` (its own generator; the global RNG is untouched)."""
    if target.dim() != 2 or target.shape[0] != target.shape[1]:
        raise UserError(f"target must be a square [U, U] matrix, got shape {tuple(target.shape)}")
    u = target.shape[0]
    g = torch.Generator().manual_seed(seed)
    target = target.detach().to(torch.float32).cpu()
    off = ~torch.eye(u, dtype=torch.bool)
    with torch.enable_grad(), torch.inference_mode(False):
        s = torch.randn(u, d_sig, generator=g).requires_grad_()
        opt = torch.optim.Adam([s], lr=lr)
        for _ in range(steps):
            p = torch.exp(-cosine_distance(s, s) / epsilon)
            loss = (p - target)[off].square().sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return torch.nn.functional.normalize(s.detach(), dim=-1)
