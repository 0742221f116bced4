"""The NFM reader (modwire.nn.nfm.NFMLayer.read: each source read as a view or gathered,
modwire.nn.nfm_read) against the literal reference (tests/reference/nfm.py) on a memory mixing every
kind of source, and the once-per-forward gathering."""
import pytest
import torch
from torch import nn

import modwire.nn.nfm_read as nfm_read
from modwire.nn.nfm import NFM, NFMLayer
from modwire.nn.nfm_read import source_read
from tests.reference.nfm import nfm_literal, reader_literal


def mixed_sources(b: int = 2) -> list[torch.Tensor]:
    """Sources read at a 6×6 query: finer with an integer ratio (12×12: 2×2 windows), finer with a
    ratio that is not an integer (9×9: resized to 12×12 first), equal (6×6), coarser with an integer
    ratio (3×3), coarser with a ratio that is not an integer (4×4: resized to 6×6), and a vector."""
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 12, 12), (3, 9, 9), (5, 6, 6), (2, 3, 3), (3, 4, 4), (4,)]
    return [torch.randn(b, *s, generator=g, dtype=torch.float64) for s in shapes]


def writers(sources: list[torch.Tensor], heads: int, d_k: int, d_v: int) -> list[NFMLayer]:
    torch.manual_seed(1)
    return [NFMLayer(1, s.shape[1], reads=False, k=3, d_k=d_k, d_v=d_v, num_heads=heads).double() for s in sources]


@pytest.mark.parametrize("kw", [{}, {"topk_softmax": "subtract"}, {"rescale": "nearest"}, {"k": 20},
                                {"score_scale": "sqrt_d_k", "k": 1}])
@pytest.mark.parametrize("train", [True, False])
def test_reader_on_mixed_plans_equals_the_literal_reader_with_gradients(kw, train):
    sources = mixed_sources()
    heads, d_k, d_v = 2, 4, 3
    ws = writers(sources, heads, d_k, d_v)
    torch.manual_seed(2)
    reader = NFMLayer(5, 5, k=kw.get("k", 4), d_k=d_k, d_v=d_v, num_heads=heads,
                      **{n: v for n, v in kw.items() if n != "k"}).double()
    with torch.no_grad():
        reader.gamma.fill_(0.7)
        reader.norm.weight.uniform_(0.5, 1.5)
        reader.norm.bias.uniform_(-0.5, 0.5)
        reader.norm.running_mean.uniform_(-0.2, 0.2)
    reader.train(train)
    h = torch.randn(2, 5, 6, 6, dtype=torch.float64, requires_grad=True)
    srcs = [s.clone().requires_grad_(True) for s in sources]
    memory = [w.write(s) for w, s in zip(ws, srcs)]
    out, read = reader.read(h, memory, record=True, cache={})
    h2 = h.detach().clone().requires_grad_(True)
    srcs2 = [s.detach().clone().requires_grad_(True) for s in sources]
    ref = reader_literal(reader, h2, srcs2, ws) if train else None
    if not train:   # the literal reader normalises with batch statistics: evaluation BN by hand instead
        ref = _eval_literal(reader, h2, srcs2, ws)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    g = torch.randn_like(out)
    params = [p for m in [reader, *ws] for p in m.parameters()]
    got = torch.autograd.grad(out, [h, *srcs, *params], g, allow_unused=True)
    want = torch.autograd.grad(ref, [h2, *srcs2, *params], g, allow_unused=True)
    for a, b, x in zip(got, want, [h, *srcs, *params]):
        a = torch.zeros_like(x) if a is None else a
        b = torch.zeros_like(x) if b is None else b
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    mass, null = read                                   # the record: weight per source and on the null slot
    assert mass.shape == (2, len(sources))
    torch.testing.assert_close(mass.sum(-1) + null, torch.ones(2, dtype=torch.float64), atol=1e-4, rtol=0)  # subtract: ε


def _eval_literal(reader, h, sources, ws):
    """reader_literal with BatchNorm in evaluation mode (running statistics): the affine map it then is,
    folded into ``W_o1``."""
    norm = reader.norm
    scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    shift = norm.bias - norm.running_mean * scale

    class Proxy:   # reader_literal applies _batch_norm only to an nn.BatchNorm1d: none here
        pass
    proxy = Proxy()
    for name in ("heads", "d_k", "d_v", "k", "rescale", "scale", "topk_softmax", "reader_output", "query", "gamma"):
        setattr(proxy, name, getattr(reader, name))
    proxy.norm = None
    b1 = 0.0 if reader.w_o1.bias is None else reader.w_o1.bias                # none before a BatchNorm
    proxy.w_o1 = _Lin(reader.w_o1.weight * scale[:, None], b1 * scale + shift)   # BN folded in
    proxy.w_o2 = reader.w_o2
    return reader_literal(proxy, h, sources, ws)


