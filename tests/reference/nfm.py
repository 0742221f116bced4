"""Literal, loop-by-loop re-statement of Neural Function Modules (NFM Algorithm 1, §3.2.1-3.2.2),
written from the paper's text, independently of ``modwire.nn.nfm``; float64 in the tests.

* :func:`window_literal`: §3.2.2 rescaling, one query position and one window offset at a time
  (nearest-neighbour index ``⌊m · src / mid⌋`` along each dim, with ``mid = dst · r``, ``r = ⌈src /
  dst⌉`` for SpaceToDepth and ``r = 1`` for nearest);
* :func:`reader_literal`: §3.2.1 attention for one reader, per sample, position and head:
  ``scores = q̂·k̂ / d_k`` over ``[null, keys in memory order]``, top-k, softmax over the kept keys
  (``topk_softmax="kept"``, §3.2.1's text; ``"subtract"``: the authors' code, Ke et al. 2018's
  sparse attention, :func:`subtract_kth_literal`), ``A``, then ``h + γ·σ(BN(A W_o1)) W_o2``
  (BatchNorm in training mode: batch statistics over samples and positions, biased variance;
  ``reader_output="conv3x3"``: ``W_o1``, ``W_o2`` are 3×3 convolutions, :func:`conv3x3_literal`);
* :func:`nfm_literal`: Algorithm 1 (passes, memory order: every earlier pass, then this pass's
  earlier blocks); ``read_at="after_last_pass"``: the authors' Sort-of-CLEVR code (earlier passes
  only write; the last pass writes each block's output, then reads with it as the query).
"""
from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor


def window_literal(src: tuple[int, ...], dst: tuple[int, ...], mode: str) -> list[list[tuple[int, ...]]]:
    """For each query position (row-major over ``dst``), the source positions of its keys."""
    r = tuple(1 for _ in src) if mode == "nearest" else tuple(max(1, math.ceil(s / t)) for s, t in zip(src, dst))
    mid = tuple(t * f for t, f in zip(dst, r))
    out = []
    for t in itertools.product(*[range(n) for n in dst]):
        keys = []
        for o in itertools.product(*[range(f) for f in r]):
            m = [t[d] * r[d] + o[d] for d in range(len(dst))]
            keys.append(tuple(math.floor(m[d] * src[d] / mid[d]) for d in range(len(dst))))
        out.append(keys)
    return out


def _lin(x: Tensor, layer) -> Tensor:
    return layer.weight @ x + layer.bias


def subtract_kth_literal(scores: list[Tensor], k: int) -> list[Tensor]:
    """The authors' top-k (``SparseAttention`` of their ``attentive_densenet.py``, after Ke et al.
    2018), one row: ``w = softmax(scores)``; with more than ``k + 1`` keys, ``δ`` = the (k+1)-th
    largest ``w`` + 1e-7, ``w_j ← max(0, w_j - δ)``, then ``w_j / (Σ_l w_l + 1e-7)``."""
    z = sum(torch.exp(s) for s in scores)
    w = [torch.exp(s) / z for s in scores]
    if len(w) <= k + 1:
        return w
    delta = sorted(w, key=lambda t: -float(t.detach()))[k] + 1e-7
    w = [torch.clamp(wj - delta, min=0) for wj in w]
    total = sum(w) + 1e-7
    return [wj / total for wj in w]


def kept_softmax_literal(scores: list[Tensor], k: int) -> list[Tensor]:
    """§3.2.1's text: a softmax over the ``k`` highest scores only (the others get 0); of equal scores
    the lower index counts as the higher (the paper sets no order; ``torch.topk``'s usual one)."""
    kept = sorted(range(len(scores)), key=lambda j: (-float(scores[j].detach()), j))[:k]
    z = sum(torch.exp(scores[j]) for j in kept)
    return [torch.exp(s) / z if j in kept else torch.zeros_like(s) for j, s in enumerate(scores)]


def conv3x3_literal(x: Tensor, conv) -> Tensor:
    """``y[b, o, i, j] = bias_o + Σ_{c, di, dj} W[o, c, di, dj] · x[b, c, i + di - 1, j + dj - 1]``
    (zeros outside the grid), for ``x [B, C, H, W]``."""
    b, _, hh, ww = x.shape
    pad = torch.zeros(b, x.shape[1], hh + 2, ww + 2, dtype=x.dtype)
    pad[:, :, 1:-1, 1:-1] = x
    y = torch.zeros(b, conv.weight.shape[0], hh, ww, dtype=x.dtype) if conv.bias is None else \
        conv.bias[None, :, None, None].expand(b, -1, hh, ww).clone()
    for di in range(3):
        for dj in range(3):
            y = y + torch.einsum("oc,bcij->boij", conv.weight[:, :, di, dj], pad[:, :, di:di + hh, dj:dj + ww])
    return y


