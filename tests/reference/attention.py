"""Literal, loop-by-loop definition of ``modwire.nn.attend`` (one query row at a time).

Written from the specification only, independently of the library's vectorised kernel:

* scores ``s_ij = scale · q_i·k_j + bias_ij`` with ``scale = dk ** -0.5`` by default
  (NAC Eq. 3 with ``bias = log K̂``);
* ``key_mask`` False drops key j for query i; a row with no candidate left reads 0;
* ``topk``: among the allowed candidates only the k highest scores enter the softmax
  (NFM Algorithm 1, "top-k softmax"; AiT Eq. 3, ``top-k(A)``);
* ``null_kv``: a zero key and a zero value are put first in the candidate list (NFM
  "Default Computation"); its score is q·0 = 0, it gets no bias, it is never masked, and it
  competes in the top-k like any key;
* ``row_scale``: multiplies query i's output and its weights (NI Eq. 7-10's ``C_ui``).

Everything is done with scalar tensor operations so that torch.autograd differentiates the
literal definition (the top-k choice is piecewise constant, so it carries no gradient).
"""
from __future__ import annotations

import itertools

import torch
from torch import Tensor


def attend_literal(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None,
                   key_mask: Tensor | None = None, row_scale: Tensor | float | None = None,
                   topk: int | None = None, null_kv: bool = False,
                   scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Return ``(out [..., Nq, dv], weights [..., Nq, Nk])`` (weights over the real keys only,
    times ``row_scale``; the null slot's weight is ``1 - row sum`` before ``row_scale``)."""
    *lead, n_q, d_k = q.shape
    n_k, d_v = k.shape[-2], v.shape[-1]
    assert list(k.shape[:-2]) == lead and list(v.shape[:-2]) == lead, "same leading axes"
    assert k.shape[-1] == d_k and v.shape[-2] == n_k
    lead = tuple(lead)
    if scale is None:
        scale = d_k ** -0.5
    full = lead + (n_q, n_k)
    bias_full = None if bias is None else bias.broadcast_to(full)
    mask_full = None if key_mask is None else key_mask.broadcast_to(full)
    rs_full = None
    if row_scale is not None:
        rs_full = torch.as_tensor(row_scale, dtype=q.dtype).broadcast_to(lead + (n_q,))
    zero = q.new_zeros(())
    null_key = q.new_zeros(d_k)
    null_value = v.new_zeros(d_v)

    out_blocks, weight_blocks = [], []
    for idx in itertools.product(*(range(n) for n in lead)):
        out_rows, weight_rows = [], []
        for i in range(n_q):
            # candidate list: (score, value vector, index of the real key or None for the null slot)
            candidates = []
            if null_kv:
                s = zero
                for a in range(d_k):
                    s = s + q[idx + (i, a)] * null_key[a]
                candidates.append((scale * s, null_value, None))  # exactly 0; no bias, never masked
            for j in range(n_k):
                if mask_full is not None and not bool(mask_full[idx + (i, j)]):
                    continue
                s = zero
                for a in range(d_k):
                    s = s + q[idx + (i, a)] * k[idx + (j, a)]
                s = scale * s
                if bias_full is not None:
                    s = s + bias_full[idx + (i, j)]
                candidates.append((s, v[idx + (j,)], j))
            if topk is not None:
                candidates = sorted(candidates, key=lambda c: float(c[0].detach()), reverse=True)[:topk]

            weight_row = [zero] * n_k
            out_row = [zero] * d_v
            if candidates:  # else: nothing to read, the output stays exactly 0
                m = max(float(c[0].detach()) for c in candidates)  # a constant shift: softmax is unchanged
                exps = [torch.exp(c[0] - m) for c in candidates]
                total = zero
                for e in exps:
                    total = total + e
                for (s, value, j), e in zip(candidates, exps):
                    w = e / total
                    if j is not None:
                        weight_row[j] = w
                    for c in range(d_v):
                        out_row[c] = out_row[c] + w * value[c]
            if rs_full is not None:
                r = rs_full[idx + (i,)]
                out_row = [r * o for o in out_row]
                weight_row = [r * w for w in weight_row]
            out_rows.append(torch.stack(out_row))
            weight_rows.append(torch.stack(weight_row))
        out_blocks.append(torch.stack(out_rows))
        weight_blocks.append(torch.stack(weight_rows))
    out = torch.stack(out_blocks).reshape(lead + (n_q, d_v))
    weights = torch.stack(weight_blocks).reshape(lead + (n_q, n_k))
    return out, weights


def null_weight(weights: Tensor) -> Tensor:
    """The null slot's weight from weights returned without row_scale: ``1 - Σ_j w_ij``."""
    return 1.0 - weights.sum(-1)
