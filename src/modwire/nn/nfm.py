"""Neural Function Modules (NFM; Lamb et al., "Neural Function Modules with Sparse Arguments").

:class:`NFM` wraps an unchanged sequence of blocks ``f^(1) … f^(N)`` and runs NFM Algorithm 1::

    M := []                                          # the memory: every state written so far
    for k = 1 … K:                                   # passes
        h^(0) := x
        for i = 1 … N:
            A := Attention_k^(i)(Q = h^(i-1), K = V = [null, rescale(M_j) for all j])
            h^(i) := f_k^(i)(h^(i-1) + γ·σ(BN(A W_o1)) W_o2)
            M.append(h^(i))

**Memory.** Alg. 1 line 7 prints ``for j = 1 to i``, but the text (§1, Fig. 1: "attend over all of
the previously seen passes"; §3.2: "stores every previously seen layer") has every state read:
the reader before block ``i`` of pass ``k`` reads the outputs of all ``N`` blocks of every earlier
pass and of blocks ``1 … i-1`` of pass ``k``, in that (memory) order. The input ``x`` itself is not
in the memory (Alg. 1 appends block outputs only), so the first reader of the first pass reads
only the null slot: ``A = 0``.

**Attention (§3.2.1),** per reader (``θ̃`` differs per layer and per pass), ``heads`` heads, per
query POSITION: the query is ``h^(i-1)`` at that position, the keys are the memory states at the
same position after rescaling (so attention runs over layers, not over positions; causal
sequence models stay causal). ``Q̂ = q W_q``, ``K̂ = K W_k``, ``V̂ = V W_v``; the scores are
``Q̂K̂ᵀ / d_k`` as printed (``score_scale="d_k"``, default; ``"sqrt_d_k"``: the Transformer's
``1/√d_k``, a fixed temperature that ``W_q`` can also learn); a zero key and value are prepended
("Default Computation": score 0); only the top ``k`` scores of each row, the null slot competing
like any key, enter a softmax renormalised over the kept keys (Ke et al. 2018, as the authors'
code; the configured ``k`` is always used). The memory states differ in channel count: each reader
has one ``W_k`` / ``W_v`` per distinct channel count it reads ("channel counts mapped by the
per-layer key/value projections"). Output: ``h = R + γ·σ(BN(A W_o1)) W_o2`` with ``γ`` a learned
scalar initialised to 0, BatchNorm (over batch and positions) before ``σ`` when ``norm="batch"``.

**Rescaling (§3.2.2, "automatic type conversion")** of a source to the query's spatial size,
per spatial dimension (1-D sequences, 2-D images, 3-D volumes; a vector ``[B, C]`` is a
size-1 grid): equal size, nothing; coarser source, nearest-neighbour upsampling; finer source,
SpaceToDepth: each of the ``r = ⌈src / dst⌉`` positions of the local window becomes its own key
(window positions in row-major order); a size that is not a multiple of the query's is first
resized (nearest) to ``r · dst``. ``rescale="nearest"``: nearest-neighbour downsampling instead
(the §4.7 ablation). The projections are per-position linear maps, so they commute with both
rescalings: each source is projected at its own resolution, then rescaled (exact, cheaper when
upsampling).

**Passes.** ``share_blocks=False`` (Alg. 1's ``f_{θ_k}``, the authors' code): pass ``k ≥ 2`` runs its
own copy of the blocks, initialised as a copy of the first, so with ``γ = 0`` every pass computes
the base network and the output equals the base network's (tested). ``share_blocks=True``: every
pass reuses the same blocks.

Shapes: states are ``[B, C, *spatial]`` (``layout="channels_first"``) or ``[B, N, C]``
(``layout="tokens"``). ``random_attention = True`` (evaluation ablation, §4.4) replaces every
score, the null slot's included, by a standard Gaussian draw.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import attend

NORMS = ("batch", "none")
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}
RESCALES = ("space_to_depth", "nearest")
SCORE_SCALES = ("d_k", "sqrt_d_k")
LAYOUTS = ("channels_first", "tokens")


def _choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"NFM: {name} must be one of {list(choices)}, got {value!r}")


# --------------------------------------------------------------------------------------------
# Rescaling (§3.2.2)
# --------------------------------------------------------------------------------------------

def rescale(state: Tensor, size: Sequence[int], *, mode: str = "space_to_depth") -> Tensor:
    """A source state ``[B, C, *S_src]`` as keys at the query's positions: ``[B, C, R, *size]``,
    ``R`` keys per position (NFM §3.2.2; module docstring). A source with fewer spatial dims than
    the query (e.g. a vector ``[B, C]``) is a grid of size 1 along the missing ones (and the
    reverse for a vector query, ``size = ()``)."""
    size = tuple(int(s) for s in size)
    b, c, src = state.shape[0], state.shape[1], tuple(state.shape[2:])
    dims = max(len(src), len(size))
    if len(src) not in (0, dims) or len(size) not in (0, dims):
        raise ValueError(f"NFM rescale: a state with spatial shape {list(src)} cannot be read at spatial shape "
                         f"{list(size)} (expected the same number of spatial dims, or a vector)")
    src_full, dst = src or (1,) * dims, size or (1,) * dims
    x = state.reshape(b, c, *src_full)
    if mode == "nearest":
        r = (1,) * dims
    else:
        r = tuple(max(1, math.ceil(s / t)) for s, t in zip(src_full, dst))
    mid = tuple(t * f for t, f in zip(dst, r))
    if mid != src_full:
        x = F.interpolate(x, size=mid, mode="nearest")
    if all(f == 1 for f in r):
        return x.reshape(b, c, 1, *size)
    # SpaceToDepth: [B, C, t1, r1, t2, r2, …] → [B, C, r1, r2, …, t1, t2, …]
    x = x.reshape(b, c, *[v for pair in zip(dst, r) for v in pair])
    order = [0, 1, *range(3, 2 + 2 * dims, 2), *range(2, 2 + 2 * dims, 2)]
    return x.permute(order).reshape(b, c, math.prod(r), *size)


def _linear(x: Tensor, layer: nn.Linear) -> Tensor:
    """A per-position linear map on channels-first ``x [B, C, *S]`` → ``[B, D, *S]``."""
    b, c, *s = x.shape
    y = torch.matmul(layer.weight, x.reshape(b, c, -1))                               # [B, D, P]
    if layer.bias is not None:
        y = y + layer.bias[:, None]
    return y.reshape(b, -1, *s)


# --------------------------------------------------------------------------------------------
# One reader: the attention before block i of pass k (§3.2.1)
# --------------------------------------------------------------------------------------------

@dataclass
class NFMRecord:
    """What one reader read. ``sources``: ``(pass, layer)`` of each memory entry, in memory order
    (0-based); ``mass [B, n_sources]``: attention weight on each source's keys, summed over its
    window, averaged over heads and positions; ``null [B]``: the weight on the null slot."""

    pass_index: int
    layer_index: int
    sources: list[tuple[int, int]]
    mass: Tensor
    null: Tensor


class NFMReader(nn.Module):
    """``Attention_k^(i)`` of NFM Alg. 1 with its output MLP and ``γ`` (§3.2.1).

    ``forward(h [B, C, *S], sources: list of [B, C_j, *S_j]) → (h + γ·σ(BN(A W_o1)) W_o2, read)``;
    ``read`` is None, or with ``record`` ``(mass [B, n_sources], null [B])``: the attention weight on
    each source's keys (summed over its window) and on the null slot, averaged over heads and positions. Subclasses may replace
    :meth:`project_query`, :meth:`project_source` and :meth:`output` (e.g. a transformer reusing its
    own attention projections, NFM Table 8)."""

    def __init__(self, query_channels: int, source_channels: Sequence[int], *, k: int = 5, d_k: int = 16,
                 d_v: int = 16, heads: int = 4, hidden: int = 0, norm: str = "batch", activation: str = "relu",
                 rescale: str = "space_to_depth", score_scale: str = "d_k") -> None:
        super().__init__()
        _choice("norm", norm, NORMS)
        _choice("activation", activation, ACTIVATIONS)
        _choice("rescale", rescale, RESCALES)
        _choice("score_scale", score_scale, SCORE_SCALES)
        for name, v in (("k", k), ("d_k", d_k), ("d_v", d_v), ("heads", heads), ("query_channels", query_channels)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"NFM: {name} must be a positive int, got {v!r}")
        self.k, self.d_k, self.d_v, self.heads = k, d_k, d_v, heads
        self.rescale, self.scale = rescale, 1.0 / d_k if score_scale == "d_k" else d_k ** -0.5
        hidden = hidden or query_channels
        self.query = nn.Linear(query_channels, heads * d_k)
        self.keys = nn.ModuleDict({str(c): nn.Linear(c, heads * d_k) for c in sorted(set(source_channels))})
        self.values = nn.ModuleDict({str(c): nn.Linear(c, heads * d_v) for c in sorted(set(source_channels))})
        self.w_o1 = nn.Linear(heads * d_v, hidden)
        self.norm = nn.BatchNorm1d(hidden) if norm == "batch" else nn.Identity()
        self.act = ACTIVATIONS[activation]()
        self.w_o2 = nn.Linear(hidden, query_channels)
        self.gamma = nn.Parameter(torch.zeros(()))       # γ = 0 at initialisation (§3.2.1)
        self.random_attention = False

    def project_query(self, h: Tensor) -> Tensor:
        """``h [B, C, *S]`` → ``Q̂ [B, heads·d_k, *S]``."""
        return _linear(h, self.query)

    def project_source(self, m: Tensor) -> tuple[Tensor, Tensor]:
        """A memory state ``[B, C_j, *S_j]`` → ``(K̂, V̂)`` at its own resolution."""
        c = str(m.shape[1])
        if c not in self.keys:
            raise ValueError(f"NFM reader: a memory state has {m.shape[1]} channels; this reader was built for "
                             f"{list(self.keys)} (the channels given to NFM)")
        return _linear(m, self.keys[c]), _linear(m, self.values[c])

    def output(self, a: Tensor, h: Tensor) -> Tensor:
        """``A [B, heads·d_v, P]`` → ``h + γ·σ(BN(A W_o1)) W_o2``, shaped like ``h``."""
        b, c = h.shape[:2]
        z = torch.matmul(self.w_o1.weight, a) + self.w_o1.bias[:, None]                # [B, hidden, P]
        z = self.act(self.norm(z))
        z = torch.matmul(self.w_o2.weight, z) + self.w_o2.bias[:, None]                # [B, C, P]
        return h + self.gamma * z.reshape(h.shape)

    def forward(self, h: Tensor, sources: list[Tensor], *, record: bool = False) -> tuple[Tensor, Tensor | None]:
        b, size, hd, vd = h.shape[0], tuple(h.shape[2:]), self.heads, self.d_v
        p = math.prod(size)
        q = self.project_query(h).reshape(b, hd, self.d_k, 1, p).permute(0, 1, 4, 3, 2)   # [B, H, P, 1, dk]
        keys, values, counts = [], [], []
        for m in sources:
            kk, vv = self.project_source(m)
            keys.append(self._at(rescale(kk, size, mode=self.rescale), self.d_k))
            values.append(self._at(rescale(vv, size, mode=self.rescale), vd))
            counts.append(keys[-1].shape[3])
        if keys:
            kk, vv = torch.cat(keys, dim=3), torch.cat(values, dim=3)                 # [B, H, P, S, d]
        else:
            kk, vv = q.new_zeros(b, hd, p, 0, self.d_k), q.new_zeros(b, hd, p, 0, vd)
        if self.random_attention:
            if self.training:
                raise ValueError("NFM: random_attention is an evaluation ablation (NFM §4.4); call model.eval() first")
            a, w = self._random(q, kk, vv, record)
        else:
            a, w = attend(q, kk, vv, topk=self.k, null_kv=True, scale=self.scale, return_weights=record)
        a = a.reshape(b, hd, p, vd).permute(0, 1, 3, 2).reshape(b, hd * vd, p)          # [B, H·dv, P]
        read = None
        if record:
            w = w.squeeze(3).mean(dim=(1, 2))                                              # [B, n_keys]
            mass = torch.stack([s.sum(-1) for s in w.split(counts, dim=-1)], -1) if counts else w[:, :0]
            read = (mass, 1 - w.sum(-1))
        return self.output(a, h), read

    @staticmethod
    def _at(x: Tensor, d: int) -> Tensor:
        """``[B, H·d, R, *S]`` → ``[B, H, P, R, d]`` (the keys of each position)."""
        b, _, r = x.shape[:3]
        return x.reshape(b, -1, d, r, math.prod(x.shape[3:])).permute(0, 1, 4, 3, 2)

    def _random(self, q: Tensor, kk: Tensor, vv: Tensor, record: bool):
        """§4.4 ablation: every score (null slot included) ~ N(0, 1), then the same top-k softmax."""
        kk, vv = F.pad(kk, (0, 0, 1, 0)), F.pad(vv, (0, 0, 1, 0))                       # the null slot, explicit
        noise = torch.randn(*kk.shape[:3], 1, kk.shape[3], dtype=q.dtype, device=q.device)
        a, w = attend(torch.zeros_like(q), kk, vv, bias=noise, topk=self.k, scale=self.scale, return_weights=record)
        return a, (None if w is None else w[..., 1:])


# --------------------------------------------------------------------------------------------
# Algorithm 1
# --------------------------------------------------------------------------------------------

LayerFactory = Callable[..., NFMReader]


class NFM(nn.Module):
    """NFM Algorithm 1 around ``blocks`` (module docstring). ``channels = (c_0, …, c_N)``: the
    channels of the input ``x`` and of each block's output. ``forward(x, record=False)`` → the
    last pass's ``h^(N)``; with ``record`` it fills :attr:`records` (one :class:`NFMRecord` per
    reader, in execution order) and :attr:`pass_outputs` (``h^(N)`` of every pass).

    ``layer_factory(pass_index, layer_index, query_channels, source_channels, **options)`` builds
    each reader (default :class:`NFMReader`; ``options`` are this constructor's reader options)."""

    def __init__(self, blocks: Sequence[nn.Module], *, channels: Sequence[int], k: int = 5, passes: int = 2,
                 d_k: int = 16, d_v: int = 16, heads: int = 4, hidden: int = 0, norm: str = "batch",
                 activation: str = "relu", rescale: str = "space_to_depth", score_scale: str = "d_k",
                 share_blocks: bool = False, layout: str = "channels_first",
                 layer_factory: LayerFactory | None = None) -> None:
        super().__init__()
        blocks, channels = list(blocks), [int(c) for c in channels]
        if not blocks:
            raise ValueError("NFM: expected at least one block, got none")
        if len(channels) != len(blocks) + 1:
            raise ValueError(f"NFM: channels must list the input's and each block's output channel count "
                             f"({len(blocks) + 1} numbers for {len(blocks)} blocks), got {len(channels)}: {channels}")
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"NFM: passes must be a positive int, got {passes!r}")
        _choice("layout", layout, LAYOUTS)
        self.passes, self.num_blocks, self.channels = passes, len(blocks), channels
        self.layout, self.share_blocks = layout, share_blocks
        self.blocks = nn.ModuleList(blocks)
        self.pass_blocks = nn.ModuleList() if share_blocks else nn.ModuleList(
            copy.deepcopy(self.blocks) for _ in range(passes - 1))
        make = layer_factory or (lambda p, i, cq, cs, **o: NFMReader(cq, cs, **o))
        options = dict(k=k, d_k=d_k, d_v=d_v, heads=heads, hidden=hidden, norm=norm, activation=activation,
                       rescale=rescale, score_scale=score_scale)
        self.readers = nn.ModuleList(
            make(p, i, channels[i], [channels[j + 1] for (_, j) in self.sources_of(p, i)], **options)
            for p in range(passes) for i in range(self.num_blocks))
        self.records: list[NFMRecord] = []
        self.pass_outputs: list[Tensor] = []

    def sources_of(self, pass_index: int, layer_index: int) -> list[tuple[int, int]]:
        """``(pass, layer)`` of the memory entries the reader before block ``layer_index`` of pass
        ``pass_index`` reads, in memory order (all earlier passes, then this pass's earlier blocks)."""
        return [(p, j) for p in range(pass_index) for j in range(self.num_blocks)] + \
            [(pass_index, j) for j in range(layer_index)]

    @property
    def random_attention(self) -> bool:
        return bool(self.readers[0].random_attention)

    @random_attention.setter
    def random_attention(self, value: bool) -> None:
        for r in self.readers:
            r.random_attention = bool(value)

    def block(self, pass_index: int, layer_index: int) -> nn.Module:
        """``f_{θ_k}^(i)``: the block that pass ``pass_index`` runs at ``layer_index``."""
        if self.share_blocks or pass_index == 0:
            return self.blocks[layer_index]
        return self.pass_blocks[pass_index - 1][layer_index]

    def forward(self, x: Tensor, *, record: bool = False) -> Tensor:
        tokens = self.layout == "tokens"
        h0 = self._state(x, 0, tokens)
        memory: list[Tensor] = []
        self.records, self.pass_outputs = [], []
        for p in range(self.passes):
            h = h0
            for i in range(self.num_blocks):
                reader = self.readers[p * self.num_blocks + i]
                h, w = reader(h, memory, record=record)
                if record:
                    self._record(p, i, w)
                out = self.block(p, i)(h.transpose(1, 2) if tokens else h)
                h = self._state(out, i + 1, tokens)
                memory.append(h)
            if record:
                self.pass_outputs.append(h.transpose(1, 2) if tokens else h)
        return h.transpose(1, 2) if tokens else h

    def _state(self, h: Tensor, index: int, tokens: bool) -> Tensor:
        """A state as channels-first ``[B, C, *S]``, its channel count checked against ``channels``."""
        if not isinstance(h, Tensor) or h.dim() < 2 or (tokens and h.dim() != 3):
            what = "the input x" if index == 0 else f"block {index - 1}'s output"
            shape = list(h.shape) if isinstance(h, Tensor) else type(h).__name__
            layout = "[B, N, C]" if tokens else "[B, C, *spatial]"
            raise ValueError(f"NFM: expected {what} as a tensor {layout}, got {shape}")
        c = h.shape[2] if tokens else h.shape[1]
        if c != self.channels[index]:
            what = "the input x" if index == 0 else f"block {index - 1}'s output"
            raise ValueError(f"NFM: expected {what} to have {self.channels[index]} channels (channels[{index}]), "
                             f"got {c} (shape {list(h.shape)})")
        return h.transpose(1, 2) if tokens else h

    def _record(self, p: int, i: int, read: tuple[Tensor, Tensor]) -> None:
        mass, null = read
        self.records.append(NFMRecord(p, i, self.sources_of(p, i), mass, null))
