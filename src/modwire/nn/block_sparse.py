"""Block-sparse attention for edge-eliminated NAC propagators (NAC App. F).

NAC App. F removes the attentive connections with the smallest link probabilities ``P_ij``
(e.g. 90% of the off-diagonal pairs); the surviving edges are block-structured (clusters of
modules, e.g. under an SBM prior), which "allows for the use of sparse attention kernels"
(future work there). This module is such a kernel.

The module axis ``[0, U)`` is cut into blocks of ``block_size`` (the last one padded).
A (query block, key block) pair is *kept* if it contains at least one allowed edge; only
kept pairs are computed. Query-block rows are grouped by their number ``c`` of kept key
blocks, so each group is one call of :func:`~modwire.nn.attention.attend` (fused) on
``rows·B·H`` problems of ``bs`` queries against ``c·bs`` gathered keys, with the group's
edge mask as ``key_mask``: the cost is proportional to the number of kept blocks, and the
result equals the dense masked ``attend`` (up to rounding), receivers with no allowed sender
included (their output is 0, by ``attend``'s own rule).

:class:`BlockSparseBias` is an :class:`~modwire.nn.attention.AttentionPattern`: handed to
``attend`` as ``bias`` it runs the attention; :class:`BlockSparseKernel` installs one in a
model where a signature kernel was (``modwire.analysis.block_sparse``).

The speed-up needs the kept edges to be blocky: order the modules first, with
:func:`block_order` (reverse Cuthill-McKee) or :func:`order_by_groups` (e.g. the clusters
of a planted-partition prior), and permute the module axis of states, codes and
signatures once with it (attention is equivariant to a joint permutation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import attend
from ..errors import UserError

# Gathered keys/values are processed in batch chunks of at most this many bytes: larger
# temporaries are fresh mmaps with glibc malloc (threshold 32 MiB), page-faulted in on
# every call, which on CPU costs more than the attention itself.
_CHUNK_BYTES = 16 * 2**20


def _unless_arange(index: Tensor, n: int) -> Tensor | None:
    """``index``, or None if it is ``arange(n)``: all ``n`` blocks in order, nothing to gather."""
    return None if torch.equal(index, torch.arange(n, device=index.device)) else index


@dataclass
class BlockGroup:
    """Query-block rows that keep the same number ``c`` of key blocks.

    rows: ``[r]`` query-block indices; cols: ``[r, c]`` kept key-block indices per row;
    mask: ``[r, bs, c·bs]`` bool, the allowed edges inside those blocks (False on padding);
    q_index / k_index: ``rows`` / ``cols.flatten()``, None where that is all blocks in order.
    """

    rows: Tensor
    cols: Tensor
    mask: Tensor
    q_index: Tensor | None
    k_index: Tensor | None
    full: bool = False  # every pair inside the kept blocks is allowed


@dataclass
class BlockSparseLayout:
    """Which ``block_size × block_size`` blocks of a ``[U, U]`` edge mask are computed.

    size: ``U``; block_mask: ``[nb, nb]`` bool, kept blocks; groups: see :class:`BlockGroup`
    (query-block rows with no kept block are in no group); has_key: ``[U]`` bool, False for
    a receiver with no allowed sender, None when every receiver has one.
    """

    size: int
    block_size: int
    block_mask: Tensor
    groups: list[BlockGroup]
    has_key: Tensor | None

    @classmethod
    def from_mask(cls, mask: Tensor, block_size: int) -> "BlockSparseLayout":
        """Layout of a bool edge mask ``[U, U]`` (True = receiver ``i`` may attend to ``j``)."""
        if not isinstance(mask, Tensor) or mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
            raise UserError(f"mask must be a square [U, U] tensor, got shape "
                            f"{tuple(mask.shape) if isinstance(mask, Tensor) else type(mask)}")
        if mask.dtype != torch.bool:
            raise UserError(f"mask must be bool (True = edge kept), got {mask.dtype}")
        if int(block_size) != block_size or block_size < 1:
            raise UserError(f"block_size must be a positive int, got {block_size!r}")
        u, bs = mask.shape[0], int(block_size)
        nb = math.ceil(u / bs)
        pad = nb * bs - u
        blocks = F.pad(mask, (0, pad, 0, pad)).view(nb, bs, nb, bs).transpose(1, 2)  # [nb, nb, bs, bs]
        block_mask = blocks.any(dim=(2, 3))
        counts = block_mask.sum(dim=1)
        groups = []
        for c in counts.unique().tolist():
            if c == 0:
                continue
            rows = (counts == c).nonzero().squeeze(1)
            cols = block_mask[rows].nonzero()[:, 1].view(len(rows), c)       # sorted per row
            inner = blocks[rows[:, None], cols].transpose(1, 2).reshape(len(rows), bs, c * bs)
            groups.append(BlockGroup(rows, cols, inner, _unless_arange(rows, nb),
                                     _unless_arange(cols.flatten(), nb), bool(inner.all())))
        has_key = mask.any(dim=1)
        return cls(u, bs, block_mask, groups, None if bool(has_key.all()) else has_key)

    @property
    def num_blocks(self) -> int:
        """Blocks per side, ``nb = ceil(U / block_size)``."""
        return self.block_mask.shape[0]

    @property
    def density(self) -> float:
        """Fraction of the ``nb²`` blocks that are kept (computed)."""
        return float(self.block_mask.float().mean())

    def gather(self, bias: Tensor | None, dtype: torch.dtype | None = None) -> list[Tensor | None]:
        """Per group, the additive bias ``[B|1, 1, r, bs, c·bs]`` of the kept blocks, from a
        dense ``bias`` ``[B|1, 1, U, U]``; None for all groups when ``bias`` is None. (Which
        pairs inside the blocks are allowed is ``group.mask``.)"""
        if bias is None:
            return [None] * len(self.groups)
        if bias.dim() != 4 or bias.shape[1] != 1 or bias.shape[-2:] != (self.size, self.size):
            raise UserError(f"bias must be [B|1, 1, {self.size}, {self.size}] (shared by all heads), "
                            f"got {tuple(bias.shape)}")
        nb, bs = self.num_blocks, self.block_size
        pad = nb * bs - self.size
        blocks = F.pad(bias.to(dtype or bias.dtype), (0, pad, 0, pad)).view(-1, 1, nb, bs, nb, bs).transpose(3, 4)
        # [B, 1, r, c, bs, bs] -> [B, 1, r, bs, c·bs]
        return [blocks[:, :, g.rows[:, None], g.cols].transpose(3, 4).flatten(4, 5).contiguous()
                for g in self.groups]


@dataclass
class BlockSparseBias:
    """A layout with its bias already gathered: an
    :class:`~modwire.nn.attention.AttentionPattern` to hand to :func:`attend` as ``bias``.

    For inference, where the kernel (eval mode: ``K = P``) and the edge mask are the same
    for every forward, build it once with :meth:`from_dense`.
    ``blocks``: per group ``[B|1, 1, r, bs, c·bs]`` or None (see :meth:`BlockSparseLayout.gather`).
    """

    layout: BlockSparseLayout
    blocks: list[Tensor | None]

    @classmethod
    def from_dense(cls, log_kernel: Tensor | None, mask: Tensor, block_size: int, *,
                   key_mask: Tensor | None = None, max_density: float = 0.5) -> "BlockSparseBias":
        """From the dense log-kernel ``[B|1, 1, U, U]`` (None for no bias), the bool edge mask
        ``[U, U]`` and the kernel's own mask (``key_mask``, broadcastable to ``[U, U]``, e.g.
        truncation; ANDed in). If more than ``max_density`` of the blocks are kept, the layout
        is one ``U × U`` block instead, i.e. the dense masked attention: on CPU, attention over
        small blocks costs more per score than dense attention (measured by
        ``benchmarks/bench_block_sparse.py``), so dense wins there."""
        if key_mask is not None:
            mask = mask & key_mask.reshape(key_mask.shape[-2:])
        layout = BlockSparseLayout.from_mask(mask, block_size)
        if layout.density > max_density:
            layout = BlockSparseLayout.from_mask(mask, mask.shape[0])
        return cls(layout, layout.gather(log_kernel))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, scale: float | None = None,
               return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Like :func:`~modwire.nn.attention.attend`: q, k ``[B, H, U, d]``, v ``[B, H, U, dv]``;
        returns ``(out [B, H, U, dv], weights or None)``. ``return_weights=True`` computes
        the kept blocks with an explicit softmax and scatters them into dense weights
        ``[B, H, U, U]`` (zero outside kept edges): for analysis, it costs ``O(U²)`` memory."""
        u = self.layout.size
        if q.dim() != 4 or k.shape[:-1] != q.shape[:-1] or v.shape[:-1] != q.shape[:-1] or q.shape[-2] != u:
            raise UserError(f"q, k, v must be [B, H, U={u}, d] for this layout (v: [B, H, {u}, dv]), "
                            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if return_weights:
            return self._explicit(q, k, v, scale)
        return self._fused(q, k, v, scale), None

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        lay = self.layout
        (b, h, u, dq), dv, bs, nb = q.shape, v.shape[-1], lay.block_size, lay.num_blocks
        # Work in heads-inner memory [B, U, H, d], as the projections produce it (other layouts
        # are copied once): a block is then one contiguous chunk of a [B, nb, bs·H·d] view,
        # gathered by one index_select, and B·rows merge into SDPA's batch without a copy.
        x3 = [x.transpose(1, 2) for x in (q, k, v)]
        if nb * bs != u:  # (F.pad copies even when the padding is 0)
            x3 = [F.pad(x, (0, 0, 0, 0, 0, nb * bs - u)) for x in x3]
        x3 = [x.reshape(b, nb, -1) for x in x3]

        def blocks(x: Tensor, index: Tensor | None, r: int, d: int) -> Tensor:
            """``[n·r, H, S, d]``: the (gathered) blocks of each of the ``r`` rows."""
            x = x if index is None else x.index_select(1, index)
            return x.view(x.shape[0], r, -1, h, d).transpose(2, 3).flatten(0, 1)

        out = None
        covered = sum(len(g.rows) for g in lay.groups) == nb
        for g, bias in zip(lay.groups, self.blocks):
            r, c = g.cols.shape
            gathered = h * r * (bs * dq * (g.q_index is not None) + c * bs * (dq + dv)) * q.element_size()
            step = b if g.q_index is None and g.k_index is None else max(1, _CHUNK_BYTES // gathered)
            for s in range(0, b, step):
                n = min(step, b - s)
                qg = blocks(x3[0][s:s + n], g.q_index, r, dq)
                kg, vg = blocks(x3[1][s:s + n], g.k_index, r, dq), blocks(x3[2][s:s + n], g.k_index, r, dv)
                m = None
                if bias is not None:                                      # [B|1, 1, r, bs, c·bs]
                    m = bias if bias.shape[0] == 1 else bias[s:s + n]
                    m = m.transpose(1, 2).expand(n, -1, -1, -1, -1).flatten(0, 1)  # [n·r, 1, bs, c·bs]
                km = None if g.full else g.mask[None, :, None].expand(n, -1, -1, -1, -1).flatten(0, 1)
                # 4-D inputs: SDPA takes its fused kernel there (5-D ones fall back to the math path)
                og, _ = attend(qg, kg, vg, bias=m, key_mask=km, scale=scale)
                og = og.transpose(1, 2).reshape(n, r, bs, h, dv)
                if n == b and g.q_index is None:                          # all rows, in order: no copy
                    out = og
                    continue
                if out is None:
                    out = og.new_empty(b, nb, bs, h, dv) if covered else og.new_zeros(b, nb, bs, h, dv)
                out[s:s + n].index_copy_(1, g.rows, og)
        out = q.new_zeros(b, nb, bs, h, dv) if out is None else out       # (no edge at all)
        return out.reshape(b, nb * bs, h, dv)[:, :u].transpose(1, 2)

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        """Reference path with an explicit softmax, also returning dense weights ``[B, H, U, U]``."""
        lay = self.layout
        (b, h, u, _), bs, nb = q.shape, lay.block_size, lay.num_blocks
        qb, kb, vb = (F.pad(x, (0, 0, 0, nb * bs - u)).unflatten(2, (nb, bs)) for x in (q, k, v))
        out = q.new_zeros(b, h, nb, bs, v.shape[-1])
        weights = q.new_zeros(b, h, nb, nb, bs, bs)                       # [.., q block, k block, i, j]
        for g, bias in zip(lay.groups, self.blocks):
            r, c = g.cols.shape
            kg, vg = (x[:, :, g.cols].flatten(3, 4) for x in (kb, vb))    # [B, H, r, c·bs, d]
            o, w = attend(qb[:, :, g.rows], kg, vg, bias=bias, key_mask=g.mask, scale=scale,
                          return_weights=True)
            out[:, :, g.rows] = o
            weights[:, :, g.rows[:, None], g.cols] = w.view(b, h, r, bs, c, bs).transpose(3, 4)
        weights = weights.transpose(3, 4).reshape(b, h, nb * bs, nb * bs)[:, :, :u, :u]
        return out.flatten(2, 3)[:, :, :u], weights


def block_sparse_attend(q: Tensor, k: Tensor, v: Tensor, layout: BlockSparseLayout,
                        bias: Tensor | None = None, scale: float | None = None) -> Tensor:
    """``softmax_j(q_i·k_j·scale + bias_ij) v_j`` over the edges allowed by ``layout``.

    q, k ``[B, H, U, d]``, v ``[B, H, U, dv]``; bias: dense additive log-kernel
    ``[B|1, 1, U, U]`` (or None), gathered into the kept blocks. Equals
    ``attend(q, k, v, bias=bias, key_mask=mask)``; receivers with no allowed sender get 0.
    Returns ``out [B, H, U, dv]``."""
    return BlockSparseBias(layout, layout.gather(bias, q.dtype)).attend(q, k, v, scale=scale)[0]


class BlockSparseKernel(nn.Module):
    """A precomputed block-sparse propagator kernel for inference (NAC App. F): called like a
    :class:`~modwire.nn.kernel.SignatureKernel`, it returns its :class:`BlockSparseBias` as the
    attention bias. ``inner`` (the edge-masked kernel it was made from) keeps the edge mask
    and answers ``link_probs``; a model saved with it installed reloads edge-masked, dense."""

    def __init__(self, inner: nn.Module, pattern: BlockSparseBias) -> None:
        super().__init__()
        object.__setattr__(self, "inner", inner)   # the model owns it (see EdgeMaskedKernel)
        self.pattern = pattern
        self.register_buffer("edge_mask", inner.edge_mask)

    deterministic = True

    def link_probs(self, s_recv: Tensor, s_send: Tensor) -> Tensor:
        return self.inner.link_probs(s_recv, s_send)

    def forward(self, s_recv: Tensor, s_send: Tensor, batch_size: int = 1) -> tuple[BlockSparseBias, None]:
        if self.training:
            raise RuntimeError("this NAC has a precomputed block-sparse propagator kernel, which is for "
                               "inference only: call .eval(), or re-install a kernel to train")
        return self.pattern, None


def block_order(mask: Tensor, method: str = "rcm") -> Tensor:
    """A module permutation ``[U]`` (long) that makes the kept edges of ``mask`` ``[U, U]``
    blocky: apply it as ``mask[perm][:, perm]`` (and to the module axis of states, codes
    and signatures). ``method="rcm"``: reverse Cuthill-McKee on the symmetrised mask
    (connected components become contiguous, bandwidth is reduced)."""
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1] or mask.dtype != torch.bool:
        raise UserError(f"mask must be a square bool [U, U] tensor, got {tuple(mask.shape)} {mask.dtype}")
    if method != "rcm":
        raise UserError(f"method must be 'rcm', got {method!r} (for cluster labels use order_by_groups)")
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    sym = (mask | mask.T).cpu().numpy()
    perm = reverse_cuthill_mckee(csr_matrix(sym), symmetric_mode=True)
    return torch.as_tensor(perm.copy(), dtype=torch.long, device=mask.device)


def order_by_groups(groups: Tensor) -> Tensor:
    """A module permutation ``[U]`` putting modules with the same integer label ``groups``
    ``[U]`` (e.g. the planted-partition cluster a module is matched to) next to each other,
    keeping their relative order (stable sort)."""
    if groups.dim() != 1 or groups.is_floating_point():
        raise UserError(f"groups must be a 1-D integer tensor [U], got {tuple(groups.shape)} {groups.dtype}")
    return torch.sort(groups, stable=True).indices
