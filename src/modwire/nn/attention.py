"""The one attention kernel of modwire: :func:`attend`.

``softmax_j(scale · q_i·k_j + bias_ij) v_j`` over any leading batch axes, with the
options the four papers need, each with one meaning:

* ``bias``: an additive logit bias, e.g. NAC Eq. 3's ``log K̂``.
* ``key_mask``: bool, False where key ``j`` may not be read by query ``i``. A query with no
  allowed key returns **zeros** (and finite, zero gradients). Derivation, done once here:
  masked logits get a large *finite* negative value (:func:`mask_value`), so the softmax of
  an all-masked row is finite (uniform) instead of the NaN of ``softmax(-inf, …)``; that
  row's output is then multiplied by ``any_j key_mask_ij = 0``, which zeroes it and every
  gradient flowing through it.
* ``topk``: only the ``k`` highest scores of each row take part (NFM Algorithm 1, AiT
  Eq. 3). Exactly ``min(k, allowed keys)`` keys are kept per row; a tie at the boundary is
  broken by :func:`torch.topk` (implementation-defined). ``k ≥`` the number of keys is
  plain attention. ``topk_softmax`` says over which keys the softmax is normalised:
  ``"kept"`` (default; NFM §3.2.1's text: "the attention only attends over the elements with
  the top-k highest attention scores", a softmax over the kept scores, so the kept weights sum
  to 1), ``"all"`` (AiT Eq. 3, ``top-k(softmax(·))``: the kept entries of the softmax over ALL
  keys, so they sum to ≤ 1) or ``"subtract"`` (Ke et al. 2018's sparse attention as in the NFM
  authors' code, ``SparseAttention`` in ``attentive_densenet.py``: the softmax over all keys
  ``w``, minus its (k+1)-th largest weight ``w_(k+1)`` (plus ``1e-7``), clipped at 0 and
  renormalised, ``w'_j = max(0, w_j - w_(k+1) - ε) / (ε + Σ_l max(0, w_l - w_(k+1) - ε))``
  with ``ε = 1e-7``; gradients flow through ``w_(k+1)`` too; as in their code a row of at most
  ``k + 1`` keys keeps the plain softmax).
* ``null_kv``: a zero key and a zero value are prepended, so a query can read nothing (NFM
  "Default Computation"): its score is 0, it is always allowed and competes in top-k.
* ``row_scale``: multiplies each query's output (NI Eq. 7-10, ``C_ui``).
* ``key_scale`` (``c_j ≥ 0``) with ``renorm_eps`` (``ε ≥ 0``): NI Eq. 7's kernel-modulated,
  renormalised weights ``W_ij = r_i c_j s_ij / (ε + Σ_j r_i c_j s_ij)``, where
  ``s = softmax_j(scale·q·k + bias)`` and ``r_i`` = ``row_scale`` (1 if None). (The paper
  prints ``W̃_ij / (ε + W̃_ij)``; the sum over ``j`` is meant, as in the authors' code and
  implementation notes §2.) Here ``row_scale`` enters the weights instead of multiplying the
  output afterwards. The fused path uses, exactly::

      out_i = Σ_j W_ij v_j = r_i Σ_j s_ij c_j v_j / (ε + r_i Σ_j s_ij c_j)

  i.e. ONE fused softmax-attention over the augmented values ``[c_j v_j, c_j]`` gives the
  numerator (first ``dv`` columns) and ``Σ_j s_ij c_j`` (last column). No ``log c_j`` enters
  the logits, so ``c_j = 0`` is exact and finite. A row whose denominator is 0 (``ε = 0`` and
  ``r_i Σ_j s_ij c_j = 0``) reads nothing: zeros, like a row with no allowed key.

The fused ``F.scaled_dot_product_attention`` runs whenever the options allow (no weights
asked for, no top-k); the explicit softmax path only where needed. ``backend="flex"`` runs those
calls on FlexAttention instead (:mod:`modwire.nn.flex`: the bias as a ``score_mod``, whose gradient
FlexAttention's backward computes, on a GPU in its fused kernel; the mask as a block mask), the same
maths; where torch's FlexAttention cannot run a call (a gradient on the CPU) it takes the SDPA path.

A precomputed sparse execution (e.g. :class:`modwire.nn.block_sparse.BlockSparseBias`) can
be passed as ``bias``: any object with an ``attend(q, k, v, *, scale, return_weights)``
method (:class:`AttentionPattern`); this module does not import it.

:class:`ModulatedAttention` owns the (code-modulated) projections around :func:`attend`
(the split of x-transformers' ``attend.py``). Keys and values can be conditioned on two
different codes:

* ``kv_code="sender"``: on each sender's own code (NAC propagators and read-out, notes §1).
* ``kv_code="receiver"``: on the *receiving* module's code (the NAC read-in, Eq. 4-5): every
  module sees its own keys ``k_uj = ModFC(x_j, c_u)`` and values. Materialising them costs
  ``B·U·N·d``. Because ModFC is linear in ``x``, per head ``h``::

      q_u·k_uj      = ((W_k,hᵀ q_u) ⊙ m_u)·x_j + q_u·b_k,h
      Σ_j a_uj v_uj = W_v,h ((Σ_j a_uj x_j) ⊙ m_u) + (Σ_j a_uj) b_v,h

  so the read-in is one attention of the folded queries over the raw tokens, followed by a
  per-module value projection (``method="factorized"``, exact). ``q_u·b_k,h`` is constant
  over ``j`` and cancels in the softmax, so no attention here has a key bias. ``Σ_j a_uj`` is 1,
  or 0 for a module that may read no token: it is read off a column of ones appended to the
  values, so the "no allowed key → zero message" rule of :func:`attend` carries through.
  The literal form is kept as ``method="literal"`` (reference and benchmark baseline).
"""
from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import flex
from .modulated import PLAIN, ModulationSpec
from ..errors import UserError, UserTypeError
from ..fields import check_argument


