"""NFM Algorithm 1 (modwire.nn.nfm) against the literal statement in tests/reference/nfm.py, and
its semantics: memory order, top-k with the null slot, rescaling, γ = 0 recovers the base network."""
import copy
import math

import pytest
import torch
from torch import nn

import modwire.nn.nfm as nfm_module
from modwire.models.nfm import BlockSequence, NFMConfig, build_body
from modwire.nn.nfm import NFM, NFMLayer, rescale
from tests.reference.nfm import nfm_literal, subtract_kth_literal, window_literal


def conv_blocks():
    """Mixed resolutions and channels: 9×9 → 5×5 (non-integer ratio) → 5×5 → 3×3 → a vector."""
    return [nn.Sequential(nn.Conv2d(3, 4, 3, 2, 1), nn.Tanh()), nn.Sequential(nn.Conv2d(4, 6, 3, 1, 1), nn.Tanh()),
            nn.Sequential(nn.Conv2d(6, 6, 3, 2, 1), nn.Tanh()),
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5), nn.Tanh())]


CHANNELS = [3, 4, 6, 6, 5]


def make_nfm(*, gamma: float | None = 0.6, seed: int = 0, **kw) -> NFM:
    torch.manual_seed(seed)
    m = NFM(conv_blocks(), channels=CHANNELS, **{"k": 3, "passes": 2, "d_k": 4, "d_v": 3, "num_heads": 2, **kw}).double()
    if gamma is not None:
        with torch.no_grad():
            for j, r in enumerate(m.readers):
                if r.gamma is None:                       # a module that only writes (read_at="after_last_pass")
                    continue
                r.gamma.fill_(gamma + 0.1 * j)
                if isinstance(r.norm, (nn.BatchNorm1d, nn.BatchNorm2d)):   # non-trivial affine BN parameters
                    r.norm.weight.uniform_(0.5, 1.5)
                    r.norm.bias.uniform_(-0.5, 0.5)
    return m


@pytest.mark.parametrize("kw", [{}, {"rescale": "nearest"}, {"score_scale": "sqrt_d_k"}, {"norm": "none", "k": 1},
                                {"share_blocks": True, "passes": 3, "k": 6}, {"topk_softmax": "subtract"},
                                {"topk_softmax": "subtract", "k": 1}, {"reader_output": "conv3x3"},
                                {"read_at": "after_last_pass"}, {"read_at": "after_last_pass", "passes": 3}])
def test_algorithm1_matches_literal_forward_and_gradients(kw):
    assert_matches_literal(make_nfm(**kw))


def assert_matches_literal(m: NFM) -> None:
    """``m``'s forward and gradients (input and every parameter) equal tests/reference/nfm.py's, float64."""
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64, requires_grad=True)
    out = m(x)
    x2 = x.detach().clone().requires_grad_(True)
    ref = nfm_literal(m, x2)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, *m.parameters()], g, allow_unused=True)
    grads_ref = torch.autograd.grad(ref, [x2, *m.parameters()], g, allow_unused=True)
    for a, b, w in zip(grads, grads_ref, [x, *m.parameters()]):
        a = torch.zeros_like(w) if a is None else a        # unused in this draw (e.g. k = 1 kept only the null slot)
        b = torch.zeros_like(w) if b is None else b
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_one_dimensional_states_and_tokens_layout_match_literal():
    torch.manual_seed(1)
    blocks = [nn.Conv1d(2, 4, 3, 2, 1), nn.Conv1d(4, 4, 3, 1, 1), nn.Upsample(scale_factor=3)]
    m = NFM(blocks, channels=[2, 4, 4, 4], k=2, d_k=4, d_v=2, num_heads=2).double()
    for g in m.gammas:
        g.data.fill_(0.8)
    x = torch.randn(2, 2, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x), nfm_literal(m, x))
    # tokens [B, N, C]: the same network on transposed states
    lin = [nn.Linear(3, 5), nn.Linear(5, 3)]
    t = NFM(lin, channels=[3, 5, 3], layout="tokens", k=2, d_k=4, d_v=2, num_heads=2, norm="none").double()
    for g in t.gammas:
        g.data.fill_(0.5)
    tok = torch.randn(2, 6, 3, dtype=torch.float64)

    class T(nn.Module):   # the literal runs channels-first: transpose around each linear block
        def __init__(self, f):
            super().__init__()
            self.f = f

        def forward(self, h):
            return self.f(h.transpose(1, 2)).transpose(1, 2)

    cf = copy.deepcopy(t)
    cf.blocks = nn.ModuleList(T(b) for b in t.blocks)
    cf.pass_blocks = nn.ModuleList(nn.ModuleList(T(b) for b in pb) for pb in t.pass_blocks)
    torch.testing.assert_close(t(tok), nfm_literal(cf, tok.transpose(1, 2)).transpose(1, 2))