class _Lin:
    def __init__(self, weight, bias):
        self.weight, self.bias = weight, bias


def test_the_cache_is_what_the_reader_uses_and_only_for_gathered_sources():
    """A gathered source (a ratio that is not a power of 2 in every dim) comes from the forward's cache
    (a poisoned entry changes the output); a source read at its own grid, or as a window or broadcast
    with a power-of-2 ratio, or a vector, is a view (modwire.nn.nfm_read: never gathered)."""
    sources = mixed_sources()
    ws = writers(sources, 2, 4, 3)
    reader = NFMLayer(5, 5, k=4, d_k=4, d_v=3, num_heads=2).double().eval()
    reader.gamma.data.fill_(1.0)
    memory = [w.write(s) for w, s in zip(ws, sources)]
    h = torch.randn(2, 5, 6, 6, dtype=torch.float64)
    cache: dict = {}
    out = reader.read(h, memory, cache=cache)[0]
    grids = [(12, 12), (9, 9), (6, 6), (3, 3), (4, 4), (1, 1)]
    hows = [source_read(g, (6, 6), "space_to_depth") for g in grids]
    assert [how.gather for how in hows] == [False, True, False, False, True, False]
    assert reader._factored(5, 36, grids, hows) == (False, False)                  # the default path
    # the 9×9 and 4×4 sources only, K̂ (part 0) and V̂ (part 1) each; and their two gather indices
    mode = "space_to_depth"
    assert sorted(k for k in cache if not isinstance(k[0], str)) == [((1, 0), (6, 6), mode), ((1, 1), (6, 6), mode),
                                                           ((4, 0), (6, 6), mode), ((4, 1), (6, 6), mode)]
    assert sorted(k[1] for k in cache if k[0] == "index") == [(4, 4), (9, 9)]
    torch.testing.assert_close(reader.read(h, memory, cache=cache)[0], out)      # reused: the same result
    torch.testing.assert_close(reader.read(h, memory)[0], out)                   # no cache: the same result
    cache[((4, 0), (6, 6), mode)] = cache[((4, 0), (6, 6), mode)] + 1.0
    assert not torch.allclose(reader.read(h, memory, cache=cache)[0], out)


def conv_blocks():
    """9×9 → 5×5 → 5×5 → 3×3 → a vector: non-integer ratios in both directions."""
    return [nn.Sequential(nn.Conv2d(3, 4, 3, 2, 1), nn.Tanh()), nn.Sequential(nn.Conv2d(4, 6, 3, 1, 1), nn.Tanh()),
            nn.Sequential(nn.Conv2d(6, 6, 3, 2, 1), nn.Tanh()),
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5), nn.Tanh())]


@pytest.mark.parametrize("kw", [{"passes": 3}, {"passes": 2, "read_at": "after_last_pass"}, {"rescale": "nearest"}])
def test_each_source_is_gathered_at_most_once_per_forward_and_target_grid(kw, monkeypatch):
    """The default path (the factored one, for few query channels, gathers its reader's own mapped keys
    and values: tests/nn/test_nfm_factored.py)."""
    monkeypatch.setattr(NFMLayer, "_factored", lambda self, *a: (False, False))
    torch.manual_seed(0)
    m = NFM(conv_blocks(), channels=[3, 4, 6, 6, 5], k=3, d_k=4, d_v=3, num_heads=2, **kw).double()
    for r in m.readers:
        if r.gamma is not None:
            r.gamma.data.fill_(0.5)
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    want = nfm_literal(m, x.clone())
    calls = []
    real = nfm_read._take

    def spy(t, index):
        calls.append((t.data_ptr(), tuple(t.shape), index.numel()))
        return real(t, index)

    monkeypatch.setattr(nfm_read, "_take", spy)
    for _ in range(2):                                  # two forwards: nothing is kept from the first
        calls.clear()
        torch.testing.assert_close(m(x), want, rtol=1e-9, atol=1e-10)
        assert calls                                    # this network needs gathering (9 → 5 → 3: not powers of 2)
        assert len(calls) == len(set(calls))            # each (source tensor, target grid) at most once
        # and no more than one gather per memory entry and target grid, K̂ and V̂ each
        entries = m.passes * m.num_blocks
        assert len(calls) <= 2 * entries * len({c[2] for c in calls})