def mask_value(dtype: torch.dtype) -> float:
    """A large finite negative logit bias: exp() of it is 0, adding scores stays finite."""
    return -1e9 if dtype in (torch.float32, torch.float64) else torch.finfo(dtype).min / 4


@runtime_checkable
class AttentionPattern(Protocol):
    """A precomputed, sparse way of running :func:`attend` (bias and mask folded in)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, scale: float | None,
               return_weights: bool) -> tuple[Tensor, Tensor | None]: ...


def _check(q: Tensor, k: Tensor, v: Tensor, key_mask, topk) -> None:
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim() or q.shape[-1] != k.shape[-1] \
            or k.shape[-2] != v.shape[-2]:
        raise UserError(f"attend expects q [..., Nq, dk], k [..., Nk, dk], v [..., Nk, dv]; got q "
                        f"{list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}")
    if key_mask is not None and key_mask.dtype != torch.bool:
        raise UserTypeError(f"attend: key_mask must be a bool tensor (True = allowed), got {key_mask.dtype}")
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int) or topk < 1):
        raise UserError(f"attend: topk must be a positive int, got {topk!r}")


def _prepend_null(k: Tensor, v: Tensor, bias: Tensor | None, key_mask: Tensor | None):
    """NFM "Default Computation": a zero key/value in front; its bias is 0, it is always allowed.
    (A bias or mask broadcast over the keys is expanded first, so the pad adds one column.)"""
    n = k.shape[-2]
    if bias is not None and bias.shape[-1] != n:
        bias = bias.expand(*bias.shape[:-1], n)
    if key_mask is not None and key_mask.shape[-1] != n:
        key_mask = key_mask.expand(*key_mask.shape[:-1], n)
    k = F.pad(k, (0, 0, 1, 0))
    v = F.pad(v, (0, 0, 1, 0))
    if bias is not None:
        bias = F.pad(bias, (1, 0))
    if key_mask is not None:
        key_mask = F.pad(key_mask, (1, 0), value=True)
    return k, v, bias, key_mask


def _select_topk(scores: Tensor, k: int, dim: int = -1) -> Tensor:
    """Bool, shaped like ``scores``: the ``k`` highest entries along the last axis ``dim`` (already
    masked scores). A keys axis that is not the last (NFM's readers) takes :func:`_rank_pick`."""
    idx = scores.topk(k, dim=dim).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(dim, idx, True)


def _rank_pick(x: Tensor, n: int, dim: int, largest: bool) -> tuple[Tensor, Tensor]:
    """The ``n`` largest (``largest``) or smallest entries of finite ``x`` along ``dim``, picked one at a
    time with ties ordered by index (the lower index counts as the larger, as ``torch.topk`` keeps it):
    ``(picked, value)``, ``picked`` a 0/1 tensor of ``x``'s dtype and shape (no gradient), ``value`` the
    ``n``-th pick's value (``dim`` kept, size 1; its gradient goes to that entry, as ``topk``'s). Only
    reductions over ``dim`` and elementwise float ops (comparisons written to float tensors): on CPU
    ``topk`` sorts each strided row and bool masks take scalar loops (``benchmarks/profile_nfm.py``'s
    ``keys_axis_topk`` times the former rule against this one). bf16 / fp16 are picked in float32 (exact:
    every index stays a distinct priority; bf16 counts integers exactly only up to 256)."""
    y = x.detach().float() if x.element_size() < 4 else x.detach()
    size = x.shape[dim]
    shape = [1] * x.dim()
    shape[dim] = size
    order = torch.arange(1, size + 1, dtype=y.dtype, device=x.device)     # a tie: the lower index is larger
    prio = (order.flip(0) if largest else order).view(shape)
    big = torch.finfo(y.dtype).max * (-1 if largest else 1)                 # moves a picked entry out of reach
    picked = None
    for i in range(n):
        extreme = y.amax(dim, keepdim=True) if largest else y.amin(dim, keepdim=True)
        tied = torch.eq(y, extreme, out=torch.empty_like(y))               # 1.0 where y equals the extreme
        got = torch.eq(prio, (tied * prio).amax(dim, keepdim=True), out=torch.empty_like(y))
        picked = got if picked is None else picked + got
        if i + 1 < n:
            y = y.add(got, alpha=big)
    got = got.to(x.dtype)
    value = (x * got).sum(dim, keepdim=True)              # the n-th pick, its gradient to that entry alone
    return picked.to(x.dtype), value


def _top_mask(scores: Tensor, k: int, dim: int) -> Tensor:
    """``1.0`` at the ``k`` highest entries of ``scores`` along ``dim``, ``0.0`` elsewhere (a tie keeps the
    lower index), by :func:`_rank_pick` of the ``k`` highest or of the ``n - k`` lowest, the fewer. Under
    ``torch.compile``, where that takes more than one pick: ``topk`` (inductor's code for the loop of
    dependent reductions ran slower than ``topk`` on the NFM micro presets; ties as ``topk`` breaks them)."""
    drop = scores.shape[dim] - k
    if torch.compiler.is_compiling() and min(k, drop) > 1:
        return torch.zeros_like(scores).scatter_(dim, scores.topk(k, dim=dim).indices, 1.0)
    if k <= drop:
        return _rank_pick(scores, k, dim, largest=True)[0]
    return 1 - _rank_pick(scores, drop, dim, largest=False)[0]


def _kth_largest(x: Tensor, k: int, dim: int) -> Tensor:
    """The ``k``-th largest entry of ``x`` along ``dim`` (ties counted), ``dim`` kept with size 1
    (``topk`` over the last axis and under ``torch.compile``, :func:`_top_mask`)."""
    if dim % x.dim() == x.dim() - 1 or torch.compiler.is_compiling():
        return x.topk(k, dim=dim).values.narrow(dim, k - 1, 1)
    n = x.shape[dim]
    return _rank_pick(x, k, dim, largest=True)[1] if k <= n - k + 1 else \
        _rank_pick(x, n - k + 1, dim, largest=False)[1]


TOPK_SOFTMAX = ("kept", "all", "subtract")
ATTENTION_BACKENDS = ("sdpa", "flex")   # attend(backend=...), the models' ``attention_backend``
SUBTRACT_EPS = 1e-7   # the authors' ``eps = 10e-8`` of Ke et al.'s sparse attention (module docstring)


def sparse_softmax(scores: Tensor, *, topk: int | None = None, topk_softmax: str = "kept",
                   key_mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """The weights stage of :func:`attend`'s explicit path: ``softmax`` over the keys axis ``dim``
    (default the last) of ``scores`` (already scaled, biased and masked), with ``topk`` and
    ``topk_softmax`` as in the module docstring (``key_mask``: rows with fewer allowed keys than ``k``
    keep only those). For callers that compute their scores in a structured way (NFM's attention
    over rescaled layers, :mod:`modwire.nn.nfm`, whose keys axis is not the last) and share this
    top-k rule."""
    check_argument("topk_softmax", topk_softmax, TOPK_SOFTMAX, "sparse_softmax")
    if topk_softmax == "subtract":
        return _subtract_kth(scores, topk, dim)
    if topk is None or topk >= scores.shape[dim]:
        return scores.softmax(dim=dim)
    if dim % scores.dim() != scores.dim() - 1 and key_mask is None:    # NFM's keys axis: float masks
        keep = _top_mask(scores.detach(), topk, dim)
        if topk_softmax == "kept":       # a dropped score moves to -max: its weight underflows to exactly 0
            return scores.add(keep - 1, alpha=torch.finfo(scores.dtype).max).softmax(dim=dim)
        return scores.softmax(dim=dim) * keep
    keep = _select_topk(scores.detach(), topk, dim)
    if topk_softmax == "kept":
        scores = scores.masked_fill(~keep, mask_value(scores.dtype))
    if key_mask is not None:  # rows with fewer allowed keys than k keep only those
        keep = keep & key_mask
    return scores.softmax(dim=dim) * keep


def _subtract_kth(scores: Tensor, topk: int | None, dim: int = -1) -> Tensor:
    """``topk_softmax="subtract"`` (module docstring): the softmax minus its (k+1)-th largest weight,
    clipped at 0, renormalised; rows of at most ``k + 1`` keys keep the plain softmax (as the
    authors' code). Masked keys have weight 0 and are never kept."""
    w = scores.softmax(dim=dim)
    if topk is None or topk + 1 >= scores.shape[dim]:
        return w
    delta = _kth_largest(w, topk + 1, dim) + SUBTRACT_EPS     # the (k+1)-th weight
    w = (w - delta).clamp(min=0)
    return w / (w.sum(dim=dim, keepdim=True) + SUBTRACT_EPS)


def attend(q: Tensor, k: Tensor, v: Tensor, *, bias: Tensor | AttentionPattern | None = None,
           key_mask: Tensor | None = None, row_scale: Tensor | float | None = None, topk: int | None = None,
           null_kv: bool = False, scale: float | None = None, key_scale: Tensor | None = None,
           renorm_eps: float = 0.0, topk_softmax: str = "kept", return_weights: bool = False,
           backend: str = "sdpa") -> tuple[Tensor, Tensor | None]:
    """``softmax_j(scale · q_i·k_j + bias_ij) v_j`` with the options of the module docstring.

    Shapes: q ``[..., Nq, dk]``, k ``[..., Nk, dk]``, v ``[..., Nk, dv]``; ``bias`` (float) and
    ``key_mask`` (bool) broadcastable to ``[..., Nq, Nk]``; ``row_scale`` to ``[..., Nq]``;
    ``key_scale`` to ``[..., Nk]`` (NI Eq. 7, with ``renorm_eps``). ``scale`` defaults to ``dk ** -0.5``.
    Returns ``(out [..., Nq, dv], weights [..., Nq, Nk] or None)``; the weights cover the real
    keys only (with ``null_kv`` the null slot's weight is one minus their sum) and include
    ``row_scale``, so ``out = weights @ v``. ``backend``: the kernel of a call that needs no explicit
    weights, ``"sdpa"`` or ``"flex"`` (:data:`ATTENTION_BACKENDS`; the same maths).
    """
    if bias is not None and not isinstance(bias, Tensor):  # a precomputed sparse pattern
        if not isinstance(bias, AttentionPattern):
            raise UserTypeError(f"attend: bias must be a float tensor or an AttentionPattern (an object with an "
                                f"attend(q, k, v, *, scale, return_weights) method), got {type(bias).__name__}")
        if key_mask is not None or row_scale is not None or topk is not None or null_kv or key_scale is not None:
            raise UserError("attend: a precomputed attention pattern takes no other options")
        return bias.attend(q, k, v, scale=scale, return_weights=return_weights)
    _check(q, k, v, key_mask, topk)
    check_argument("backend", backend, ATTENTION_BACKENDS, "attend")
    if topk_softmax not in TOPK_SOFTMAX:
        raise UserError(f"attend: topk_softmax must be 'kept' (NFM §3.2.1), 'all' (AiT Eq. 3) or 'subtract' (the NFM "
                        f"authors' code), got {topk_softmax!r}")
    if key_scale is None and renorm_eps != 0:
        raise UserError(f"attend: renorm_eps ({renorm_eps!r}) renormalises key-scaled weights; pass key_scale too")
    if key_scale is not None:
        if topk_softmax != "kept":
            raise UserError(f"attend: topk_softmax={topk_softmax!r} does not combine with key_scale")
        return _renormalised(q, k, v, bias=bias, key_mask=key_mask, row_scale=row_scale, topk=topk,
                             null_kv=null_kv, scale=scale, key_scale=key_scale, eps=renorm_eps,
                             return_weights=return_weights, backend=backend)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bias = None if bias is None else bias.to(q.dtype)
    has_key = None if key_mask is None or null_kv else key_mask.any(dim=-1, keepdim=True)
    if null_kv:
        k, v, bias, key_mask = _prepend_null(k, v, bias, key_mask)
    if topk is not None and topk >= k.shape[-2]:
        topk = None
    out, weights = _softmax_attention(q, k, v, bias, key_mask, scale, topk, topk_softmax, return_weights, backend)
    if has_key is not None:  # a query with no allowed key reads nothing
        out = out * has_key
        weights = None if weights is None else weights * has_key
    if row_scale is not None:
        r = row_scale.unsqueeze(-1) if isinstance(row_scale, Tensor) else row_scale
        out = out * r
        weights = None if weights is None else weights * r
    if weights is not None and null_kv:
        weights = weights[..., 1:]
    return out, (weights if return_weights else None)


def _softmax_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, key_mask: Tensor | None, scale: float,
                       topk: int | None, topk_softmax: str, return_weights: bool,
                       backend: str) -> tuple[Tensor, Tensor | None]:
    """:func:`attend`'s kernel, after its options are resolved: ``(out, weights or None)``; weights
    (explicit path) where they are asked for or top-k needs them, else one fused call."""
    explicit = return_weights or topk is not None
    if not explicit and backend == "flex" and flex.usable(q, k, v, bias):
        return flex.flex_attend(q, k, v, bias, key_mask, scale), None    # the mask as a block mask
    if key_mask is not None:  # finite fill: see the module docstring
        fill = torch.zeros((), dtype=q.dtype, device=q.device) if bias is None else bias
        bias = fill.masked_fill(~key_mask, mask_value(q.dtype))
    if not explicit:
        return fused_attention(q, k, v, bias, scale), None
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    weights = sparse_softmax(scores, topk=topk, topk_softmax=topk_softmax, key_mask=key_mask)
    return weights @ v, weights


def fused_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float) -> Tensor:
    """``F.scaled_dot_product_attention`` in the form its fused kernels accept (CPU flash; CUDA
    memory-efficient with a bias, flash without): 4-D ``[B, H, N, d]`` with one width for q, k
    and v. Leading axes ``[B, A, …]`` become ``[B, A·…]`` (a bias stays a broadcast view where it
    was one over ``B``); unequal widths (NI's augmented values ``[c_j v_j, c_j]``, a masked
    read-in's column of ones) are zero-padded to a common multiple of 8, which leaves ``q·k``
    unchanged (``scale`` is explicit) and adds output columns that are cut off. Exact.

    A bias that needs a gradient on the CPU goes to SDPA's math path as it is: the CPU's fused
    kernel has no gradient for a bias, and padding would only add work there."""
    if (bias is not None and bias.requires_grad and q.device.type == "cpu") or \
            (q.dim() == 4 and q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and q.shape[-1] == v.shape[-1]
             and (bias is None or bias.dim() == 4)):   # already the fused kernels' form: no reshaping
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    nq, nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    b0 = lead[0] if lead else 1
    q, k, v = (t.expand(*lead, *t.shape[-2:]).reshape(b0, -1, *t.shape[-2:]) for t in (q, k, v))
    if bias is not None:
        bias = bias.reshape((1,) * (len(lead) + 2 - bias.dim()) + tuple(bias.shape))
        first = bias.shape[0] if lead else 1
        bias = bias.expand(first, *lead[1:], nq, nk).reshape(first, -1, nq, nk)
    if q.shape[-1] != dv:
        width = -(-max(q.shape[-1], dv) // 8) * 8
        q, k, v = (F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    return out[..., :dv].reshape(*lead, nq, dv)


def _renormalised(q: Tensor, k: Tensor, v: Tensor, *, bias, key_mask, row_scale, topk, null_kv, scale,
                  key_scale: Tensor, eps: float, return_weights: bool, backend: str) -> tuple[Tensor, Tensor | None]:
    """NI Eq. 7: ``W_ij = r_i c_j s_ij / (ε + Σ_j r_i c_j s_ij)`` (module docstring)."""
    if null_kv:
        raise UserError("attend: key_scale (NI Eq. 7) does not combine with null_kv")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise UserError(f"attend: renorm_eps must be a number >= 0, got {eps!r}")
    c = key_scale.to(q.dtype)
    r = None if row_scale is None else (row_scale.to(q.dtype) if isinstance(row_scale, Tensor) else row_scale)
    if return_weights or topk is not None:        # explicit: s, then W, then W @ v
        _, s = attend(q, k, v, bias=bias, key_mask=key_mask, topk=topk, scale=scale, return_weights=True)
        w = s * c.unsqueeze(-2)                                           # c_j s_ij   [..., Nq, Nk]
        w = w if r is None else w * (r.unsqueeze(-1) if isinstance(r, Tensor) else r)
        w = w / _safe(eps + w.sum(-1, keepdim=True))
        return w @ v, (w if return_weights else None)
    c = c.unsqueeze(-1)                                                   # [..., Nk, 1]
    cv = v * c                                                            # c_j v_j   [..., Nk, dv]
    aug = torch.cat([cv, c.expand(*cv.shape[:-1], 1)], dim=-1)            # [c_j v_j, c_j]
    z, _ = attend(q, k, aug, bias=bias, key_mask=key_mask, scale=scale, backend=backend)  # [..., Nq, dv + 1]
    num, den = z[..., :-1], z[..., -1:]                # Σ_j s_ij c_j v_j,  Σ_j s_ij c_j
    if r is not None:
        r = r.unsqueeze(-1) if isinstance(r, Tensor) else r
        num, den = r * num, r * den
    return num / _safe(eps + den), None


def _safe(den: Tensor) -> Tensor:
    """A denominator with exact zeros replaced by 1: those rows have a zero numerator (all
    ``r_i c_j s_ij = 0``), so they read zeros instead of 0/0."""
    return torch.where(den == 0, torch.ones_like(den), den)


ReadInMethod = Literal["factorized", "literal"]


def uses_flex(module: nn.Module) -> bool:
    """Whether any attention of ``module`` runs on FlexAttention (``attention_backend="flex"``)."""
    return any(isinstance(m, ModulatedAttention) and m.attention_backend == "flex" for m in module.modules())


def split_heads(x: Tensor, h: int) -> Tensor:
    """``[..., N, H·d] → [..., H, N, d]``."""
    return x.unflatten(-1, (h, -1)).transpose(-3, -2)


def merge_heads(x: Tensor) -> Tensor:
    """``[..., H, N, d] → [..., N, H·d]``."""
    return x.transpose(-3, -2).flatten(-2)


class ModulatedAttention(nn.Module):
    """Multi-head attention with modulated projections (NAC Eq. 3-5; PIO when unmodulated).

    Queries and the output projection are conditioned on the receiver's code; keys and values
    on the sender's (``kv_code="sender"``) or the receiver's (``kv_code="receiver"``, the
    factorized read-in) code. ``dim``: query and output width; ``kv_dim``: width of the
    key/value inputs (default ``dim``); ``num_heads`` heads of ``head_dim`` features each, so the
    attention is ``inner = num_heads·head_dim`` wide (``head_dim=None``: ``dim / num_heads``, heads
    split ``dim``; the NAC authors' code: 64 whatever the head count, ``head_dim`` in
    ``attention.py``); ``qv_bias``: biases on the query and value projections (the key never has
    one: see below; the output projection always does); ``mod``: the conditioning;
    ``attention_backend``: :func:`attend`'s ``backend`` (``"sdpa"`` or ``"flex"``, the same maths).
    """

    def __init__(self, dim: int, num_heads: int, *, head_dim: int | None = None, qv_bias: bool = True,
                 mod: ModulationSpec = PLAIN, kv_dim: int | None = None,
                 kv_code: Literal["sender", "receiver"] = "sender", attention_backend: str = "sdpa") -> None:
        super().__init__()
        if head_dim is None and dim % num_heads:
            raise UserError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        if kv_code not in ("sender", "receiver"):
            raise UserError(f"kv_code must be 'sender' or 'receiver', got {kv_code!r}")
        kv_dim = dim if kv_dim is None else kv_dim
        self.num_heads, self.kv_code = num_heads, kv_code
        self.attention_backend = check_argument("attention_backend", attention_backend, ATTENTION_BACKENDS,
                                                "ModulatedAttention")
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        inner = num_heads * self.head_dim
        self.q, self.v = mod.linear(dim, inner, bias=qv_bias), mod.linear(kv_dim, inner, bias=qv_bias)
        self.o = mod.linear(inner, dim)
        # No key bias: it adds q_i·b_k to every score of row i, which the softmax cancels (a
        # parameter that changes no output and gets no gradient, which DDP rejects).
        self.k = mod.linear(kv_dim, inner, bias=False)

    def forward(self, x_q: Tensor, x_kv: Tensor, *, code_q: Tensor | None = None,
                code_kv: Tensor | None = None, bias: Tensor | AttentionPattern | None = None,
                key_mask: Tensor | None = None, return_weights: bool = False,
                method: ReadInMethod = "factorized") -> tuple[Tensor, Tensor | None]:
        """x_q ``[(B,) Uq, dim]`` (batch-free: shared by the batch); x_kv ``[B, Nk, kv_dim]``;
        code_q ``[(B,) Uq, d_code]``; code_kv ``[(B,) Nk, d_code]``; bias / key_mask as in
        :func:`attend` over ``[B, H, Uq, Nk]``. Returns ``(y [B, Uq, dim], weights or None)``."""
        if self.kv_code == "receiver" and self.k.modulation != "none":
            read = self._receiver_factorized if method == "factorized" else self._receiver_literal
            return read(x_q, x_kv, code_q, bias, key_mask, return_weights)
        b, h = x_kv.shape[0], self.num_heads
        q = split_heads(self.q(x_q, code_q), h)                           # [(B,) H, Uq, dh]
        q = q.expand(b, *q.shape[-3:]) if q.dim() == 3 else q
        code_kv = code_q if self.kv_code == "receiver" else code_kv       # unmodulated: ignored
        k, v = split_heads(self.k(x_kv, code_kv), h), split_heads(self.v(x_kv, code_kv), h)
        y, w = attend(q, k, v, bias=bias, key_mask=key_mask, return_weights=return_weights,
                      backend=self.attention_backend)
        return self.o(merge_heads(y), code_q), w

    def _receiver_factorized(self, x_q, x, code, bias, key_mask, return_weights):
        b, n, d_in = x.shape
        h, dh = self.num_heads, self.head_dim
        q = self.q(x_q, code).unflatten(-1, (h, dh))                      # [(B,) U, H, dh]
        q_fold = torch.einsum("...uhe,hei->...hui", q, self.k.weight.view(h, dh, d_in))  # W_k,hᵀ q_u
        q_fold = q_fold * self.k.modulation_factor(code).unsqueeze(-3)    # ⊙ m^k_u   [(B,) H, U, d_in]
        q_fold = q_fold.expand(b, *q_fold.shape[-3:]) if q_fold.dim() == 3 else q_fold
        xs = x.unsqueeze(1).expand(b, h, n, d_in)
        # with a mask, Σ_j a_uj may be 0: read it off a column of ones (else it is 1)
        vs = xs if key_mask is None else torch.cat([x, x.new_ones(b, n, 1)], -1).unsqueeze(1).expand(b, h, n, -1)
        z, w = attend(q_fold, xs, vs, bias=bias, key_mask=key_mask, scale=dh ** -0.5,
                      return_weights=return_weights, backend=self.attention_backend)   # [B, H, U, d_in (+ 1)]
        mass = None if key_mask is None else z[..., d_in:].transpose(1, 2)  # Σ_j a_uj  [B, U, H, 1]
        z = z[..., :d_in] * self.v.modulation_factor(code).unsqueeze(-3)  # (Σ_j a_uj x_j) ⊙ m^v_u
        y = torch.einsum("bhui,hei->buhe", z, self.v.weight.view(h, dh, d_in))   # [B, U, H, dh]
        if self.v.bias is not None:
            b_v = self.v.bias.view(h, dh)
            y = y + (b_v if mass is None else mass * b_v)
        return self.o(y.flatten(-2), code), w

    def _receiver_literal(self, x_q, x, code, bias, key_mask, return_weights):
        """NAC Eq. 4-5 as written: per-module keys and values over all inputs."""
        b, h = x.shape[0], self.num_heads
        q = split_heads(self.q(x_q, code), h)                             # [(B,) H, U, dh]
        q = q.expand(b, *q.shape[-3:]) if q.dim() == 3 else q
        xs = x.unsqueeze(1)                                               # [B, 1, N, d_in]
        k = F.linear(xs * self.k.modulation_factor(code).unsqueeze(-2), self.k.weight)  # [B, U, N, H·dh]
        v = F.linear(xs * self.v.modulation_factor(code).unsqueeze(-2), self.v.weight, self.v.bias)
        k = k.unflatten(-1, (h, -1)).permute(0, 3, 1, 2, 4)               # [B, H, U, N, dh]
        v = v.unflatten(-1, (h, -1)).permute(0, 3, 1, 2, 4)
        y, w = attend(q.unsqueeze(-2), k, v, bias=_per_row(bias), key_mask=_per_row(key_mask),
                      return_weights=return_weights, backend=self.attention_backend)   # [B, H, U, 1, dh]
        w = None if w is None else w.squeeze(-2)
        return self.o(merge_heads(y.squeeze(-2)), code), w


def _per_row(t: Tensor | None) -> Tensor | None:
    """``[.., Uq, Nk] → [.., Uq, 1, Nk]``: each receiver row becomes its own attention problem."""
    return None if t is None else t.unsqueeze(-2)