def _batch_norm(y: Tensor, norm) -> Tensor:
    """BatchNorm in training mode over every axis but the last (channels last)."""
    flat = y.reshape(-1, y.shape[-1])
    mean, var = flat.mean(0), flat.var(0, unbiased=False)
    return (y - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _bias(layer) -> Tensor | float:
    """A layer's bias, 0 where it has none (``W_o1`` before a BatchNorm; ``output_bias=False``)."""
    return 0.0 if layer.bias is None else layer.bias


def reader_literal(reader, h: Tensor, sources: list[Tensor], writers: list) -> Tensor:
    """One reader on channels-first states ``h [B, C, *S]``, ``sources`` ``[B, C_j, *S_j]``
    (a vector ``[B, C]`` is a grid of ones) with the modules that wrote them (``writers``: their
    ``key`` / ``value`` projections, "separate per module", §3.2.1)."""
    if reader.w_o1 is None:          # the first module of the first pass: A = 0, h + γ·σ(0·W_o1) W_o2 = h
        return h
    b, c, size = h.shape[0], h.shape[1], tuple(h.shape[2:])
    dims = max([len(size)] + [m.dim() - 2 for m in sources])
    size_full = size or (1,) * dims
    positions = list(itertools.product(*[range(n) for n in size_full]))
    hd, dk, dv, k = reader.heads, reader.d_k, reader.d_v, reader.k
    windows = [window_literal(tuple(m.shape[2:]) or (1,) * dims, size_full, reader.rescale) for m in sources]
    a = torch.zeros(b, len(positions), hd * dv, dtype=h.dtype)
    for bi in range(b):
        for pi, pos in enumerate(positions):
            if not sources:                                      # only the null slot: A = 0
                continue
            q = _lin(h[bi].reshape(c, *size_full)[(slice(None), *pos)], reader.query)
            keys, values = [torch.zeros(hd * dk, dtype=h.dtype)], [torch.zeros(hd * dv, dtype=h.dtype)]
            for m, win, writer in zip(sources, windows, writers):
                full = m[bi].reshape(m.shape[1], *(tuple(m.shape[2:]) or (1,) * dims))
                for s in win[pi]:
                    x = full[(slice(None), *s)]
                    keys.append(_lin(x, writer.key))
                    values.append(_lin(x, writer.value))
            rule = subtract_kth_literal if reader.topk_softmax == "subtract" else kept_softmax_literal
            for head in range(hd):
                qh = q[head * dk:(head + 1) * dk]
                scores = [qh @ kk[head * dk:(head + 1) * dk] * reader.scale for kk in keys]
                for j, w in enumerate(rule(scores, k)):
                    a[bi, pi, head * dv:(head + 1) * dv] += w * values[j][head * dv:(head + 1) * dv]
    if reader.reader_output == "conv3x3":                                  # the authors' out_layers
        grid = a.transpose(1, 2).reshape(b, hd * dv, *size)
        y = conv3x3_literal(grid, reader.w_o1).permute(0, 2, 3, 1)         # [B, H, W, hidden]
        if isinstance(reader.norm, torch.nn.BatchNorm2d):
            y = _batch_norm(y, reader.norm)
        y = conv3x3_literal(torch.relu(y).permute(0, 3, 1, 2), reader.w_o2)
        return h + reader.gamma * y
    y = a @ reader.w_o1.weight.T + _bias(reader.w_o1)                      # [B, P, hidden]
    if isinstance(reader.norm, torch.nn.BatchNorm1d):
        y = _batch_norm(y, reader.norm)
    y = torch.relu(y) @ reader.w_o2.weight.T + _bias(reader.w_o2)          # [B, P, C]
    return h + reader.gamma * y.transpose(1, 2).reshape(h.shape)


def nfm_literal(nfm, x: Tensor) -> Tensor:
    """Algorithm 1 with ``nfm``'s blocks and readers (channels-first states); with
    ``nfm.read_at == "after_last_pass"`` the authors' schedule (module docstring)."""
    memory: list[Tensor] = []
    writers: list = []
    after = nfm.read_at == "after_last_pass"
    for p in range(nfm.passes):
        h = x
        for i in range(nfm.num_blocks):
            module = nfm.readers[p * nfm.num_blocks + i]
            if not after:
                h = reader_literal(module, h, list(memory), list(writers))   # every state written so far, memory order
            h = nfm.block(p, i)(h)
            memory.append(h)
            writers.append(module)
            if after and p == nfm.passes - 1:                                 # its own output included
                h = reader_literal(module, h, list(memory), list(writers))
    return h
