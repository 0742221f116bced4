"""Slow, literal re-statements of the papers' equations, one module and one pair at a
time, written independently of the library's vectorised code. Tests compare the
library against these."""
from __future__ import annotations

import math

import torch
from torch import Tensor


def layer_norm(v: Tensor, eps: float = 1e-5) -> Tensor:
    """LayerNorm without affine parameters, over the last axis."""
    mean = v.mean(-1, keepdim=True)
    var = ((v - mean) ** 2).mean(-1, keepdim=True)
    return (v - mean) / torch.sqrt(var + eps)


def modfc(x: Tensor, c: Tensor, W: Tensor, b: Tensor, Wc: Tensor, alpha: Tensor) -> Tensor:
    """NAC Eq. 1 for one module: y = W (x ⊙ (1 + α LN(W_c c))) + b; x [..., d_in], c [d_code]."""
    return (x * (1 + alpha * layer_norm(Wc @ c))) @ W.T + b


def modlin(x: Tensor, c: Tensor, W: Tensor, b: Tensor, Wc: Tensor) -> Tensor:
    """NI Eq. 4 for one module: y = W (x ⊙ LN(W_c c)) + b."""
    return (x * layer_norm(Wc @ c)) @ W.T + b


def link_prob(si: Tensor, sj: Tensor, eps: float) -> Tensor:
    """NAC Eq. 2: P_ij = exp(-d(s_i, s_j)/ε), d = 1 - cos."""
    cos = (si @ sj) / (si.norm() * sj.norm())
    return torch.exp(-(1 - cos) / eps)


def skmdpa_weights(q: Tensor, k: Tensor, K: Tensor, delta: float) -> Tensor:
    """NAC Eq. 3 for one head: W_ij = softmax_j(q_i·k_j/√d + log K̂_ij), K̂ = K / (δ + Σ_j K)."""
    d = q.shape[-1]
    W = torch.empty(q.shape[0], k.shape[0], dtype=q.dtype)
    for i in range(q.shape[0]):
        k_hat = K[i] / (delta + K[i].sum())
        logits = torch.stack([q[i] @ k[j] / math.sqrt(d) for j in range(k.shape[0])]) + torch.log(k_hat)
        W[i] = torch.softmax(logits, dim=0)
    return W


def _bias(layer) -> Tensor | float:
    return 0.0 if layer.bias is None else layer.bias


def read_in(attn, theta0: Tensor, x: Tensor, codes: Tensor) -> Tensor:
    """NAC Eq. 4-5 (the read-in attention) with a loop over modules u, using the weights of
    a ``ModulatedAttention`` (q, k, v, o are ModFC layers; H heads of the width its projections
    give, H·head_dim, which need not be d). theta0 [U, d], x [B, N, d_in], codes [U, d_code].
    Returns y [B, U, d] (before the residual and the ModFFN)."""
    H = attn.num_heads
    outs = []
    for u in range(theta0.shape[0]):
        c = codes[u]
        q = modfc(theta0[u], c, attn.q.weight, _bias(attn.q), attn.q.code_proj, attn.q.alpha)   # [H·dh]
        k = modfc(x, c, attn.k.weight, 0.0, attn.k.code_proj, attn.k.alpha)            # [B, N, H·dh], no key bias
        v = modfc(x, c, attn.v.weight, _bias(attn.v), attn.v.code_proj, attn.v.alpha)
        heads = []
        for h, (qh, kh, vh) in enumerate(zip(q.chunk(H, -1), k.chunk(H, -1), v.chunk(H, -1))):
            a = torch.softmax(kh @ qh / math.sqrt(qh.shape[-1]), dim=-1)                    # [B, N]
            heads.append(torch.einsum("bn,bne->be", a, vh))
        y_hat = torch.cat(heads, -1)                                                        # [B, H·dh]
        outs.append(modfc(y_hat, c, attn.o.weight, attn.o.bias, attn.o.code_proj, attn.o.alpha))
    return torch.stack(outs, dim=1)