def test_memory_order_across_passes():
    m = make_nfm(passes=2)
    m(torch.randn(2, 3, 9, 9, dtype=torch.float64), record=True)
    got = [(r.pass_index, r.layer_index, r.sources) for r in m.records]
    n = 4
    want = [(p, i, [(q, j) for q in range(p) for j in range(n)] + [(p, j) for j in range(i)])
            for p in range(2) for i in range(n)]
    assert got == want
    assert got[4][2] == [(0, 0), (0, 1), (0, 2), (0, 3)]       # pass 2's first reader: all of pass 1 (top-down)
    for r in m.records:   # mass on the sources plus the null slot is one per sample
        torch.testing.assert_close(r.mass.sum(-1) + r.null, torch.ones(2, dtype=torch.float64))
    assert m.records[0].mass.shape == (2, 0) and torch.all(m.records[0].null == 1)   # empty memory: null only


@pytest.mark.parametrize("k", [1, 2, 5])
def test_topk_keeps_exactly_k_keys_null_slot_included(k, monkeypatch):
    seen = []
    real = nfm_module.sparse_softmax

    def spy(scores, **kw):
        w = real(scores, **kw)
        d = kw.get("dim", -1)                                          # the keys axis, moved last here
        seen.append((scores.movedim(d, -1), w.movedim(d, -1), kw["topk"]))
        return w

    monkeypatch.setattr(nfm_module, "sparse_softmax", spy)
    m = make_nfm(k=k, passes=2)
    m(torch.randn(2, 3, 9, 9, dtype=torch.float64))
    checked = 0
    assert len(seen) == 7 and {t for _, _, t in seen} == {k}          # every reader with a memory uses the configured k
    for scores, w, _ in seen:
        n_keys = scores.shape[-1]                                     # null slot (column 0) + the sources' keys
        assert torch.all(scores[..., 0] == 0)                         # "Default Computation": a zero key scores 0
        assert torch.all((w > 0).sum(-1) == min(k, n_keys)), (k, n_keys)   # the null slot competes like a key
        kept = w > 0                                                  # the kept keys are the k best scores (ties
        lowest_kept = scores.masked_fill(~kept, math.inf).amin(-1)    # at the boundary: either may be kept)
        assert torch.all(lowest_kept >= scores.masked_fill(kept, -math.inf).amax(-1))
        checked += n_keys > k
    assert checked > 0


def test_rescale_shapes_and_space_to_depth_content():
    x = torch.arange(2 * 3 * 4 * 6, dtype=torch.float64).reshape(2, 3, 4, 6)
    s2d = rescale(x, (2, 3))                                            # windows of 2×2
    assert s2d.shape == (2, 3, 4, 2, 3)
    for (ti, tj) in [(0, 0), (1, 2), (0, 1)]:                          # each window position is its own key
        want = torch.stack([x[:, :, 2 * ti + a, 2 * tj + b] for a in range(2) for b in range(2)], dim=2)
        torch.testing.assert_close(s2d[:, :, :, ti, tj], want)
    up = rescale(x, (8, 12))                                            # coarser source: nearest upsampling
    assert up.shape == (2, 3, 1, 8, 12) and torch.equal(up[:, :, 0, 5, 7], x[:, :, 2, 3])
    near = rescale(x, (2, 3), mode="nearest")                           # §4.7 ablation: one key per position
    assert near.shape == (2, 3, 1, 2, 3) and torch.equal(near[:, :, 0], x[:, :, ::2, ::2])
    vec = rescale(x, ())                                                 # a vector query reads every position
    assert vec.shape == (2, 3, 24) and torch.equal(vec, x.reshape(2, 3, 24))
    bcast = rescale(x[:, :, 0, 0], (4, 6))                               # a vector source at every position
    assert torch.equal(bcast[:, :, 0, 3, 5], x[:, :, 0, 0])
    odd = rescale(x[..., :5], (2, 2))                                    # 4×5 → 2×2: 5 → 6 (nearest), windows 2×3
    assert odd.shape == (2, 3, 6, 2, 2)
    for src, dst, mode in [((4, 6), (2, 3), "space_to_depth"), ((4, 5), (2, 2), "space_to_depth"),
                           ((3, 3), (7, 5), "space_to_depth"), ((4, 6), (3, 4), "nearest"), ((9,), (4,), "space_to_depth")]:
        t = torch.randn(1, 2, *src, dtype=torch.float64)
        got = rescale(t, dst, mode=mode).flatten(3)                     # [1, 2, R, P]
        for p, keys in enumerate(window_literal(src, dst, mode)):
            for r, s in enumerate(keys):
                assert torch.equal(got[0, :, r, p], t[(0, slice(None), *s)])
    with pytest.raises(ValueError, match=r"spatial shape \[4, 6\] cannot be read at spatial shape \[5\]"):
        rescale(x, (5,))


