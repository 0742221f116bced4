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


def app_c_preprocessor(p: dict[str, Tensor], images: Tensor, *, eps: float, down_norm: str = "after",
                       block_norms: int = 2) -> Tensor:
    """NAC App. C's convolutional preprocessor, one image and one pixel at a time, from the
    parameters ``p`` named as a ``ConvTokenizer``'s: conv 4×4 stride 4, LayerNorm over the channels;
    a ConvNeXt block (7×7 depthwise conv with zero padding 3; per pixel LN → linear ×4 → GELU → LN
    → linear, each LN optional per ``block_norms`` (2: both, 1: the first), times the layer scale
    if ``p`` has one; plus the input); conv 2×2 stride 2 followed by a LayerNorm (``down_norm=
    "after"``) or preceded by one (``"before"``); then each pixel's features followed by its
    learned position. ``images [B, C, S, S] → [B, (S/8)², C₂ + pos_dim]``, pixels row by row."""

    def ln(v, name):               # over the leading (channel) axis
        return layer_norm(v.movedim(0, -1), eps).movedim(-1, 0) * _col(p[name + ".weight"], v) \
            + _col(p[name + ".bias"], v)

    def conv(x, name, k):          # kernel = stride = k
        w, out = p[name + ".weight"], []
        for i in range(x.shape[1] // k):
            out.append([(w * x[:, i * k:(i + 1) * k, j * k:(j + 1) * k]).sum((1, 2, 3)) + p[name + ".bias"]
                        for j in range(x.shape[2] // k)])
        return torch.stack([torch.stack(row, -1) for row in out], -2)         # [C_out, H/k, W/k]

    tokens = []
    for x in images:
        h = ln(conv(x, "stem.0", 4), "stem.1")
        dw, block = depthwise7(h, p["block.dwconv.weight"], p["block.dwconv.bias"]), torch.empty_like(h)
        for i in range(h.shape[1]):
            for j in range(h.shape[2]):
                v = ln(dw[:, i, j], "block.norm1") @ p["block.fc1.weight"].T + p["block.fc1.bias"]
                v = 0.5 * v * (1 + torch.erf(v / math.sqrt(2.0)))
                v = ln(v, "block.norm2") if block_norms == 2 else v
                v = v @ p["block.fc2.weight"].T + p["block.fc2.bias"]
                block[:, i, j] = h[:, i, j] + (p["block.layer_scale"] * v if "block.layer_scale" in p else v)
        h = ln(conv(block, "down.0", 2), "down.1") if down_norm == "after" else conv(ln(block, "down.0"), "down.1", 2)
        pixels = [h[:, i, j] for i in range(h.shape[1]) for j in range(h.shape[2])]
        tokens.append(torch.stack([torch.cat([v, p["pos"][n]]) for n, v in enumerate(pixels)]))
    return torch.stack(tokens)


def depthwise7(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """A 7×7 depthwise conv with zero padding 3, pixel by pixel: ``x [C, H, W]``, ``weight [C, 1, 7, 7]``
    → ``[C, H, W]`` (ConvNeXt's ``dwconv``)."""
    c, rows, cols = x.shape
    padded = torch.zeros(c, rows + 6, cols + 6, dtype=x.dtype)
    padded[:, 3:3 + rows, 3:3 + cols] = x
    out = torch.empty_like(x)
    for i in range(rows):
        for j in range(cols):
            out[:, i, j] = (weight[:, 0] * padded[:, i:i + 7, j:j + 7]).sum((1, 2)) + bias
    return out


def _col(v: Tensor, like: Tensor) -> Tensor:
    """A per-channel vector shaped to scale ``like`` ``[C, ...]`` along its first axis."""
    return v.reshape(v.shape + (1,) * (like.dim() - 1))
