"""The NFM reader's read order (modwire.nn.nfm_read): the order is a permutation and its inverse;
in it, a grid 2^k times finer in every dim is [window offsets | the coarser grid in its own read
order] (the property every view of the reader rests on); which sources are views and which are
gathered; and readers on 1-D, 3-D and anisotropic memories against the literal reference."""
import math

import pytest
import torch

from modwire.nn.nfm import NFMLayer
import modwire.nn.nfm_read as nfm_read
from modwire.nn.nfm_read import _digit_permute, from_read_order, read_order, source_read, take_positions, to_read_order
from tests.reference.nfm import reader_literal

GRIDS = [(12,), (40,), (32, 16), (75, 75), (38, 38), (4, 8, 2), (1, 1), (6, 6)]


@pytest.mark.parametrize("grid", GRIDS)
def test_the_read_order_is_a_permutation_and_from_read_order_inverts_it(grid):
    n = math.prod(grid)
    x = torch.randn(2, 3, n, requires_grad=True)                  # positions last (the reader's layout)
    y = to_read_order(x, grid)
    order = read_order(grid, x.device)
    if order is None:                              # odd sizes (or ones): the read order is row-major
        assert all(s % 2 or s == 1 for s in grid) or grid == (1, 1)
        assert y is x
        return
    index, inverse = order
    assert sorted(index.tolist()) == list(range(n))
    assert torch.equal(index[inverse], torch.arange(n))
    torch.testing.assert_close(from_read_order(y, grid), x, rtol=0, atol=0)
    g = torch.randn_like(y)
    (grad,) = torch.autograd.grad(y, x, g)         # the inverse gather, equal to index_select's own gradient
    torch.testing.assert_close(grad, torch.zeros_like(x).index_add_(-1, index, g), rtol=0, atol=0)


@pytest.mark.parametrize("grid", GRIDS)
def test_the_compiled_form_of_a_small_read_order_is_the_same_permutation(grid):
    """Under ``torch.compile`` a small reordering is a view and a strided copy (``_digit_permute``), not a gather."""
    x = torch.randn(2, 3, math.prod(grid))
    torch.testing.assert_close(_digit_permute(x, grid, inverse=False), to_read_order(x, grid), rtol=0, atol=0)
    y = to_read_order(x, grid)
    torch.testing.assert_close(_digit_permute(y, grid, inverse=True), x, rtol=0, atol=0)


