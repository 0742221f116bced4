"""Literal, loop-by-loop re-statement of Neural Function Modules (NFM Algorithm 1, §3.2.1-3.2.2),
written from the paper's text, independently of ``modwire.nn.nfm``; float64 in the tests.

* :func:`window_literal`: §3.2.2 rescaling, one query position and one window offset at a time
  (nearest-neighbour index ``⌊m · src / mid⌋`` along each dim, with ``mid = dst · r``, ``r = ⌈src /
  dst⌉`` for SpaceToDepth and ``r = 1`` for nearest);
* :func:`reader_literal`: §3.2.1 attention for one reader, per sample, position and head:
  ``scores = q̂·k̂ / d_k`` over ``[null, keys in memory order]``, top-k, softmax over the kept keys,
  ``A``, then ``h + γ·σ(BN(A W_o1)) W_o2`` (BatchNorm in training mode: batch statistics over
  samples and positions, biased variance);
* :func:`nfm_literal`: Algorithm 1 (passes, memory order: every earlier pass, then this pass's
  earlier blocks).
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


def reader_literal(reader, h: Tensor, sources: list[Tensor], writers: list) -> Tensor:
    """One reader on channels-first states ``h [B, C, *S]``, ``sources`` ``[B, C_j, *S_j]``
    (a vector ``[B, C]`` is a grid of ones) with the modules that wrote them (``writers``: their
    ``key`` / ``value`` projections, "separate per module", §3.2.1)."""
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
            for head in range(hd):
                qh = q[head * dk:(head + 1) * dk]
                scores = torch.stack([qh @ kk[head * dk:(head + 1) * dk] * reader.scale for kk in keys])
                kept = torch.topk(scores, min(k, len(keys))).indices.tolist()
                z = sum(torch.exp(scores[j]) for j in kept)
                for j in kept:
                    a[bi, pi, head * dv:(head + 1) * dv] += torch.exp(scores[j]) / z * values[j][head * dv:(head + 1) * dv]
    y = a @ reader.w_o1.weight.T + reader.w_o1.bias                        # [B, P, hidden]
    if isinstance(reader.norm, torch.nn.BatchNorm1d):
        flat = y.reshape(-1, y.shape[-1])
        mean, var = flat.mean(0), flat.var(0, unbiased=False)
        y = (y - mean) / torch.sqrt(var + reader.norm.eps) * reader.norm.weight + reader.norm.bias
    y = torch.relu(y) @ reader.w_o2.weight.T + reader.w_o2.bias            # [B, P, C]
    return h + reader.gamma * y.transpose(1, 2).reshape(h.shape)


def nfm_literal(nfm, x: Tensor) -> Tensor:
    """Algorithm 1 with ``nfm``'s blocks and readers (channels-first states)."""
    memory: list[Tensor] = []
    writers: list = []
    for p in range(nfm.passes):
        h = x
        for i in range(nfm.num_blocks):
            module = nfm.readers[p * nfm.num_blocks + i]
            h = reader_literal(module, h, list(memory), list(writers))   # every state written so far, memory order
            h = nfm.block(p, i)(h)
            memory.append(h)
            writers.append(module)
    return h