@pytest.mark.parametrize("share", [False, True])
def test_gamma_zero_recovers_the_base_network_exactly(share):
    torch.manual_seed(3)
    blocks = conv_blocks()
    base = nn.Sequential(*copy.deepcopy(blocks))
    m = NFM(blocks, channels=CHANNELS, share_blocks=share, k=5)
    x = torch.randn(4, 3, 9, 9)
    out = m(x, record=True)
    assert torch.equal(m.pass_outputs[0], base(x))                     # first pass: exactly the base network
    assert torch.equal(out, base(x))                                    # copies of the blocks: every pass
    with torch.no_grad():
        m.readers[1].gamma.fill_(0.3)                                   # pass 1, before block 1
    m(x, record=True)
    assert not torch.equal(m.pass_outputs[0], base(x))                  # the readers do enter once γ ≠ 0
    assert torch.equal(m.pass_outputs[1], base(x))                      # pass 2's readers (γ = 0) ignore pass 1


def test_blocksequence_and_build_body():
    torch.manual_seed(4)
    blocks = conv_blocks()
    plain = build_body(NFMConfig(enabled=False), copy.deepcopy(blocks), CHANNELS)
    assert isinstance(plain, BlockSequence) and plain.records == []
    x = torch.randn(2, 3, 9, 9)
    torch.testing.assert_close(plain(x), nn.Sequential(*blocks)(x), rtol=0, atol=0)
    body = build_body(NFMConfig(enabled=True, k=2, passes=3), blocks, CHANNELS)
    assert isinstance(body, NFM) and body.passes == 3 and body.readers[0].k == 2
    assert len(body.readers) == 12 and len(body.pass_blocks) == 2
    # the base network's weights load into the first pass (same names, blocks.<i>.…)
    missing = set(body.state_dict()) - set(plain.state_dict())
    assert not any(n.startswith("blocks.") for n in missing)


def test_configured_k_is_used_by_every_reader():
    for k in (1, 3, 7):
        m = make_nfm(k=k)
        assert {r.k for r in m.readers} == {k}
    m1, m3 = make_nfm(k=1, seed=5), make_nfm(k=3, seed=5)
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    assert not torch.allclose(m1(x), m3(x))                             # k changes the result


def test_random_attention_is_an_eval_ablation():
    m = make_nfm().float()
    x = torch.randn(3, 3, 9, 9)
    m.random_attention = True
    with pytest.raises(ValueError, match="evaluation ablation"):
        m(x)
    m.eval()
    torch.manual_seed(0)
    noisy = m(x, record=True)
    for r in m.records:
        torch.testing.assert_close(r.mass.sum(-1) + r.null, torch.ones(3))
    m.random_attention = False
    assert not torch.allclose(noisy, m(x))


def test_causal_tokens_stay_causal():
    """Attention runs over layers at one position: with per-position blocks and no BatchNorm,
    position t's output depends on position t only (a causal LM stays causal)."""
    torch.manual_seed(6)
    m = NFM([nn.Linear(4, 4), nn.Linear(4, 4)], channels=[4, 4, 4], layout="tokens", norm="none", k=2)
    for g in m.gammas:
        g.data.fill_(1.0)
    x = torch.randn(2, 7, 4)
    y = m(x)
    x2 = x.clone()
    x2[:, 4:] += 10.0
    torch.testing.assert_close(m(x2)[:, :4], y[:, :4])


