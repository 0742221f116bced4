"""The NFM reader's factored forms for few query channels (modwire.nn.nfm, module docstring, "Few
query channels"): scores ``[h, 1]·[W_qᵀk̂, b_q·k̂]`` and values mapped through ``W_o1`` per head on the
source grids, against the literal reference (tests/reference/nfm.py), train and eval, with gradients
for every parameter; the records equal the default path's; and which form each reader takes."""
import pytest
import torch
from torch import nn

import modwire
from modwire.nn.nfm import NFM, NFMLayer
from modwire.nn.nfm_read import source_read
from tests.nn.test_nfm_reader_plans import _eval_literal, mixed_sources, writers
from tests.reference.nfm import nfm_literal, reader_literal

DEFAULT = NFMLayer._factored


def _reader(c_q: int, **kw) -> NFMLayer:
    torch.manual_seed(2)
    reader = NFMLayer(c_q, 5, **{"k": 4, "d_k": 8, "d_v": 6, "num_heads": 2, **kw}).double()
    with torch.no_grad():
        reader.gamma.fill_(0.7)
        reader.query.bias.uniform_(-1, 1)            # b_q·k̂ matters
        if reader.w_o1.bias is not None:               # none before a BatchNorm (norm="batch")
            reader.w_o1.bias.uniform_(-1, 1)
        if isinstance(reader.norm, nn.Identity):
            return reader
        reader.norm.weight.uniform_(0.5, 1.5)
        reader.norm.bias.uniform_(-0.5, 0.5)
        reader.norm.running_mean.uniform_(-0.2, 0.2)
    return reader


def _run(reader, h, sources, ws, train):
    reader.train(train)
    h1 = h.clone().requires_grad_(True)
    srcs = [s.clone().requires_grad_(True) for s in sources]
    memory = [w.write(s) for w, s in zip(ws, srcs)]
    out, read = reader.read(h1, memory, record=True, cache={})
    g = torch.Generator().manual_seed(5)
    gout = torch.randn(out.shape, generator=g, dtype=out.dtype)
    params = [p for m in [reader, *ws] for p in m.parameters()]
    grads = torch.autograd.grad(out, [h1, *srcs, *params], gout, allow_unused=True)
    return out, read, [torch.zeros_like(x) if a is None else a for a, x in zip(grads, [h1, *srcs, *params])], gout


