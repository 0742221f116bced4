"""FlexAttention (``torch.nn.attention.flex_attention``) for :func:`modwire.nn.attention.attend`'s
``backend="flex"``: the same ``softmax_j(scale · q_i·k_j + bias_ij) v_j`` over the allowed keys as the
SDPA path, with

* the additive ``bias`` (NAC Eq. 3's ``log K̂``, NI App. C.2.3's relative positions) as a ``score_mod``
  that reads the bias tensor at ``(b, h, i, j)``: autograd gives the bias its gradient (on a GPU,
  torch's fused backward kernel computes it and scatters it into the bias; on the CPU, SDPA has no
  fused kernel with a bias gradient and takes its math path);
* the bool ``key_mask`` (NAC's padding, truncation and edge masks, a causal mask) as a ``BlockMask``
  (:func:`~torch.nn.attention.flex_attention.create_block_mask`): blocks of pairs with no allowed pair
  are skipped, and inside a block each masked pair is removed (``-inf``, not :func:`attend`'s finite
  fill: both give it weight 0). A query with no allowed key reads zeros, as :func:`attend` rules.

Neither tensor is expanded: a bias or mask broadcast over some axes (NAC's ``[B, 1, U, U]`` over heads,
the ViT's ``[H, N, N]`` over the batch, NI's ``[U, H, N, N]``) is read at the coordinates it has.
Leading axes ``[B, A1, …]`` are flattened to FlexAttention's ``[B, H, N, d]`` as in
:func:`~modwire.nn.attention.fused_attention`; head widths below 16 are zero-padded to 16 (torch's GPU
kernel refuses narrower ones; ``scale`` is explicit, so ``q·k`` is unchanged, and the padded output
columns are cut off).

Where it runs: outside ``torch.compile``, through one ``torch.compile`` of this module's core (PyTorch's
way to get the fused kernel: uncompiled, FlexAttention is an unfused reference that materialises the
scores); inside a compiled model, traced into its graph. torch (2.13) has no FlexAttention backward on
the CPU (nor MPS): there, a call that needs a gradient is refused by :func:`usable` and
:func:`~modwire.nn.attention.attend` takes the SDPA path (same maths). The first call of each shape
and bias/mask layout compiles (8-30 s a graph on the 2-core CPU machine this was written on). A whole
model under ``torch.compile`` traces FlexAttention into one graph (``tests/test_compile.py``), but on the
CPU inductor fails to lower it there (torch 2.13: ``LoweringException: ValueError: not enough values to
unpack`` for ``vit_digits`` and ``nac_small``, ``benchmarks/results/flex_cpu_compiled.json``): compile
on a GPU, or use ``"sdpa"`` on the CPU.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

MIN_WIDTH = 16          # FlexAttention's GPU kernel: q/k and v widths of at least 16
NO_BACKWARD = ("cpu", "mps")   # devices where torch's FlexAttention refuses a backward


def usable(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> bool:
    """False where FlexAttention cannot run this call: a gradient is wanted on a device where torch
    has no FlexAttention backward (the CPU)."""
    if q.device.type not in NO_BACKWARD or not torch.is_grad_enabled():
        return True
    return not any(t is not None and t.requires_grad for t in (q, k, v, bias))


def flex_attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, key_mask: Tensor | None,
                scale: float) -> Tensor:
    """``softmax_j(scale · q_i·k_j + bias_ij) v_j`` over the keys with ``key_mask`` True (module docstring).

    Shapes as :func:`~modwire.nn.attention.attend`: q ``[..., Nq, dk]``, k ``[..., Nk, dk]``, v
    ``[..., Nk, dv]``, ``bias`` (float, q's dtype) and ``key_mask`` (bool) broadcastable to
    ``[..., Nq, Nk]``. Returns ``[..., Nq, dv]``; a query with no allowed key gets zeros."""
    lead = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
    nq, dv = q.shape[-2], v.shape[-1]
    b0 = lead[0] if lead else 1
    q, k, v = (t.expand(*lead, *t.shape[-2:]).reshape(b0, -1, *t.shape[-2:]) for t in (q, k, v))
    if q.shape[-1] < MIN_WIDTH:
        q, k = (F.pad(t, (0, MIN_WIDTH - t.shape[-1])) for t in (q, k))
    if dv < MIN_WIDTH:
        v = F.pad(v, (0, MIN_WIDTH - dv))
    if torch.compiler.is_compiling():
        out = _core(q, k, v, bias, key_mask, lead, scale)
    else:       # this module's graphs may exceed dynamo's recompile limit: raised for these calls only
        limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        with torch._dynamo.config.patch(recompile_limit=limit):
            out = _compiled()(q, k, v, bias, key_mask, lead, scale)
    return out[..., :dv].reshape(*lead, nq, dv)


RECOMPILE_LIMIT = 64


@functools.cache
def _compiled() -> Callable[..., Tensor]:
    """:func:`_core` under ``torch.compile``, one per process, with static shapes (a second shape
    compiled with dynamic shapes fails in inductor's CPU FlexAttention code in torch 2.13). Each shape,
    bias/mask layout and grad mode is a graph of this one function (a NAC has one per attention layout:
    read-in, propagators, read-out), a process with several models more: past dynamo's recompile limit
    (8 by default) dynamo would quietly run the unfused reference, so :func:`flex_attend` raises the
    limit to :data:`RECOMPILE_LIMIT` around its own calls (``torch._dynamo.config.patch``: the user's
    other compiled code keeps its setting)."""
    return torch.compile(_core, fullgraph=True, dynamic=False)


def _core(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, key_mask: Tensor | None,
          lead: tuple[int, ...], scale: float) -> Tensor:
    """FlexAttention on ``[B, H, N, d]`` (``H`` = the product of ``lead[1:]``)."""
    nq, nk = q.shape[-2], k.shape[-2]
    score_mod = None if bias is None else _bias_mod(_reader(bias, lead))
    block_mask = None
    if key_mask is not None:
        over_b, over_h = _varies(key_mask, lead)                         # else one mask for all
        block_mask = create_block_mask(_reader(key_mask, lead), q.shape[0] if over_b else None,
                                       q.shape[1] if over_h else None, nq, nk, device=q.device)
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def _bias_mod(read_bias: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """The ``score_mod`` adding the bias read at ``(b, h, i, j)``."""
    def score_mod(score, b, h, i, j):
        return score + read_bias(b, h, i, j)
    return score_mod


def _padded(t: Tensor, lead: tuple[int, ...]) -> Tensor:
    """``t`` with size-1 axes in front up to the rank of ``[*lead, Nq, Nk]``."""
    return t.reshape((1,) * (len(lead) + 2 - t.dim()) + tuple(t.shape))


def _varies(t: Tensor, lead: tuple[int, ...]) -> tuple[bool, bool]:
    """Whether ``t`` varies over FlexAttention's batch axis (``lead[0]``) and over its head axis
    (``lead[1:]``, flattened)."""
    sizes = _padded(t, lead).shape[:len(lead)]
    return bool(sizes) and sizes[0] != 1, any(s != 1 for s in sizes[1:])


def _reader(t: Tensor, lead: tuple[int, ...]) -> Callable[..., Tensor]:
    """``read(b, h, i, j)``: the entry of ``t`` (broadcastable to ``[*lead, Nq, Nk]``) at batch ``b``,
    flattened head ``h`` (over ``lead[1:]``, row-major), query ``i`` and key ``j``. Broadcast (size-1)
    axes are squeezed away and never indexed, so ``t`` is read as stored (its gradient comes back in
    its own shape, nothing expanded)."""
    t = _padded(t, lead)
    rank, heads = t.dim(), lead[1:]
    keep = tuple(a for a in range(rank) if t.shape[a] != 1)
    t = t.squeeze(tuple(a for a in range(rank) if a not in keep))
    inner = [math.prod(heads[a + 1:]) for a in range(len(heads))]   # row-major strides of the head axes

    def coordinate(axis: int, b, h, i, j):
        if axis >= rank - 2:
            return i if axis == rank - 2 else j
        if axis == 0:
            return b
        a = axis - 1                                                    # an axis of lead[1:]
        return h if len(heads) == 1 else (h // inner[a]) % heads[a]

    def read(b, h, i, j):
        return t[tuple(coordinate(axis, b, h, i, j) for axis in keep)]
    return read
