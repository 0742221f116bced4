"""How an NFM reader computes its read (:meth:`modwire.nn.nfm.NFMLayer.read`): the read order of
positions, the alignment of each source with the query, and the per-position contractions. The
mechanism itself (NFM §3.2: attention over layers at each position, §3.2.2's rescaling) is stated
in :mod:`modwire.nn.nfm` and tested against the literal re-statement (``tests/reference/nfm.py``);
this module only chooses an order of the positions in which that mechanism is cheap.

**Layout.** Per-head tensors are kept as ``[B, H, d, N]``: heads, channels, then the ``N`` positions
innermost, so that every product and reduction of a read runs along long contiguous rows of positions
(a few channels or heads innermost would leave the CPU's vector loops short; the projections read the
channels-first states ``[B, C, *S]`` as they are).

**Read order.** A read between unequal grids puts the positions in a fixed order of each grid: every spatial size is
``s = o · 2^e`` (``o`` odd), its coordinate written in the digits ``(o, 2, …, 2)`` (coarsest first);
the read order puts the finest binary digits of all dims first (the finest level of each dim, dims
in order, then the next level, …) and the odd parts last, row-major. Halving a grid in every dim
drops its finest level, so a grid ``2^k`` times finer in every dim is, in read order,
``[2^(k·D) window offsets | the coarser grid's positions in its own read order]``. Hence, with no
copy:

* a source ``2^k`` times **coarser** in every dim: the query viewed ``[B, H, d, U, S]`` meets the
  key ``[B, H, d, 1, S]`` (``U = P / S`` query cells per key, broadcast over that axis);
* a source ``2^k`` times **finer**: the key viewed ``[B, H, d, R, P]`` is its ``R`` SpaceToDepth keys
  per query position (window offsets in read order; NFM §3.2.2 sets no order, and none of the
  read's results depends on it); ``rescale="nearest"`` takes the window's first key (offset 0: the
  nearest-neighbour sample);
* an equal grid, a vector source (``S = 1``) and a vector query (``P = 1``) likewise.

Every product then runs over long contiguous rows, and the scores ``[B, H, 1 + n, P]`` keep the
keys on an outer axis (the softmax reduces over it, vectorised along positions). Positions enter and
leave the read order by a gather along the positions axis (``torch.gather``, :func:`take_positions`; under
``torch.compile`` a large one is one opaque operator and a small one a fused view of the digits,
:data:`OPAQUE_FROM`; each memory entry once per forward, when a read first needs it so; a read whose
sources all share the query's grid, as in a transformer, needs no order and takes none). Any other source
(a ratio that is not a power of 2, or not the same in every dim) is **gathered**: one
gather of positions builds its keys at the query's positions, ``[B, H, d, R, P]``, exactly as the
nearest resize and SpaceToDepth of §3.2.2 define them (the indices come from ``F.interpolate`` on
the coordinates, so they equal the literal rescaling's); a gathered ``K̂`` / ``V̂`` is kept for
the rest of the forward (a dict that :class:`~modwire.nn.nfm.NFM` creates per forward) so that
each source is gathered at most once per target grid.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["MemoryEntry", "read_order", "to_read_order", "from_read_order", "SourceRead", "source_read",
           "aligned", "source_scores", "add_source_values"]


class MemoryEntry(NamedTuple):
    """One state written to the memory: its ``K̂ [B, H, d_k, N]`` and ``V̂ [B, H, d_v, N]`` (positions in
    row-major order) and its ``grid`` (``()`` for a vector state)."""

    key: Tensor
    value: Tensor
    grid: tuple[int, ...]


def _odd_and_twos(size: int) -> tuple[int, int]:
    """``size = o · 2^e`` → ``(o, e)``."""
    e = (size & -size).bit_length() - 1
    return size >> e, e


def _order(grid: Sequence[int]) -> tuple[list[int], list[int]]:
    """The digit shape of ``grid`` (each dim ``(o, 2, …, 2)``) and the permutation of those axes that
    gives the read order (module docstring)."""
    shape, blocks = [], []
    for s in grid:
        o, e = _odd_and_twos(int(s))
        blocks.append((len(shape), e))
        shape += [o] + [2] * e
    order = [start + e - m + 1 for m in range(1, max([e for _, e in blocks], default=0) + 1)
             for start, e in blocks if e >= m]
    return shape, order + [start for start, _ in blocks]


def read_order(grid: Sequence[int], device: torch.device, cache: dict | None = None) -> tuple[Tensor, Tensor] | None:
    """``(index, inverse)``: ``index [N]`` the row-major position at each place of the read order of
    ``grid``, ``inverse`` the place of each row-major position; None where the read order is row-major
    (kept in ``cache`` under ``("order", grid)``)."""
    grid = tuple([int(s) for s in grid])
    shape, order = _order(grid)
    if order == sorted(order):
        return None
    if cache is not None and ("order", grid) in cache:
        return cache[("order", grid)]
    index = torch.arange(math.prod(grid), device=device).view(shape).permute(order).reshape(-1)
    inverse = torch.empty_like(index)
    inverse[index] = torch.arange(index.numel(), device=device)
    if cache is not None:
        cache[("order", grid)] = (index, inverse)
    return index, inverse


def _take(x: Tensor, index: Tensor) -> Tensor:
    """``x[..., index]`` for ``index [M]``: ``torch.gather`` along the positions axis (on CPU several times
    faster there than ``index_select``, which gathers an innermost axis element by element)."""
    return torch.gather(x, -1, index.expand(*x.shape[:-1], index.shape[0]))


class _Permute(torch.autograd.Function):
    """``x[..., index]`` for a permutation ``index`` of the positions: its gradient is the gather by the
    inverse permutation (a gather's own gradient would scatter-add into zeros)."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(inverse)
        return _take(x, index)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (inverse,) = ctx.saved_tensors
        return _take(grad, inverse), None, None


@torch.library.custom_op("modwire::take_positions", mutates_args=())
def _take_op(x: Tensor, index: Tensor, inverse: Tensor | None) -> Tensor:
    """:func:`take_positions` as one operator that ``torch.compile`` calls as it is (module docstring)."""
    return _take(x, index)


@_take_op.register_fake
def _(x: Tensor, index: Tensor, inverse: Tensor | None) -> Tensor:
    return x.new_empty(*x.shape[:-1], index.shape[0])


@torch.library.custom_op("modwire::put_positions", mutates_args=())
def _put_op(grad: Tensor, index: Tensor, size: int) -> Tensor:
    """The gradient of a gather of ``size`` positions by ``index``: ``grad`` added back at ``index``."""
    return grad.new_zeros(*grad.shape[:-1], size).scatter_add_(-1, index.expand(grad.shape), grad)


@_put_op.register_fake
def _(grad: Tensor, index: Tensor, size: int) -> Tensor:
    return grad.new_empty(*grad.shape[:-1], size)


def _take_op_context(ctx, inputs: tuple, output: Tensor) -> None:
    x, index, inverse = inputs
    ctx.save_for_backward(index, inverse)
    ctx.size = x.shape[-1]


def _take_op_grad(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
    index, inverse = ctx.saved_tensors
    if inverse is not None:                                    # a permutation: the gather by its inverse
        return _take_op(grad, inverse, index), None, None
    return _put_op(grad.contiguous(), index, ctx.size), None, None


_take_op.register_autograd(_take_op_grad, setup_context=_take_op_context)


#: Under ``torch.compile``, a gather or reordering of at least this many elements (in or out) is one opaque
#: operator, ``modwire::take_positions``, which inductor calls as it is; a smaller one is left to inductor,
#: which fuses it into the reductions that read it (a reordering as :func:`_digit_permute`). Measured on this
#: CPU: fused was faster on the NFM micro presets (operands of at most 2^16 elements), opaque at the full
#: sizes (operands up to 2^20 and more; ``benchmarks/results/nfm_compiled_cpu_8976363.md`` against
#: ``nfm_compiled_cpu_1ef07e5.md``, all fused); sizes in between were not measured.
OPAQUE_FROM = 2 ** 17


def take_positions(x: Tensor, index: Tensor, inverse: Tensor | None = None) -> Tensor:
    """``x[..., index]`` for ``index [M]``; ``inverse``: the inverse of ``index`` where it is a permutation
    (its gradient is then the gather by ``inverse``, else a scatter-add). Under ``torch.compile``, from
    :data:`OPAQUE_FROM` elements, the opaque operator ``modwire::take_positions``."""
    if torch.compiler.is_compiling() and max(x.numel(), x.numel() // x.shape[-1] * index.shape[0]) >= OPAQUE_FROM:
        return _take_op(x, index, inverse)
    return _take(x, index) if inverse is None else _Permute.apply(x, index, inverse)


def to_read_order(x: Tensor, grid: Sequence[int], cache: dict | None = None) -> Tensor:
    """``x [..., N]`` (the row-major positions of ``grid`` last) in read order."""
    return _reorder(x, grid, cache, inverse=False)


def from_read_order(x: Tensor, grid: Sequence[int], cache: dict | None = None) -> Tensor:
    """``x [..., N]`` (positions in read order last) → row-major."""
    return _reorder(x, grid, cache, inverse=True)


def _reorder(x: Tensor, grid: Sequence[int], cache: dict | None, inverse: bool) -> Tensor:
    if torch.compiler.is_compiling() and x.numel() < OPAQUE_FROM:
        return _digit_permute(x, grid, inverse)
    order = read_order(grid, x.device, cache)
    if order is None:
        return x
    return take_positions(x, order[1], order[0]) if inverse else take_positions(x, *order)


def _digit_permute(x: Tensor, grid: Sequence[int], inverse: bool) -> Tensor:
    """The read order as a view and one strided copy: the compiled form of a small reordering (inductor
    fuses it into the reads; :data:`OPAQUE_FROM`)."""
    shape, order = _order(tuple(int(s) for s in grid))
    if order == sorted(order):
        return x
    lead = list(x.shape[:-1])
    if not inverse:
        return x.reshape(*lead, *shape).permute(*range(len(lead)), *[len(lead) + o for o in order]).reshape(*lead, -1)
    back = sorted(range(len(order)), key=order.__getitem__)
    return x.reshape(*lead, *[shape[o] for o in order]).permute(*range(len(lead)), *[len(lead) + o for o in back]) \
        .reshape(*lead, -1)


class SourceRead(NamedTuple):
    """How one source meets the query (module docstring): ``u`` query positions per key (a coarser
    source, read as a view), ``r`` keys per query position, ``first`` (keep only the window's first
    key: ``rescale="nearest"``), ``gather`` (the keys are gathered: none of the views applies)."""

    u: int
    r: int
    first: bool
    gather: bool

    @property
    def keys(self) -> int:
        """Keys per query position (the scores' span of this source)."""
        return 1 if self.first else self.r


def _ratio(finer: Sequence[int], coarser: Sequence[int]) -> int | None:
    """``k`` if ``finer = coarser · 2^k`` in every dim (the same ``k ≥ 1``), else None."""
    ks = {f // c for f, c in zip(finer, coarser) if f % c == 0}
    if len(ks) != 1 or any([f % c for f, c in zip(finer, coarser)]):
        return None
    k = ks.pop()
    return k.bit_length() - 1 if k > 1 and k & (k - 1) == 0 else None


def source_read(src: tuple[int, ...], dst: tuple[int, ...], mode: str) -> SourceRead:
    """The read of a source of grid ``src`` at a query of grid ``dst`` (both with the same number of
    dims; a vector is a grid of ones) under ``rescale = mode``."""
    s, p = math.prod(src), math.prod(dst)
    if src == dst:
        return SourceRead(1, 1, False, False)
    if s == 1 or _ratio(dst, src) is not None:                   # coarser: one key under u query cells
        return SourceRead(p // s, 1, False, False)
    if p == 1 or _ratio(src, dst) is not None:                   # finer: a window of s / p keys
        return SourceRead(1, s // p, mode == "nearest", False)
    return SourceRead(1, _window(src, dst, mode), False, True)


def _window(src: tuple[int, ...], dst: tuple[int, ...], mode: str) -> int:
    """Keys per query position of a gathered source (NFM §3.2.2: ``⌈src / dst⌉`` per finer dim)."""
    if mode == "nearest":
        return 1
    return math.prod([max(1, math.ceil(s / t)) for s, t in zip(src, dst)])   # (a list: torch.compile)


def _nearest(src: int, dst: int, device: torch.device) -> Tensor:
    """The source coordinate of each of ``dst`` positions under ``F.interpolate(mode="nearest")``."""
    coords = torch.arange(src, dtype=torch.float64, device=device).view(1, 1, src)
    return F.interpolate(coords, size=dst, mode="nearest").view(dst).long()


def _gather_index(src: tuple[int, ...], dst: tuple[int, ...], mode: str, device: torch.device) -> Tensor:
    """``[R · P]`` read-order positions of the source giving key ``r`` of query position ``p`` (read
    order): per dim, a finer source is resized (nearest) to ``r · dst`` and read in windows of ``r``,
    a coarser one with an integer ratio is read at ``⌊p / u⌋``, any other is resized to the query's
    size (NFM §3.2.2; :func:`modwire.nn.nfm.rescale` states it literally)."""
    per_dim = []                                                   # [r_d, t_d] source coordinates
    for s, t in zip(src, dst):
        if mode == "space_to_depth" and s > t:
            r = math.ceil(s / t)
            per_dim.append(_nearest(s, t * r, device).view(t, r).T)
        elif s < t and t % s == 0:
            per_dim.append((torch.arange(t, device=device) // (t // s)).view(1, t))
        else:
            per_dim.append(_nearest(s, t, device).view(1, t))
    dims = len(src)
    flat = torch.zeros((), dtype=torch.long, device=device)
    for d, coord in enumerate(per_dim):                           # row-major source index [r_1, …, r_D, t_1, …, t_D]
        shape = [1] * (2 * dims)
        shape[d], shape[dims + d] = coord.shape
        flat = flat * src[d] + coord.view(shape)
    index = flat.reshape(-1, math.prod(dst))                       # [R, P (row-major)]
    order = read_order(src, device)
    if order is not None:                                          # row-major source position → read order
        index = order[1][index]
    return to_read_order(index, dst).reshape(-1)                   # [R, P (read order)]


def aligned(x: Tensor, grid: tuple[int, ...], dst: tuple[int, ...], how: SourceRead, mode: str,
            cache: dict | None = None, name: object = None) -> Tensor:
    """``x [B, H, c, N]`` (read order, on ``grid``) as the operand of the read at ``dst``: ``[B, H, c, R, P / U]``
    (``R`` keys per query position, or ``U`` query positions per key). A gathered operand is kept in
    ``cache`` under ``(name, dst, mode)`` when ``name`` is given (the memory's own ``K̂`` / ``V̂``)."""
    b, hd, c, n = x.shape
    if not how.gather:
        if how.u > 1:
            return x.unsqueeze(3)
        x = x.view(b, hd, c, how.r, n // how.r)
        return x[:, :, :, :1] if how.first else x
    if cache is not None and name is not None and (name, dst, mode) in cache:
        return cache[(name, dst, mode)]
    key = ("index", grid, dst, mode)
    index = cache.get(key) if cache is not None else None
    if index is None:
        index = _gather_index(grid, dst, mode, x.device)
        if cache is not None:
            cache[key] = index
    out = take_positions(x, index).view(b, hd, c, how.r, -1)
    if cache is not None and name is not None:
        cache[(name, dst, mode)] = out
    return out


def source_scores(q: Tensor, key: Tensor, how: SourceRead) -> Tensor:
    """``q [B, H or 1, c, P]`` (read order) and one source's aligned ``key [B, H, c, R, P / U]`` →
    ``q·k`` ``[B, H, R, P]`` (summed over the channels, an outer axis)."""
    b, hq, c, p = q.shape
    prod = q.view(b, hq, c, how.u, p // how.u) * key               # [B, H, c, U or R, P / U]
    return prod.sum(2).reshape(b, key.shape[1], how.keys, p)


def add_source_values(a: Tensor | None, w: Tensor, value: Tensor, how: SourceRead) -> Tensor:
    """``a [B, H, c, P]`` (None: zero) plus ``Σ_r w v`` of one source: its weights ``w [B, H, R, P]``
    and aligned ``value [B, H, c, R, P / U]``."""
    b, hd, r, p = w.shape
    if r > 1:
        part = (w.unsqueeze(2) * value).sum(3)
        return part if a is None else a + part
    wv = w.view(b, hd, 1, how.u, p // how.u)
    if a is None:
        return (wv * value).reshape(b, hd, -1, p)
    return torch.addcmul(a.view(b, hd, -1, how.u, p // how.u), wv, value).view(b, hd, -1, p)