def test_bad_input_errors_name_what_was_expected():
    with pytest.raises(ValueError, match=r"channels must list .* \(5 numbers for 4 blocks\), got 3"):
        NFM(conv_blocks(), channels=[3, 4, 6])
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        NFM(conv_blocks(), channels=CHANNELS, k=0)
    with pytest.raises(ValueError, match="rescale must be one of"):
        NFM(conv_blocks(), channels=CHANNELS, rescale="bilinear")
    m = NFM(conv_blocks(), channels=CHANNELS)
    with pytest.raises(ValueError, match=r"expected the input x to have 3 channels \(channels\[0\]\), got 2"):
        m(torch.randn(2, 2, 9, 9))
    bad = NFM(conv_blocks(), channels=[3, 4, 7, 6, 5])
    with pytest.raises(ValueError, match=r"expected block 1's output to have 7 channels"):
        bad(torch.randn(2, 3, 9, 9))
    with pytest.raises(ValueError, match="passes must be a positive int"):
        NFM(conv_blocks(), channels=CHANNELS, passes=0)


def test_layer_subclass_hooks():
    """A module's projections can be replaced (the transformer integration of Table 8)."""
    class Doubled(NFMLayer):
        def project_query(self, h):
            return 2 * super().project_query(h)

    torch.manual_seed(7)
    m = NFM(conv_blocks(), channels=CHANNELS, d_k=4, layer_factory=lambda p, i, cq, co, **o: Doubled(cq, co, **o))
    assert all(isinstance(r, Doubled) for r in m.readers)
    plain = NFM(conv_blocks(), channels=CHANNELS, d_k=4, score_scale="sqrt_d_k")
    plain.load_state_dict(m.state_dict())
    for g in m.gammas:
        g.data.fill_(0.7)
    for g in plain.gammas:
        g.data.fill_(0.7)
    x = torch.randn(2, 3, 9, 9)
    torch.testing.assert_close(m(x), plain(x))    # 2·q̂ / d_k = q̂ / √d_k at d_k = 4: the hook is used


def test_one_line_wrap_reads_the_channels_from_an_example_input():
    torch.manual_seed(8)
    blocks = conv_blocks()
    bn = nn.BatchNorm2d(4)
    blocks[0] = nn.Sequential(nn.Conv2d(3, 4, 3, 2, 1), bn, nn.Tanh())
    before = bn.running_mean.clone()
    m = NFM(blocks, example_input=torch.randn(2, 3, 9, 9), k=5, passes=2)
    assert m.channels == CHANNELS and bn.training                        # modes restored
    assert torch.equal(bn.running_mean, before)                          # the dry run left BN statistics alone
    with pytest.raises(ValueError, match="either channels=.* or example_input="):
        NFM(conv_blocks(), k=5)


def test_states_of_different_spatial_rank_get_a_clear_error():
    m = NFM([nn.Conv1d(2, 2, 3, 1, 1), nn.Unflatten(2, (2, 4))], channels=[2, 2, 2], k=2)
    with pytest.raises(ValueError, match=r"spatial shapes .* cannot be read together"):
        m(torch.randn(2, 2, 8))


# --------------------------------------------------------------------------------------------
# Issue 23: the authors' options (top-k rule, read schedule, reader output) and pretrained bases
# --------------------------------------------------------------------------------------------

def conv_only_blocks():
    """2-D states only (9×9 → 5×5 → 5×5 → 3×3), for the 3×3-convolution reader outputs."""
    return [nn.Sequential(nn.Conv2d(3, 4, 3, 2, 1), nn.ReLU(), nn.BatchNorm2d(4)),
            nn.Sequential(nn.Conv2d(4, 6, 3, 1, 1), nn.ReLU(), nn.BatchNorm2d(6)),
            nn.Sequential(nn.Conv2d(6, 6, 3, 2, 1), nn.ReLU(), nn.BatchNorm2d(6))]


def _with_gammas(m: NFM, gamma: float = 0.6) -> NFM:
    with torch.no_grad():
        for j, r in enumerate(m.readers):
            if r.gamma is not None:               # the earlier passes of read_at="after_last_pass": no γ
                r.gamma.fill_(gamma + 0.1 * j)
            if isinstance(r.norm, (nn.BatchNorm1d, nn.BatchNorm2d)):
                r.norm.weight.uniform_(0.5, 1.5)
                r.norm.bias.uniform_(-0.5, 0.5)
    return m


