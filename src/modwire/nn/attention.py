"""Attention: one kernel function, and one projection module around it.

The split follows x-transformers: :func:`attend` is the attention kernel
(``softmax(q kᵀ/√d + bias) v``, NAC Eq. 3 with ``bias = log K̂``), run through the
fused ``F.scaled_dot_product_attention`` unless the weights are asked for;
:class:`ModulatedAttention` owns the (code-modulated) projections.

Keys and values can be conditioned on two different codes:

* ``kv_code="sender"``: on each sender's own code (NAC propagators and read-out,
  notes §1). Keys/values are projected once per sender, as in any transformer.
* ``kv_code="receiver"``: on the *receiving* module's code (the NAC read-in,
  NAC Eq. 4-5): every module sees its own keys ``k_uj = ModFC(x_j, c_u)`` and
  values. Materialising them costs ``B·U·N·d`` memory. Because ModFC is linear in
  ``x``, per head ``h``::

      q_u·k_uj   = ((W_k,hᵀ q_u) ⊙ m_u)·x_j + q_u·b_k,h
      Σ_j a_uj v_uj = W_v,h ((Σ_j a_uj x_j) ⊙ m_u) + b_v,h        (Σ_j a_uj = 1)

  so the read-in is one attention of the folded queries over the raw tokens,
  followed by a per-module value projection (``method="factorized"``, exact).
  ``q_u·b_k,h`` is constant over ``j`` and cancels in the softmax, so these layers
  have no key bias at all. The literal
  form is kept as ``method="literal"`` (reference and benchmark baseline).
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block_sparse import BlockSparseBias
from .kernel import KernelBias
from .modulated import Modulation, ModulatedLinear

ReadInMethod = Literal["factorized", "literal"]


def attend(q: Tensor, k: Tensor, v: Tensor, bias: KernelBias | Tensor | None = None,
           scale: float | None = None, return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """``softmax_j(q_i·k_j·scale + bias_ij) v_j`` (NAC Eq. 3 with ``bias = log K̂``).

    Shapes: q ``[B, H, Nq, dk]``, k ``[B, H, Nk, dk]``, v ``[B, H, Nk, dv]``; bias
    broadcastable to ``[B, H, Nq, Nk]``. A :class:`KernelBias` with ``has_sender``
    zeroes the output (and weights) of receivers that have no allowed sender.
    Returns ``(out [B, H, Nq, dv], weights [B, H, Nq, Nk] or None)``.
    """
    if isinstance(bias, BlockSparseBias):  # edge-eliminated propagators (modwire.nn.block_sparse)
        return bias.attend(q, k, v, scale, return_weights)
    has_sender = None
    if isinstance(bias, KernelBias):
        bias, has_sender = bias.log_kernel, bias.has_sender
    if bias is not None:
        bias = bias.to(q.dtype)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    weights = None
    if return_weights:  # reference path: explicit softmax
        scores = (q @ k.transpose(-1, -2)) * scale
        if bias is not None:
            scores = scores + bias
        weights = scores.softmax(dim=-1)
        out = weights @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    if has_sender is not None:
        keep = has_sender[:, None, :, None].to(out.dtype)  # [B|1, 1, Nq, 1]
        out = out * keep
        weights = None if weights is None else weights * keep
    return out, weights


def _heads(x: Tensor, h: int) -> Tensor:
    """``[B, N, H·d] → [B, H, N, d]``."""
    return x.unflatten(-1, (h, -1)).transpose(-3, -2)


def _merge(x: Tensor) -> Tensor:
    """``[B, H, N, d] → [B, N, H·d]``."""
    return x.transpose(-3, -2).flatten(-2)


class ModulatedAttention(nn.Module):
    """Multi-head attention with ModFC projections (NAC Eq. 3-5; PIO when unmodulated).

    Queries and the output projection are conditioned on the receiver's code; keys
    and values on the sender's (``kv_code="sender"``) or the receiver's
    (``kv_code="receiver"``, the factorized read-in) code.

    Args:
        dim: query/state width, also the attention width (heads split it).
        num_heads: ``H``.
        code_dim, modulation, alpha_init: as in :class:`ModulatedLinear`.
        kv_dim: width of the key/value inputs (default ``dim``).
    """

    def __init__(self, dim: int, num_heads: int, code_dim: int = 0, modulation: Modulation = "nac",
                 alpha_init: float = 0.1, kv_dim: int | None = None,
                 kv_code: Literal["sender", "receiver"] = "sender") -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        if kv_code not in ("sender", "receiver"):
            raise ValueError(f"kv_code must be 'sender' or 'receiver', got {kv_code!r}")
        kv_dim = dim if kv_dim is None else kv_dim
        self.num_heads, self.head_dim, self.kv_code = num_heads, dim // num_heads, kv_code
        mod = lambda i, o, bias=True: ModulatedLinear(i, o, code_dim, modulation, alpha_init, bias)  # noqa: E731
        # With receiver-conditioned keys, a key bias adds q_u·b_k to every score of row u:
        # constant over j, it cancels in the softmax and would never receive a gradient
        # (which DistributedDataParallel rejects). It is left out.
        self.q, self.v, self.o = mod(dim, dim), mod(kv_dim, dim), mod(dim, dim)
        self.k = mod(kv_dim, dim, bias=kv_code == "sender")

    def forward(self, x_q: Tensor, x_kv: Tensor, code_q: Tensor | None = None,
                code_kv: Tensor | None = None, bias: KernelBias | Tensor | None = None,
                return_weights: bool = False, method: ReadInMethod = "factorized",
                ) -> tuple[Tensor, Tensor | None]:
        """x_q ``[B, Uq, dim]`` or batch-free ``[Uq, dim]``; x_kv ``[B, Nk, kv_dim]``;
        code_q ``[(B,) Uq, d_code]``; code_kv ``[(B,) Nk, d_code]`` (sender codes).
        Returns ``(y [B, Uq, dim], weights [B, H, Uq, Nk] or None)``."""
        if self.kv_code == "receiver" and self.k.modulation != "none":
            read = self._receiver_factorized if method == "factorized" else self._receiver_literal
            return read(x_q, x_kv, code_q, bias, return_weights)
        b, h = x_kv.shape[0], self.num_heads
        q = _heads(self.q(x_q, code_q), h)
        q = q.expand(b, *q.shape[-3:]) if q.dim() == 3 else q
        code_kv = code_q if self.kv_code == "receiver" else code_kv  # unmodulated: ignored
        k, v = _heads(self.k(x_kv, code_kv), h), _heads(self.v(x_kv, code_kv), h)
        y, w = attend(q, k, v, bias, return_weights=return_weights)
        return self.o(_merge(y), code_q), w

    def _receiver_factorized(self, x_q, x, code, bias, return_weights):
        b, n, d_in = x.shape
        h, dh = self.num_heads, self.head_dim
        q = self.q(x_q, code).unflatten(-1, (h, dh))                     # [(B,) U, H, dh]
        w_k = self.k.weight.view(h, dh, d_in)
        q_fold = torch.einsum("...uhe,hei->...hui", q, w_k)               # W_k,hᵀ q_u
        q_fold = q_fold * self.k.modulation_factor(code).unsqueeze(-3)    # ⊙ m^k_u
        q_fold = q_fold.expand(b, *q_fold.shape[-3:]) if q_fold.dim() == 3 else q_fold
        xs = x.unsqueeze(1).expand(b, h, n, d_in)
        z, w = attend(q_fold, xs, xs, bias, scale=dh ** -0.5, return_weights=return_weights)
        z = z * self.v.modulation_factor(code).unsqueeze(-3)              # [B, H, U, d_in] ⊙ m^v_u
        y = torch.einsum("bhui,hei->buhe", z, self.v.weight.view(h, dh, d_in))
        y = y + self.v.bias.view(h, dh)
        if bias is not None and isinstance(bias, KernelBias) and bias.has_sender is not None:
            y = y * bias.has_sender[..., None, None].to(y.dtype)          # no sender, no message
        return self.o(y.flatten(-2), code), w

    def _receiver_literal(self, x_q, x, code, bias, return_weights):
        """NAC Eq. 4-5 as written: per-module keys and values over all inputs."""
        b, h = x.shape[0], self.num_heads
        q = _heads(self.q(x_q, code), h)                                  # [(B,) H, U, dh]
        q = q.expand(b, *q.shape[-3:]) if q.dim() == 3 else q
        m_k = self.k.modulation_factor(code).unsqueeze(-2)                # [(B,) U, 1, d_in]
        m_v = self.v.modulation_factor(code).unsqueeze(-2)
        xs = x.unsqueeze(1)                                               # [B, 1, N, d_in]
        k = F.linear(xs * m_k, self.k.weight)                             # [B, U, N, dim] (no key bias)
        v = F.linear(xs * m_v, self.v.weight, self.v.bias)
        k = k.unflatten(-1, (h, -1)).permute(0, 3, 1, 2, 4)               # [B, H, U, N, dh]
        v = v.unflatten(-1, (h, -1)).permute(0, 3, 1, 2, 4)
        scores = torch.einsum("bhue,bhune->bhun", q, k) * self.head_dim ** -0.5
        has_sender = None
        if isinstance(bias, KernelBias):
            bias, has_sender = bias.log_kernel, bias.has_sender
        if bias is not None:
            scores = scores + bias
        w = scores.softmax(dim=-1)
        y = torch.einsum("bhun,bhune->bhue", w, v)
        if has_sender is not None:
            y = y * has_sender[:, None, :, None].to(y.dtype)
        return self.o(_merge(y), code), (w if return_weights else None)


class AttentionBlock(nn.Module):
    """Pre-LN residual (self-)attention: ``x + Attn(LN(x), LN(x))``."""

    def __init__(self, dim: int, num_heads: int, code_dim: int = 0, modulation: Modulation = "nac",
                 alpha_init: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = ModulatedAttention(dim, num_heads, code_dim, modulation, alpha_init)

    def forward(self, x: Tensor, code: Tensor | None = None, bias: KernelBias | Tensor | None = None,
                return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        h = self.norm(x)
        y, w = self.attn(h, h, code, code, bias, return_weights)
        return x + y, w