@pytest.mark.parametrize("grid", [(6, 8), (12,)])
@pytest.mark.parametrize("opaque", [True, False])
def test_compiled_reads_equal_eager_and_large_ones_are_one_opaque_operator(grid, opaque, monkeypatch):
    """Under ``torch.compile`` (fullgraph), from ``OPAQUE_FROM`` elements (lowered here to 1), the read order and a
    gather are the operator ``modwire::take_positions`` in the graph; below it (raised here) none is. Values and
    gradients (the inverse gather of a permutation, the scatter-add of a gather that repeats positions) equal
    eager's either way."""
    monkeypatch.setattr(nfm_read, "OPAQUE_FROM", 1 if opaque else 2 ** 40)
    repeat = torch.tensor([0, 0, 3, 1, 3, 2])                      # a gather: positions repeated and left out
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x):
        y = to_read_order(x, grid)
        return (y * y.detach().sin()).sum() + take_positions(from_read_order(y, grid), repeat).square().sum()

    x = torch.randn(2, 3, math.prod(grid), dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad(f(x), x)
    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True, backend=backend)(x)
    (got,) = torch.autograd.grad(out, x)
    torch.testing.assert_close(out, f(x), rtol=0, atol=0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    calls = [n for gm in graphs for n in gm.graph.nodes if n.op == "call_function" and "take_positions" in str(n.target)]
    assert len(calls) == (3 if opaque else 0)


def _coords(grid):
    """Row-major coordinates of every position of ``grid``, ``[N, D]``."""
    return torch.cartesian_prod(*[torch.arange(s) for s in grid]).reshape(-1, len(grid))


@pytest.mark.parametrize("fine, coarse", [((32, 32), (8, 8)), ((24, 12), (6, 3)), ((40,), (10,)), ((80,), (5,)),
                                          ((8, 8, 4), (4, 4, 2)), ((38, 38), (19, 19)), ((10, 10), (5, 5))])
def test_a_finer_grid_in_read_order_is_window_offsets_then_the_coarser_grid(fine, coarse):
    """Place ``u · S + j`` of the finer grid's read order (``U = P / S`` offsets, ``S`` coarse
    positions) lies in the cell of the coarser grid's position at place ``j``: one key under ``U``
    query cells (a coarser source) and ``R`` keys of one window per query cell (a finer one)."""
    ratio = fine[0] // coarse[0]
    fine_at = _coords(fine)[to_read_order(torch.arange(math.prod(fine)).view(1, -1), fine)[0]]
    coarse_at = _coords(coarse)[to_read_order(torch.arange(math.prod(coarse)).view(1, -1), coarse)[0]]
    s = math.prod(coarse)
    parents = (fine_at // ratio).view(-1, s, len(fine))            # [U, S, D]
    assert torch.equal(parents, coarse_at.expand_as(parents))
    offsets = (fine_at % ratio).view(-1, s, len(fine))
    assert len({tuple(o.tolist()) for o in offsets[:, 0]}) == math.prod(fine) // s   # every offset once per cell


def test_which_sources_are_views_and_which_are_gathered():
    s2d = "space_to_depth"
    assert source_read((6, 6), (6, 6), s2d) == (1, 1, False, False)               # equal
    assert source_read((3, 3), (12, 12), s2d) == (16, 1, False, False)            # coarser by 4: a view
    assert source_read((24, 24), (6, 6), s2d) == (1, 16, False, False)            # finer by 4: a 4×4 window
    assert source_read((24, 24), (6, 6), "nearest") == (1, 16, True, False)       # its first key
    assert source_read((1, 1), (5, 7), s2d) == (35, 1, False, False)              # a vector source
    assert source_read((5, 7), (1, 1), s2d) == (1, 35, False, False)              # a vector query
    assert source_read((4, 4), (12, 12), s2d).gather                              # coarser by 3: gathered
    assert source_read((6, 3), (12, 12), s2d).gather                              # by 2 and by 4: gathered
    assert source_read((9, 9), (6, 6), s2d) == (1, 4, False, True)                # ⌈9/6⌉² = 4 keys, gathered
    assert source_read((9, 9), (6, 6), "nearest") == (1, 1, False, True)
    assert source_read((38, 38), (10, 10), s2d) == (1, 16, False, True)           # 38 → 40, windows of 4×4


def _case(grids, query, kw, channels=4):
    g = torch.Generator().manual_seed(0)
    sources = [torch.randn(2, 3, *s, generator=g, dtype=torch.float64) for s in grids]
    torch.manual_seed(1)
    ws = [NFMLayer(1, 3, reads=False, d_k=4, d_v=3, num_heads=2).double() for _ in sources]
    reader = NFMLayer(channels, channels, d_k=4, d_v=3, num_heads=2, **{"k": 3, **kw}).double()
    reader.gamma.data.fill_(0.8)
    h = torch.randn(2, channels, *query, generator=g, dtype=torch.float64, requires_grad=True)
    return sources, ws, reader, h


@pytest.mark.parametrize("grids, query", [([(16,), (4,), (8,), (12,), (2,)], (8,)),                  # 1-D
                                          ([(4, 4, 2), (2, 2, 1), (8, 8, 4), (3, 3, 3)], (4, 4, 2)),  # 3-D
                                          ([(8, 4), (4, 8), (2, 2), (16, 8)], (4, 4))])             # anisotropic
@pytest.mark.parametrize("kw", [{}, {"rescale": "nearest"}, {"topk_softmax": "subtract", "k": 2}])
@pytest.mark.parametrize("channels", [4, 9])
def test_readers_on_1d_3d_and_anisotropic_memories_equal_the_literal_reader(grids, query, kw, channels):
    """``channels`` 4: the query state (4 < heads·d_k = 8 channels) is put in read order before its
    projection, and ``W_o1 A`` (4 < heads·d_v = 6) leaves it; 9: ``Q̂`` and ``A`` themselves are reordered."""
    sources, ws, reader, h = _case(grids, query, kw, channels)
    srcs = [s.clone().requires_grad_(True) for s in sources]
    out, _ = reader.read(h, [w.write(s) for w, s in zip(ws, srcs)], cache={})
    h2 = h.detach().clone().requires_grad_(True)
    srcs2 = [s.clone().requires_grad_(True) for s in sources]
    ref = reader_literal(reader, h2, srcs2, ws)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, [h, *srcs], g)
    want = torch.autograd.grad(ref, [h2, *srcs2], g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