AUTHORS = dict(read_at="after_last_pass", reader_output="conv3x3", topk_softmax="subtract", rescale="nearest",
               score_scale="sqrt_d_k")


@pytest.mark.parametrize("kw", [AUTHORS, {**AUTHORS, "rescale": "space_to_depth", "k": 2}])
def test_the_authors_form_matches_literal_forward_and_gradients(kw):
    """The authors' Sort-of-CLEVR form (every option at once) against tests/reference/nfm.py."""
    torch.manual_seed(11)
    assert_matches_literal(_with_gammas(NFM(conv_only_blocks(), channels=[3, 4, 6, 6], d_k=4, d_v=3, num_heads=2,
                                            **{"k": 3, **kw}).double()))


def test_subtract_kth_literal_by_hand():
    """Ke et al.'s rule on one row: softmax (0.1, 0.2, 0.3, 0.4)-like weights, k = 2."""
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    got = torch.stack(subtract_kth_literal(list(torch.log(w)), 2))
    kept = torch.tensor([0.0, 0.0, 0.1 - 1e-7, 0.2 - 1e-7], dtype=torch.float64)   # minus the 3rd largest, 0.2
    torch.testing.assert_close(got, kept / (kept.sum() + 1e-7), rtol=0, atol=1e-15)
    three = torch.stack(subtract_kth_literal(list(torch.log(w[:3])), 2))           # ≤ k + 1 keys: the softmax
    torch.testing.assert_close(three, w[:3] / w[:3].sum(), rtol=0, atol=1e-15)


def test_topk_softmax_subtract_is_the_authors_rule_and_changes_the_weights(monkeypatch):
    """topk_softmax="subtract": each reader's weights are the authors' rule (the (k+1)-th weight
    subtracted); "kept" (§3.2.1's text) renormalises the softmax of the k best scores instead."""
    seen = {}
    real = nfm_module.sparse_softmax

    def spy(scores, **kw):
        w = real(scores, **kw)
        d = kw.get("dim", -1)                                               # the keys axis, moved last here
        seen.setdefault(kw["topk_softmax"], []).append((scores.movedim(d, -1), w.movedim(d, -1)))
        return w

    monkeypatch.setattr(nfm_module, "sparse_softmax", spy)
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    for rule in ("kept", "subtract"):
        make_nfm(k=3, topk_softmax=rule, seed=12, gamma=None)(x)          # γ = 0: the same states, so the same scores
    largest = 0.0
    for (s1, w_kept), (s2, w_sub) in zip(seen["kept"], seen["subtract"]):
        assert torch.equal(s1, s2)                                          # same scores, two rules
        rows = s1.reshape(-1, s1.shape[-1])
        want = torch.stack([torch.stack(subtract_kth_literal(list(r), 3)) for r in rows])
        torch.testing.assert_close(w_sub.reshape(want.shape), want, rtol=0, atol=1e-12)
        n_keys = s1.shape[-1]                                               # at most k kept, above k + 1 keys
        assert torch.all((w_sub > 0).sum(-1) <= (3 if n_keys > 4 else n_keys))
        largest = max(largest, (w_sub - w_kept).abs().max().item())
    assert largest > 0.05                                                  # a real difference, not rounding


def test_read_after_last_pass_reads_and_writes_as_the_authors_code():
    torch.manual_seed(13)
    m = NFM(conv_only_blocks(), channels=[3, 4, 6, 6], k=3, d_k=4, d_v=3, num_heads=2, read_at="after_last_pass")
    n = 3
    for p in range(2):
        for i in range(n):
            r = m.readers[p * n + i]
            assert r.key is not None and r.value is not None                # every block's output is written
            assert (r.query is not None, r.gamma is not None) == (p == 1, p == 1)   # only the last pass reads
    m(torch.randn(2, 3, 9, 9), record=True)
    assert [(r.pass_index, r.layer_index, r.sources) for r in m.records] == [
        (1, i, [(0, 0), (0, 1), (0, 2)] + [(1, j) for j in range(i + 1)]) for i in range(n)]
    with pytest.raises(RuntimeError, match="only writes"):
        m.readers[0].read(torch.randn(2, 4, 5, 5), [])


@pytest.mark.parametrize("kw", [{}, {"read_at": "after_last_pass"}, AUTHORS])
def test_gamma_zero_is_the_base_network_under_every_option(kw):
    torch.manual_seed(14)
    blocks = conv_only_blocks()
    base = nn.Sequential(*copy.deepcopy(blocks)).eval()
    m = NFM(blocks, channels=[3, 4, 6, 6], k=3, **kw).eval()
    x = torch.randn(3, 3, 9, 9)
    assert torch.equal(m(x), base(x))


