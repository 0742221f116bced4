"""Neural Function Modules (NFM; Lamb et al., "Neural Function Modules with Sparse Arguments").

:class:`NFM` wraps an unchanged sequence of blocks ``f^(1) … f^(N)`` and runs NFM Algorithm 1::

    M := []                                          # the memory: every state written so far
    for k = 1 … K:                                   # passes
        h^(0) := x
        for i = 1 … N:
            A := Attention_k^(i)(Q = h^(i-1), K = V = [null, rescale(M_j) for all j])
            h^(i) := f_k^(i)(h^(i-1) + γ·σ(BN(A W_o1)) W_o2)
            M.append(h^(i))

(``read_at="before"``, the default: Alg. 1 reads before every block of every pass.
``read_at="after_last_pass"`` is the authors' Sort-of-CLEVR code (``ConvInputModel_NFL2``): the
earlier passes only write; in the last pass each block's output ``h^(i)`` is first written, then
reads the memory (all earlier passes and this pass's blocks ``1 … i``, itself included) and
``h^(i) + γ·…`` goes on to block ``i + 1``, the last one to the network's head.)

**Memory.** Alg. 1 line 7 prints ``for j = 1 to i``, but the text (§1, Fig. 1: "attend over all of
the previously seen passes"; §3.2: "stores every previously seen layer") has every state read:
the reader before block ``i`` of pass ``k`` reads the outputs of all ``N`` blocks of every earlier
pass and of blocks ``1 … i-1`` of pass ``k``, in that (memory) order. The input ``x`` itself is not
in the memory (Alg. 1 appends block outputs only), so the first reader of the first pass reads
only the null slot: ``A = 0`` and its read adds ``γ·σ(0·W_o1) W_o2 = 0``. That module has no read
parameters (no ``W_q``, ``W_o1``, BN, ``W_o2``, ``γ``: through their biases they could only add a
learned constant to ``x``, which Alg. 1 does not print); it only writes.

**Attention (§3.2.1),** per reader (``θ̃`` differs per layer and per pass), ``num_heads`` heads, per
query POSITION: the query is ``h^(i-1)`` at that position, the keys are the memory states at the
same position after rescaling (so attention runs over layers, not over positions; causal
sequence models stay causal). ``Q̂ = q W_q``, ``K̂ = K W_k``, ``V̂ = V W_v``; the scores are
``Q̂K̂ᵀ / d_k`` as printed (``score_scale="d_k"``, default; ``"sqrt_d_k"``: the Transformer's
``1/√d_k``, a fixed temperature that ``W_q`` can also learn, and the authors' code's
``temperature = d_k^0.5``); a zero key and value are prepended ("Default Computation": score 0).
Top-k, ``topk_softmax="kept"`` (default, §3.2.1's text: "softmax top-k attention ..., in which the
attention only attends over the elements with the top-k highest attention scores"): the top ``k``
scores of each row, the null slot competing like any key, enter a softmax renormalised over the
kept keys. ``topk_softmax="subtract"`` is the authors' code (Ke et al. 2018's ``SparseAttention``):
the softmax over all keys minus its (k+1)-th largest weight, clipped at 0 and renormalised
(:func:`modwire.nn.attention.sparse_softmax`). The configured ``k`` is always used (the authors'
Sort-of-CLEVR code configures 5 but silently runs 3; ``AUTHORS_NFM_CNN`` of
:mod:`modwire.models.relational_cnn` sets 3). "We use linear operations (separate per module) to
compute the key, value, and query for each module": module ``(k, i)`` owns ``W_q`` (applied to its
query ``h^(i-1)``) and ``W_k``, ``W_v`` (applied to its output ``h^(i)`` when it is written to the
memory), so each state is projected once, by the module that wrote it, whatever its channel count
("channel counts mapped by the per-layer key/value projections"). (The very last module's output is
never read: it has no ``W_k``, ``W_v``.) Output: ``h = R + γ·σ(BN(A W_o1)) W_o2`` with ``γ`` a learned
scalar initialised to 0, BatchNorm (over batch and positions) before ``σ`` when ``norm="batch"``
(``reader_output="linear"``, §3.2.1: "one linear layer, followed by an activation, followed by a
linear layer"); ``reader_output="conv3x3"``: ``W_o1`` and ``W_o2`` are 3×3 convolutions (padding
1) over the query's grid, as the authors' ``out_layers`` (2-D states only). With BatchNorm, ``W_o1``
has no bias (the BatchNorm cancels it in training: it would never get a gradient; in the authors'
code it has one); ``output_bias=False`` leaves out ``W_o2``'s bias too, for networks in which every
path from the read starts with a BatchNorm (a pre-activation ResNet, the GAN generator), where
that bias would never get a gradient either.

**Rescaling (§3.2.2, "automatic type conversion")** of a source to the query's spatial size,
per spatial dimension (1-D sequences, 2-D images, 3-D volumes; a vector ``[B, C]`` is a
size-1 grid): equal size, nothing; coarser source, nearest-neighbour upsampling; finer source,
SpaceToDepth: each of the ``r = ⌈src / dst⌉`` positions of the local window becomes its own key
(window positions in row-major order); a size that is not a multiple of the query's is first
resized (nearest) to ``r · dst``. ``rescale="nearest"``: nearest-neighbour downsampling instead
(the §4.7 ablation). :func:`rescale` builds these keys explicitly; the forward never does.

**The read, as computed** (:mod:`modwire.nn.nfm_read`). Each written ``K̂_j, V̂_j`` is kept as
``[B, H, d, N_j]`` (positions innermost), in a *read order* of its grid's positions (finest binary
digits first) when a read needs it, in which a source ``2^k`` times coarser or finer than the query
in every dim is a view: one key under ``U`` query cells, or ``R`` SpaceToDepth keys per query cell,
with no resized or rearranged copy. Per source, ``scores_j [B, H, R_j, P] = Σ_d Q̂ · K̂_j`` (a
broadcast product along the positions, summed over ``d``); the null slot's and every source's
scores are concatenated in memory order (``[B, H, 1 + n, P]``, the softmax over the keys axis) and
``A [B, H, d_v, P] = Σ_j Σ_r w_j V̂_j``. Any other source (a ratio that is not a power of 2, or
differs between dims, or every unequal source under ``rescale="nearest"`` with such a ratio) is
gathered by positions into the same form, as the nearest resize and SpaceToDepth define it, at
most once per forward and target grid (a dict that :class:`NFM` creates per forward and drops
after it). ``A`` stays channels-first through ``W_o1``, BN, ``σ`` and ``W_o2`` into ``h``. Tested
against the literal rescaling and reader (``tests/reference/nfm.py``).

**Few query channels (exact factored forms).** With ``Q̂_h = W_q,h h + b_q,h`` (``W_q,h [d_k, C_q]``,
``b_q,h``: head ``h``'s rows) and ``c`` the score scale, ``c·Q̂_h[p]·k̂ = [h_p, 1]·c[W_q,hᵀ k̂, b_q,h·k̂]``:
the keys of every source are mapped per head on their own grid to ``K̃_j [B, H, C_q + 1, N_j]``
(then gathered where the source is gathered; a per-position map commutes with the nearest
resize), and the scores are the same broadcast product with the query ``[h, 1] [B, 1, C_q + 1, P]``
(one for all heads) in place of ``Q̂``. Likewise ``W_o1 A = Σ_h Σ_j Σ_r w_j (W_o1,h V̂_j,h)`` with
``W_o1,h [hidden, d_v]`` head ``h``'s columns (``reader_output="linear"``): the values are mapped per
head on their grids to ``Ṽ_j [B, H, hidden, N_j]``, summed as above into ``[B, H, hidden, P]``, then
over heads, plus ``b_o1``, then BN, ``σ``, ``W_o2`` as before. Each form is taken, per reader, where its
mapped width is below the head's (``C_q + 1 < d_k``; ``hidden < d_v``) and a multiply count
from the shapes (map on the source grids, gather, contraction; against the default's ``Q̂``
projection and ``W_o1 A``) favours it; the mapped ``K̃_j``, ``Ṽ_j`` belong to their reader (not
cached). Neither form is taken by a subclass that replaces :meth:`NFMLayer.project_query` or
:meth:`NFMLayer.output`.

**Passes.** ``share_blocks=False`` (Alg. 1's ``f_{θ_k}``, the authors' code): pass ``k ≥ 2`` runs its
own copy of the blocks, initialised as a copy of the first, so with ``γ = 0`` every pass computes
the base network and the output equals the base network's (tested). Loading a base network's
weights (``blocks.<i>.…``, e.g. ``load_state_dict(base, strict=False)`` or
:func:`modwire.models.nfm.load_base_weights`) fills every pass: a pass copy missing from the
loaded state takes the first pass's tensors (implementation notes §3: "every pass starts from the
base's weights"). ``share_blocks=True``: every pass reuses the same blocks.

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

from .attention import sparse_softmax
from .blocks import run_block
from .nfm_read import (MemoryEntry, SourceRead, add_source_values, aligned, from_read_order, source_read,
                       source_scores, to_read_order)
from ..errors import UserError
from ..fields import check_argument

NORMS = ("batch", "none")
READER_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}
RESCALES = ("space_to_depth", "nearest")
SCORE_SCALES = ("d_k", "sqrt_d_k")
LAYOUTS = ("channels_first", "tokens")
TOPK_SOFTMAX = ("kept", "subtract")                 # §3.2.1's text / the authors' code (Ke et al. 2018)
READ_AT = ("before", "after_last_pass")             # Alg. 1 / the authors' Sort-of-CLEVR code
READER_OUTPUTS = ("linear", "conv3x3")              # §3.2.1 / the authors' out_layers


_CHOICES = {"norm": NORMS, "activation": tuple(READER_ACTIVATIONS), "rescale": RESCALES, "score_scale": SCORE_SCALES,
            "topk_softmax": TOPK_SOFTMAX, "reader_output": READER_OUTPUTS, "read_at": READ_AT, "layout": LAYOUTS}


def _check_options(**options: str) -> None:
    for name, value in options.items():
        check_argument(name, value, _CHOICES[name], "NFM")


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
        raise UserError(f"NFM rescale: a state with spatial shape {list(src)} cannot be read at spatial shape "
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


# --------------------------------------------------------------------------------------------
# One module's attention parameters θ̃ (§3.2.1)
# --------------------------------------------------------------------------------------------

def pointwise_linear(h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``h [B, C, *S]`` → ``W h + b`` at every position, channels-first ``[B, out, P]``: one batched product
    over the channels-first ``h`` as it is (a transposed view, e.g. of tokens ``[B, N, C]``, too), the bias
    added in it."""
    b, c = h.shape[0], h.shape[1]
    x = h.reshape(b, c, -1)
    if bias is None:
        return torch.bmm(weight.expand(b, -1, -1), x)
    return torch.baddbmm(bias[:, None].expand(b, -1, x.shape[2]), weight.expand(b, -1, -1), x)