# forced forms on the mixed plans (every plan kind, a vector source; query channels 3 < d_k = 8, hidden 3 < d_v = 6)
@pytest.mark.parametrize("forms", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("kw", [{}, {"topk_softmax": "subtract"}, {"rescale": "nearest"}, {"k": 20},
                                {"score_scale": "sqrt_d_k", "k": 1}, {"norm": "none", "activation": "gelu"}])
@pytest.mark.parametrize("train", [True, False])
def test_factored_forms_equal_the_literal_reader_with_gradients_and_the_default_records(forms, kw, train, monkeypatch):
    sources = mixed_sources()
    ws = writers(sources, 2, 8, 6)
    reader = _reader(3, **kw)
    h = torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(NFMLayer, "_factored", lambda self, *a: forms)
    out, read, grads, gout = _run(reader, h, sources, ws, train)
    monkeypatch.setattr(NFMLayer, "_factored", lambda self, *a: (False, False))
    out0, read0, grads0, _ = _run(reader, h, sources, ws, train)
    # the literal reader (GELU, no BN: it applies ReLU; compare with the default path there)
    if kw.get("activation") != "gelu":
        h2 = h.clone().requires_grad_(True)
        srcs2 = [s.clone().requires_grad_(True) for s in sources]
        ref = reader_literal(reader, h2, srcs2, ws) if train else _eval_literal(reader, h2, srcs2, ws)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
        params = [p for m in [reader, *ws] for p in m.parameters()]
        want = torch.autograd.grad(ref, [h2, *srcs2, *params], gout, allow_unused=True)
        for a, b, x in zip(grads, want, [h2, *srcs2, *params]):
            torch.testing.assert_close(a, torch.zeros_like(x) if b is None else b, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(out, out0, rtol=1e-10, atol=1e-12)
    for a, b in zip(grads, grads0):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    for a, b in zip(read, read0):                      # mass per source, null: the same record
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    names = {n for n, p in reader.named_parameters()}
    assert names >= {"query.weight", "query.bias", "w_o1.weight"}
    assert ("w_o1.bias" in names) == isinstance(reader.norm, nn.Identity)    # none before a BatchNorm
    named = dict(zip([n for n, _ in reader.named_parameters()], grads[1 + len(sources):]))
    if forms[0] and kw.get("k") != 1:                 # top-1: the weights do not depend on the scores
        assert named["query.weight"].abs().sum() > 0 and named["query.bias"].abs().sum() > 0
    if forms[1]:
        assert named["w_o1.weight"].abs().sum() > 0


def test_a_vector_query_in_the_factored_forms():
    """A vector query ``[B, C]`` (a grid of ones) reading grids and a vector, both forms forced."""
    sources = mixed_sources()
    ws = writers(sources, 2, 8, 6)
    reader = _reader(3)
    h = torch.randn(2, 3, dtype=torch.float64)
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(NFMLayer, "_factored", lambda self, *a: (True, True))
        out, read, grads, gout = _run(reader, h, sources, ws, True)
    finally:
        mp.undo()
    h2 = h.clone().requires_grad_(True)
    srcs2 = [s.clone().requires_grad_(True) for s in sources]
    ref = reader_literal(reader, h2, srcs2, ws)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    want = torch.autograd.grad(ref, [h2, *srcs2], gout)
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_the_form_is_chosen_by_the_shapes():
    """Few query channels at a large query grid reading coarser sources: both factored forms; as many
    query channels as d_k (and hidden = d_v): the default path; a subclass that replaces the query's
    projection or the output: its hooks are used (no factored form)."""
    def forms(layer, c_q, dst, srcs):
        plans = [source_read(s, dst, layer.rescale) for s in srcs]
        return layer._factored(c_q, dst[0] * dst[1], srcs, plans)
    soc = [(38, 38), (19, 19), (10, 10), (5, 5)]                   # Sort-of-CLEVR: the 75×75 input reads pass 1
    assert forms(NFMLayer(3, 24), 3, (75, 75), soc) == (True, True)
    assert forms(NFMLayer(24, 24), 24, (38, 38), soc) == (False, False)
    assert forms(NFMLayer(16, 16), 16, (32, 32), [(32, 32), (16, 16), (8, 8), (4, 4)]) == (False, False)
    assert forms(NFMLayer(3, 24, ffn_hidden=64), 3, (75, 75), soc) == (True, False)     # hidden ≥ d_v
    assert forms(NFMLayer(24, 24, ffn_hidden=2), 24, (38, 38), soc) == (False, True)
    assert forms(NFMLayer(3, 24, reader_output="conv3x3"), 3, (75, 75), soc) == (True, False)

    class Hooked(NFMLayer):
        def project_query(self, h):
            return 2 * super().project_query(h)

        def output(self, a, h):
            return super().output(a, h)
    assert forms(Hooked(3, 24), 3, (75, 75), soc) == (False, False)


def small_query_blocks():
    """A 3-channel 12×12 input → 6×6 → 3×3 → 2×2: the reader before the first block of pass 2 has
    3 query channels at 12×12 (factored forms), the others the default path."""
    return [nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.Tanh()), nn.Sequential(nn.Conv2d(8, 8, 3, 2, 1), nn.Tanh()),
            nn.Sequential(nn.Conv2d(8, 8, 3, 2, 1), nn.Tanh())]


@pytest.mark.parametrize("kw", [{}, {"read_at": "after_last_pass", "reader_output": "conv3x3"},
                                {"topk_softmax": "subtract", "k": 2}])
def test_a_network_with_a_few_channel_input_equals_the_literal_algorithm(kw):
    torch.manual_seed(0)
    m = NFM(small_query_blocks(), channels=[3, 8, 8, 8], k=kw.pop("k", 3), d_k=8, d_v=8, num_heads=2, **kw).double()
    for r in m.readers:
        if r.gamma is not None:
            r.gamma.data.fill_(0.5)
    first = m.readers[m.num_blocks]            # pass 2, block 0: its query is the input x
    if m.read_at == "before":
        plans = [source_read(s, (12, 12), "space_to_depth") for s in [(6, 6), (3, 3), (2, 2)]]
        assert first._factored(3, 144, [(6, 6), (3, 3), (2, 2)], plans) == (True, True)
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    out = m(x, record=True)
    torch.testing.assert_close(out, nfm_literal(m, x.clone()), rtol=1e-9, atol=1e-10)
    params = [p for p in m.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.square().sum(), params, allow_unused=True)
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(NFMLayer, "_factored", lambda self, *a: (False, False))
        records = [(r.mass, r.null) for r in m.records]
        out0 = m(x, record=True)
        grads0 = torch.autograd.grad(out0.square().sum(), params, allow_unused=True)
    finally:
        mp.undo()
    torch.testing.assert_close(out, out0, rtol=1e-10, atol=1e-12)
    for a, b in zip(grads, grads0):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    for (a, b), r in zip(records, m.records):
        torch.testing.assert_close(a, r.mass, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(b, r.null, rtol=1e-10, atol=1e-12)


def test_sort_of_clevr_first_reader_of_pass_two_takes_the_factored_forms():
    m = modwire.create_model("nfm_cnn_mlp_sort_of_clevr")
    body = [mod for mod in m.modules() if isinstance(mod, NFM)][0]
    reader = body.readers[body.num_blocks]
    assert reader.query.in_features == 3
    calls = []
    real = NFMLayer._factored

    def spy(self, *a):
        calls.append((self is reader, real(self, *a)))
        return calls[-1][1]
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(NFMLayer, "_factored", spy)
        with torch.no_grad():
            args, kwargs = m.example_inputs(2)
            m.eval()(*args, **kwargs)
    finally:
        mp.undo()
    assert (True, (True, True)) in calls
    assert all(forms == (False, False) for mine, forms in calls if not mine)