def test_conv3x3_reader_output_needs_two_dimensional_states():
    m = NFM([nn.Conv1d(2, 2, 3, 1, 1), nn.Conv1d(2, 2, 3, 1, 1)], channels=[2, 2, 2], k=2, reader_output="conv3x3")
    with pytest.raises(ValueError, match=r"reader_output='conv3x3' reads 2-D states"):
        m(torch.randn(2, 2, 8))
    with pytest.raises(ValueError, match="read_at must be one of"):
        NFM(conv_blocks(), channels=CHANNELS, read_at="after")
    with pytest.raises(ValueError, match="topk_softmax must be one of"):
        NFM(conv_blocks(), channels=CHANNELS, topk_softmax="all")
    with pytest.raises(ValueError, match="reader_output must be one of"):
        NFM(conv_blocks(), channels=CHANNELS, reader_output="mlp")


def test_a_layer_factory_that_ignores_an_option_is_refused():
    class Fixed(NFMLayer):        # builds its own layer, dropping the options it was given
        def __init__(self, cq, co, **o):
            super().__init__(cq, co, reads=o["reads"], writes=o["writes"], residual=o["residual"])

    make = lambda p, i, cq, co, **o: Fixed(cq, co, **o)   # noqa: E731
    NFM(conv_blocks(), channels=CHANNELS, layer_factory=make)       # defaults: nothing ignored
    with pytest.raises(ValueError, match="does not support these options"):
        NFM(conv_blocks(), channels=CHANNELS, layer_factory=make, topk_softmax="subtract")


@pytest.mark.parametrize("kw", [{}, {"passes": 3}, {"read_at": "after_last_pass"}])
def test_loaded_base_weights_fill_every_pass(kw):
    """Issue 23 item 10: an NFM whose blocks get a pretrained base's weights computes the base
    network exactly with γ = 0, every pass (the pass copies are not left at their own init)."""
    torch.manual_seed(15)
    base = nn.Sequential(*conv_only_blocks())
    with torch.no_grad():                                       # "pretrained": away from any init
        for prm in base.parameters():
            prm.add_(torch.randn_like(prm))
    base(torch.randn(8, 3, 9, 9))                               # BN running statistics too
    base.eval()
    m = NFM(conv_only_blocks(), channels=[3, 4, 6, 6], k=3, **kw)
    state = {f"blocks.{k}": v for k, v in base.state_dict().items()}
    result = m.load_state_dict(state, strict=False)
    assert all(".readers." in f".{k}" for k in result.missing_keys) and not result.unexpected_keys
    m.eval()
    x = torch.randn(3, 3, 9, 9)
    assert torch.equal(m(x), base(x))
    for p in range(m.passes - 1):                               # copies, not tied weights
        w0, wp = m.blocks[0][0].weight, m.pass_blocks[p][0][0].weight
        assert torch.equal(w0, wp) and w0.data_ptr() != wp.data_ptr()
    full = {k: v.clone() for k, v in m.state_dict().items()}    # an NFM checkpoint loads as saved
    with torch.no_grad():
        m.pass_blocks[0][0][0].weight.add_(1.0)
    m.load_state_dict(full)
    assert torch.equal(m.pass_blocks[0][0][0].weight, m.blocks[0][0].weight)


def test_nfm_config_fields_for_the_authors_options():
    cfg = NFMConfig(enabled=True, topk_softmax="subtract", reader_output="conv3x3", read_at="after_last_pass")
    body = build_body(cfg, conv_only_blocks(), [3, 4, 6, 6])
    r = body.readers[-1]
    assert (body.read_at, r.topk_softmax, r.reader_output) == ("after_last_pass", "subtract", "conv3x3")
    assert isinstance(r.w_o1, nn.Conv2d) and isinstance(r.norm, nn.BatchNorm2d)
    for field, bad in (("topk_softmax", "all"), ("reader_output", "conv"), ("read_at", "after")):
        from modwire.models.relational_cnn import CNNMLPConfig
        with pytest.raises(ValueError, match=rf"config field 'nfm.{field}': got '{bad}', expected one of"):
            CNNMLPConfig(nfm={"enabled": True, field: bad})