def residual_linear(h: Tensor, gamma: Tensor, weight: Tensor, bias: Tensor | None, z: Tensor) -> Tensor:
    """``h + γ·(W z + b)`` for ``h [B, C, *S]`` and ``z [B, D, P]``, shaped like ``h``: one batched product,
    ``(γ·W) z`` added to ``h + γ·b`` (no ``[B, C, P]`` output to scale and add)."""
    b, c = h.shape[0], h.shape[1]
    out = h.reshape(b, c, -1)
    if bias is not None:
        out = out + (gamma * bias)[:, None]
    return torch.baddbmm(out, (gamma * weight).expand(b, -1, -1), z).reshape(h.shape)


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


class NFMLayer(nn.Module):
    """The attention parameters ``θ̃`` of module ``(k, i)`` (NFM §3.2.1): ``W_q`` for its read before
    block ``i``, ``W_k``, ``W_v`` for its output written to the memory (``writes``), ``W_o1``, BN, ``σ``,
    ``W_o2`` and ``γ``. The first module of the first pass reads an empty memory (``reads=False``: no
    ``W_q``; ``A = 0``) and the last module of the last pass is never read (``writes=False``: no
    ``W_k``, ``W_v``). ``residual=False``: a module that only writes (no ``W_q``, ``W_o1``, BN,
    ``W_o2``, ``γ``; :meth:`read` refuses): the first module of the first pass (it would read only the
    null slot) and the earlier passes of ``read_at="after_last_pass"``. ``output_bias``: ``W_o2``'s bias
    (``W_o1`` has none with ``norm="batch"``; module docstring).

    :meth:`read` ``(h [B, C, *S], memory: list of MemoryEntry) → (h + γ·σ(BN(A W_o1)) W_o2, read)``;
    ``read`` is None, or with ``record`` ``(mass [B, n_sources], null [B])`` (:class:`NFMRecord`);
    ``cache``: a dict shared by the reads of one forward over the same ``memory`` (gathered sources,
    module docstring), or None.
    :meth:`write` ``(h^(i)) → MemoryEntry`` (``K̂ [B, H, d_k, N]``, ``V̂ [B, H, d_v, N]``, the grid;
    :mod:`modwire.nn.nfm_read`). ``topk_softmax`` and
    ``reader_output``: module docstring. Subclasses may replace :meth:`project_query`,
    :meth:`project_memory` and :meth:`output` (e.g. a transformer reusing its own attention
    projections, NFM Table 8)."""

    def __init__(self, query_channels: int, out_channels: int, *, reads: bool = True, writes: bool = True,
                 residual: bool = True, k: int = 5, d_k: int = 16, d_v: int = 16, num_heads: int = 4, ffn_hidden: int = 0,
                 norm: str = "batch", activation: str = "relu", rescale: str = "space_to_depth",
                 score_scale: str = "d_k", topk_softmax: str = "kept", reader_output: str = "linear",
                 output_bias: bool = True) -> None:
        super().__init__()
        _check_options(norm=norm, activation=activation, rescale=rescale, score_scale=score_scale,
                       topk_softmax=topk_softmax, reader_output=reader_output)
        for name, v in (("k", k), ("d_k", d_k), ("d_v", d_v), ("num_heads", num_heads), ("query_channels", query_channels),
                        ("out_channels", out_channels)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"NFM: {name} must be a positive int, got {v!r}")
        self.k, self.d_k, self.d_v, self.heads = k, d_k, d_v, num_heads
        self.rescale, self.scale = rescale, 1.0 / d_k if score_scale == "d_k" else d_k ** -0.5
        self.topk_softmax, self.reader_output, self.residual = topk_softmax, reader_output, residual
        hidden = ffn_hidden or query_channels
        self.query = nn.Linear(query_channels, num_heads * d_k) if reads and residual else None
        self.key = nn.Linear(out_channels, num_heads * d_k) if writes else None
        self.value = nn.Linear(out_channels, num_heads * d_v) if writes else None
        self.w_o1 = self.norm = self.act = self.w_o2 = self.gamma = None
        if residual:
            conv = reader_output == "conv3x3"             # the authors' out_layers: 3×3 convs, BatchNorm2d
            b1 = norm != "batch"                          # a BatchNorm after W_o1 cancels its bias (module docstring)
            self.w_o1 = nn.Conv2d(num_heads * d_v, hidden, 3, padding=1, bias=b1) if conv else \
                nn.Linear(num_heads * d_v, hidden, bias=b1)
            self.norm = (nn.BatchNorm2d(hidden) if conv else nn.BatchNorm1d(hidden)) if norm == "batch" \
                else nn.Identity()
            self.act = READER_ACTIVATIONS[activation]()
            self.w_o2 = nn.Conv2d(hidden, query_channels, 3, padding=1, bias=output_bias) if conv else \
                nn.Linear(hidden, query_channels, bias=output_bias)
            self.gamma = nn.Parameter(torch.zeros(()))   # γ = 0 at initialisation (§3.2.1)
        self.writes = writes
        self.random_attention = False

    def project_query(self, h: Tensor) -> Tensor:
        """``h [B, C, *S]`` → ``Q̂ [B, H, d_k, P]`` (:mod:`modwire.nn.nfm_read`'s layout)."""
        return pointwise_linear(h, self.query.weight, self.query.bias).view(h.shape[0], self.heads, self.d_k, -1)

    def project_memory(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """This module's output ``h^(i) [B, C, *S]`` → ``(K̂ [B, H, d_k, N], V̂ [B, H, d_v, N])``."""
        kv = pointwise_linear(h, torch.cat([self.key.weight, self.value.weight]),
                              torch.cat([self.key.bias, self.value.bias]))              # one pass over h for both
        k, v = kv.split([self.heads * self.d_k, self.heads * self.d_v], dim=1)
        return k.unflatten(1, (self.heads, self.d_k)), v.unflatten(1, (self.heads, self.d_v))

    def write(self, h: Tensor) -> MemoryEntry:
        """``h^(i) [B, C, *S]`` → its memory entry: ``K̂ [B, H, d_k, N]``, ``V̂ [B, H, d_v, N]`` (positions
        row-major; a read that needs them in read order orders them once per forward,
        :mod:`modwire.nn.nfm_read`) and the grid."""
        if not self.writes:
            raise RuntimeError("NFM: this module's output is never read (the last block of the last pass)")
        k, v = self.project_memory(h)
        return MemoryEntry(k, v, tuple(h.shape[2:]))

    def output(self, a: Tensor, h: Tensor) -> Tensor:
        """``A [B, heads·d_v, P]`` → ``h + γ·σ(BN(A W_o1)) W_o2``, shaped like ``h [B, C, *S]``
        (``reader_output="conv3x3"``: ``W_o1``, ``W_o2`` are 3×3 convolutions over ``h``'s grid)."""
        if self.reader_output == "conv3x3":
            if h.dim() != 4:
                raise UserError(f"NFM: reader_output='conv3x3' reads 2-D states [B, C, H, W], got {list(h.shape)}")
            z = a.reshape(h.shape[0], a.shape[1], *h.shape[2:])                        # [B, heads·d_v, H, W]
            return h + self.gamma * self.w_o2(self.act(self.norm(self.w_o1(z))))
        return self._output_hidden(pointwise_linear(a, self.w_o1.weight, self.w_o1.bias), h)   # [B, hidden, P]

    def _output_hidden(self, z: Tensor, h: Tensor) -> Tensor:
        """``z = A W_o1 [B, hidden, P]`` (bias included) → ``h + γ·σ(BN(z)) W_o2`` (``reader_output="linear"``)."""
        if self.training and isinstance(self.norm, nn.BatchNorm1d) and z.shape[0] * z.shape[2] == 1:
            raise UserError(f"NFM: the reader's BatchNorm (norm='batch', over batch and positions) needs more than "
                            f"one value per channel in training; got batch 1 of vector states [1, "
                            f"{h.shape[1]}]: train with a batch >= 2, or build the NFM with norm='none'")
        z = self.act(self.norm(z))                                   # BN over batch and positions, channels-first
        return residual_linear(h, self.gamma, self.w_o2.weight, self.w_o2.bias, z)

    def _factored(self, c_q: int, p: int, grids: list[tuple[int, ...]], hows: list[SourceRead]) -> tuple[bool, bool]:
        """Whether the scores and the values take their factored forms (module docstring, "Few query
        channels"): where the mapped width is below the head width (``C_q + 1 < d_k``; ``hidden < d_v``)
        and a multiply count of each form, from the shapes alone, favours it (the same choice on every
        call with these shapes); and only where the hooks they replace are this class's own."""
        hd, dk, dv = self.heads, self.d_k, self.d_v
        per = [(math.prod(g), p * how.r if how.gather else 0, p * how.keys) for g, how in zip(grids, hows)]

        def cost(d: int, mapped: int | None) -> int:   # per head: map each source (d → mapped), gather, contract
            m = mapped or d
            return hd * sum((s * d * m if mapped else 0) + gathered * m + pr * m for s, gathered, pr in per)
        cls = type(self)
        own_query = cls.project_query is NFMLayer.project_query and isinstance(self.query, nn.Linear)
        scores = own_query and c_q + 1 < dk and cost(dk, c_q + 1) < cost(dk, None) + p * c_q * hd * dk   # + Q̂
        hidden = self.w_o1.out_features if isinstance(self.w_o1, nn.Linear) else 0
        own_output = cls.output is NFMLayer.output and self.reader_output == "linear" and hidden > 0
        values = own_output and hidden < dv and \
            cost(dv, hidden) + p * hd * hidden < cost(dv, None) + p * hd * dv * hidden       # + Σ_h; + A W_o1
        return bool(scores), bool(values)

    def _spatial_dims(self, h: Tensor, memory: list[MemoryEntry]) -> int:
        """The number of spatial dims every state is read in (a vector counts as a grid of ones)."""
        ns = [h.dim() - 2] + [len(e.grid) for e in memory]
        dims = max(ns)
        if any(n not in (0, dims) for n in ns):   # a 1-D state read at a 2-D one (or the reverse): no rescaling defined
            shapes = [list(h.shape[2:])] + [list(e.grid) for e in memory]
            raise UserError(f"NFM: states with spatial shapes {shapes} cannot be read together: expected the "
                            f"same number of spatial dims ({dims}) for every state, or vectors [B, C]")
        return dims

    def read(self, h: Tensor, memory: list[MemoryEntry], *, record: bool = False, cache: dict | None = None):
        if not self.residual:
            raise RuntimeError("NFM: this module only writes (an earlier pass of read_at='after_last_pass')")
        b, p, hd = h.shape[0], math.prod(h.shape[2:]), self.heads
        if not memory:                                            # only the null slot: A = 0
            read = (h.new_zeros(b, 0), h.new_ones(b)) if record else None
            # through W_o1 although A = 0: its weight then gets a (zero) gradient, as every parameter must
            # for DistributedDataParallel
            return self.output(h.new_zeros(b, hd * self.d_v, p), h), read
        dims = self._spatial_dims(h, memory)
        grids = [e.grid or (1,) * dims for e in memory]
        dst = tuple(h.shape[2:]) or (1,) * dims
        hows = [source_read(g, dst, self.rescale) for g in grids]
        fast_scores, fast_values = self._factored(h.shape[1], p, grids, hows)
        ordered = any(how.u > 1 or how.r > 1 or how.gather for how in hows)   # equal grids need no read order
        if fast_scores:      # q̂·k̂ = [h, 1]·[W_q k̂, b_q·k̂] per head, scaled: the keys mapped on their grids
            wq = torch.cat([self.query.weight.view(hd, self.d_k, -1), self.query.bias.view(hd, self.d_k, 1)],
                           dim=-1).transpose(1, 2) * self.scale                          # [H, C_q + 1, d_k]
            x = h.reshape(b, h.shape[1], p)
            x = to_read_order(x, dst, cache) if ordered else x
            q = torch.cat([x, x.new_ones(b, 1, p)], dim=1).unsqueeze(1)               # [B, 1, C_q + 1, P]
        elif ordered and h.shape[1] < hd * self.d_k:       # fewer channels to reorder in the state than in Q̂
            q = self.project_query(to_read_order(h.reshape(b, h.shape[1], p), dst, cache)) * self.scale
        else:
            q = self.project_query(h) * self.scale                                     # [B, H, d_k, P]
            q = to_read_order(q, dst, cache) if ordered else q
        keys = self._operands(memory, 0, grids, dst, hows, ordered, cache, wq if fast_scores else None)
        null = q.new_zeros(b, hd, 1, p)                           # the zero key: score 0 ("Default Computation")
        scores = torch.cat([null, *[source_scores(q, k, how) for k, how in zip(keys, hows)]], dim=2)
        if self.random_attention:                                                     # [B, H, 1 + n, P]
            if self.training:
                raise UserError("NFM: random_attention is an evaluation ablation (NFM §4.4); call model.eval() first")
            scores = torch.randn_like(scores)
        w = sparse_softmax(scores, topk=self.k, topk_softmax=self.topk_softmax, dim=2)
        spans = w[:, :, 1:].split([how.keys for how in hows], dim=2)
        wo = self.w_o1.weight.view(-1, hd, self.d_v).transpose(0, 1) if fast_values else None   # [H, hidden, d_v]
        a = None      # fast_values: A W_o1 = Σ_h Σ_r w (W_o1,h V̂_h) per head, the values mapped on their grids
        for v, how, wj in zip(self._operands(memory, 1, grids, dst, hows, ordered, cache, wo), hows, spans):
            a = add_source_values(a, wj, v, how)                                       # [B, H, d_v or hidden, P]
        read = None
        if record:
            read = (torch.stack([wj.sum(2).mean(dim=(1, 2)) for wj in spans], -1), w[:, :, 0].mean(dim=(1, 2)))
        a = a.sum(1) if fast_values else a.reshape(b, -1, p)                           # [B, hidden or H·d_v, P]
        if not fast_values and ordered and self._hidden_first(a):   # W_o1 in read order: fewer channels to restore
            z = pointwise_linear(a, self.w_o1.weight, self.w_o1.bias)                  # [B, hidden, P]
            return self._output_hidden(from_read_order(z, dst, cache), h), read
        a = from_read_order(a, dst, cache) if ordered else a
        if fast_values:
            return self._output_hidden(a if self.w_o1.bias is None else a + self.w_o1.bias[:, None], h), read
        return self.output(a, h), read

    def _hidden_first(self, a: Tensor) -> bool:
        """Whether ``W_o1 A`` (per position, so it commutes with the read order) has fewer channels than
        ``A [B, H·d_v, P]``, for this class's own linear output."""
        return type(self).output is NFMLayer.output and self.reader_output == "linear" and \
            self.w_o1.out_features < a.shape[1]

    def _operands(self, memory: list[MemoryEntry], part: int, grids: list[tuple[int, ...]], dst: tuple[int, ...],
                  hows: list[SourceRead], ordered: bool, cache: dict | None, weight: Tensor | None) -> list[Tensor]:
        """Each source's ``K̂`` (``part`` 0) or ``V̂`` (1) as the read's operand (:func:`~modwire.nn.nfm_read.aligned`):
        in read order when the read needs it (ordered once per forward, shared by the readers), mapped per
        head by ``weight [H, c, d]`` in the factored forms (the reader's own, not kept)."""
        out = []
        for j, (entry, g, how) in enumerate(zip(memory, grids, hows)):
            x, name = entry[part], (j, part)
            if ordered:
                if cache is not None and ("ordered", j, part) in cache:
                    x = cache[("ordered", j, part)]
                else:
                    x = to_read_order(x, g, cache)
                    if cache is not None:
                        cache[("ordered", j, part)] = x
            if weight is not None:
                x, name = torch.matmul(weight, x), None                              # [B, H, c, N]
            out.append(aligned(x, g, dst, how, self.rescale, cache, name))
        return out


# --------------------------------------------------------------------------------------------
# Algorithm 1
# --------------------------------------------------------------------------------------------

LayerFactory = Callable[..., NFMLayer]


@torch.no_grad()
def infer_channels(blocks: Sequence[nn.Module], x: Tensor, layout: str = "channels_first") -> list[int]:
    """``(c_0, …, c_N)`` read off one run of ``blocks`` on ``x`` (evaluation mode, no gradients; each
    block's training mode is restored, so BatchNorm statistics are untouched)."""
    modes = [m.training for b in blocks for m in b.modules()]
    channel = (lambda t: t.shape[-1]) if layout == "tokens" else (lambda t: t.shape[1])
    try:
        for b in blocks:
            b.eval()
        out = [channel(x)]
        for b in blocks:
            x = b(x)
            out.append(channel(x))
    finally:
        for m, mode in zip([m for b in blocks for m in b.modules()], modes):
            m.training = mode
    return [int(c) for c in out]


#: Inductor options for compiling a network that holds an :class:`NFM` on the CPU (read by
#: :meth:`modwire.models.base.PretrainedModel.compile_options`): inductor's layout optimization, which
#: turns a convolution network's tensors channels-last, off. With it on, the compiled NFM pairs of
#: ``benchmarks/bench_nfm.py --compile`` ran slower than eager on the CPU; with it off, faster
#: (``benchmarks/results/nfm_compiled_cpu.md``, docs/speed.md). On a GPU this is unmeasured.
INDUCTOR_OPTIONS: dict[str, object] = {"layout_optimization": False}


class NFM(nn.Module):
    """NFM Algorithm 1 around ``blocks`` (module docstring). ``channels = (c_0, …, c_N)``: the
    channels of the input ``x`` and of each block's output; or ``example_input``, a batch the blocks
    accept, run once (:func:`infer_channels`) so that ``NFM(blocks, example_input=x, k=5, passes=2)``
    wraps a network in one line. ``forward(x, record=False)`` → the
    last pass's ``h^(N)``; with ``record`` it fills :attr:`records` (one :class:`NFMRecord` per
    reader, in execution order) and :attr:`pass_outputs` (``h^(N)`` of every pass).

    ``read_at``: ``"before"`` (Alg. 1: module ``(k, i)`` reads before block ``i``, its query
    ``h^(i-1)``) or ``"after_last_pass"`` (the authors' Sort-of-CLEVR code: only the last pass reads,
    after each block, its query ``h^(i)``; module docstring). ``topk_softmax``, ``reader_output``:
    module docstring. Weights of the base network loaded into ``blocks`` fill every pass (module
    docstring, "Passes").

    ``layer_factory(pass_index, layer_index, query_channels, out_channels, reads=…, writes=…,
    residual=…, **options)`` builds each module's :class:`NFMLayer` (``options``: this constructor's
    reader options); a layer that ignores ``residual``, ``topk_softmax`` or ``reader_output`` is refused.

    ``grad_checkpointing``: each block (not its reads and writes) recomputed in the backward
    (:func:`~modwire.nn.blocks.run_block`; set by the model's ``set_grad_checkpointing``)."""

    grad_checkpointing: bool = False

    def __init__(self, blocks: Sequence[nn.Module], *, channels: Sequence[int] | None = None,
                 example_input: Tensor | None = None, k: int = 5, passes: int = 2,
                 d_k: int = 16, d_v: int = 16, num_heads: int = 4, ffn_hidden: int = 0, norm: str = "batch",
                 activation: str = "relu", rescale: str = "space_to_depth", score_scale: str = "d_k",
                 topk_softmax: str = "kept", reader_output: str = "linear", output_bias: bool = True,
                 read_at: str = "before",
                 share_blocks: bool = False, layout: str = "channels_first",
                 layer_factory: LayerFactory | None = None) -> None:
        super().__init__()
        blocks = list(blocks)
        if not blocks:
            raise UserError("NFM: expected at least one block, got none")
        if (channels is None) == (example_input is None):
            raise UserError("NFM: give either channels=(c_0, …, c_N) or example_input= (a batch the blocks accept, "
                            "run once to read each state's channels), not both or neither")
        channels = [int(c) for c in channels] if channels is not None else \
            infer_channels(blocks, example_input, layout)
        if len(channels) != len(blocks) + 1:
            raise UserError(f"NFM: channels must list the input's and each block's output channel count "
                            f"({len(blocks) + 1} numbers for {len(blocks)} blocks), got {len(channels)}: {channels}")
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise UserError(f"NFM: passes must be a positive int, got {passes!r}")
        _check_options(layout=layout, read_at=read_at)
        self.passes, self.num_blocks, self.channels = passes, len(blocks), channels
        self.layout, self.share_blocks, self.read_at = layout, share_blocks, read_at
        self.blocks = nn.ModuleList(blocks)
        self.pass_blocks = nn.ModuleList() if share_blocks else nn.ModuleList(
            copy.deepcopy(self.blocks) for _ in range(passes - 1))
        options = dict(k=k, d_k=d_k, d_v=d_v, num_heads=num_heads, ffn_hidden=ffn_hidden, norm=norm, activation=activation,
                       rescale=rescale, score_scale=score_scale, topk_softmax=topk_softmax,
                       reader_output=reader_output, output_bias=output_bias)
        self.readers = self._build_readers(layer_factory, options)
        self.records: list[NFMRecord] = []
        self.pass_outputs: list[Tensor] = []
        self.register_load_state_dict_pre_hook(_fill_pass_copies)

    def _build_readers(self, layer_factory: LayerFactory | None, options: dict) -> nn.ModuleList:
        """Module ``(p, i)`` for every pass and block: what it reads and writes follows ``read_at``."""
        make = layer_factory or (lambda p, i, cq, co, **o: NFMLayer(cq, co, **o))
        n, last, c = self.num_blocks, self.passes - 1, self.channels
        readers = nn.ModuleList()
        for p in range(self.passes):
            for i in range(n):
                if self.read_at == "before":
                    first = (p, i) == (0, 0)                     # reads only the null slot: only writes
                    flags = dict(reads=not first, writes=(p, i) != (last, n - 1), residual=not first)
                    readers.append(make(p, i, c[i], c[i + 1], **flags, **options))
                else:                                    # the query is the block's own output h^(i)
                    flags = dict(reads=p == last, writes=True, residual=p == last)
                    readers.append(make(p, i, c[i + 1], c[i + 1], **flags, **options))
                wanted = {"residual": flags["residual"], "topk_softmax": options["topk_softmax"],
                          "reader_output": options["reader_output"]}
                got = {name: getattr(readers[-1], name, None) for name in wanted}
                if got != wanted:
                    raise UserError(f"NFM: layer_factory built a module {(p, i)} with {got}, expected {wanted}: "
                                    f"it does not support these options")
        return readers

    def sources_of(self, pass_index: int, layer_index: int) -> list[tuple[int, int]]:
        """``(pass, layer)`` of the memory entries that module ``(pass_index, layer_index)`` reads, in
        memory order: all earlier passes, then this pass's earlier blocks (``read_at="after_last_pass"``:
        this pass's blocks up to ``layer_index``, its own output included)."""
        own = layer_index + (self.read_at == "after_last_pass")
        return [(p, j) for p in range(pass_index) for j in range(self.num_blocks)] + \
            [(pass_index, j) for j in range(own)]

    @property
    def gammas(self) -> list[nn.Parameter]:
        """Every read's gate ``γ`` (Alg. 1; 0 at initialisation), in reader order; a module that only
        writes (the first of the first pass, the earlier passes of ``read_at="after_last_pass"``) has none."""
        return [r.gamma for r in self.readers if r.gamma is not None]

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
        tokens, n = self.layout == "tokens", self.num_blocks
        h0 = self._state(x, 0, tokens)
        memory: list[MemoryEntry] = []                            # (K̂, V̂) of every state written so far
        cache: dict = {}                                          # this forward's gathered sources (nfm_read.aligned)
        self.records, self.pass_outputs = [], []
        after = self.read_at == "after_last_pass"
        for p in range(self.passes):
            h = h0
            for i in range(n):
                module = self.readers[p * n + i]
                if not after:                                     # Alg. 1: read before the block
                    h = self._read(module, p, i, h, memory, record, cache)
                out = run_block(self.grad_checkpointing, self.block(p, i), h.transpose(1, 2) if tokens else h)
                h = self._state(out, i + 1, tokens)
                if after or (p, i) != (self.passes - 1, n - 1):
                    memory.append(module.write(h))
                if after and p == self.passes - 1:                # the authors' code: read after the block
                    h = self._read(module, p, i, h, memory, record, cache)
            if record:
                self.pass_outputs.append(h.transpose(1, 2) if tokens else h)
        return h.transpose(1, 2) if tokens else h

    def _read(self, module: NFMLayer, p: int, i: int, h: Tensor, memory: list[MemoryEntry],
              record: bool, cache: dict) -> Tensor:
        if not module.residual:           # the first module of the first pass: the null slot alone, A = 0
            read = (h.new_zeros(h.shape[0], 0), h.new_ones(h.shape[0])) if record else None
        else:
            h, read = module.read(h, memory, record=record, cache=cache)
        if record:
            self.records.append(NFMRecord(p, i, self.sources_of(p, i), *read))
        return h

    def _state(self, h: Tensor, index: int, tokens: bool) -> Tensor:
        """A state as channels-first ``[B, C, *S]``, its channel count checked against ``channels``."""
        what = "the input x" if index == 0 else f"block {index - 1}'s output"
        layout = "[B, N, C]" if tokens else "[B, C, *spatial]"
        if not isinstance(h, Tensor) or h.dim() < 2 or (tokens and h.dim() != 3):
            shape = list(h.shape) if isinstance(h, Tensor) else type(h).__name__
            raise UserError(f"NFM: expected {what} as a tensor {layout}, got {shape}")
        if h.shape[0] == 0:
            raise UserError(f"NFM: expected {what} as a non-empty batch {layout} (B >= 1), got {list(h.shape)}")
        c = h.shape[2] if tokens else h.shape[1]
        if c != self.channels[index]:
            raise UserError(f"NFM: expected {what} to have {self.channels[index]} channels (channels[{index}]), "
                            f"got {c} (shape {list(h.shape)})")
        return h.transpose(1, 2) if tokens else h


def _fill_pass_copies(module: NFM, state_dict: dict[str, Tensor], prefix: str, *args) -> None:
    """A load-state-dict pre-hook: a base network's weights (``blocks.<i>.…`` with no
    ``pass_blocks.<p>.…`` entries) load into every pass, so an NFM built on a pretrained base with
    ``γ = 0`` computes the base network (module docstring, "Passes"). Entries already present
    (an NFM checkpoint) are left alone; the copies are clones (no weights tied across passes)."""
    if module.share_blocks:
        return
    head = prefix + "blocks."
    for key in [k for k in state_dict if k.startswith(head)]:
        for p in range(module.passes - 1):
            copy_key = f"{prefix}pass_blocks.{p}.{key[len(head):]}"
            if copy_key not in state_dict:
                state_dict[copy_key] = state_dict[key].clone()
