"""Self-tests of the literal references in tests/reference/: hand-computed examples and
textbook formulas, so that the references can be trusted when the library is compared to them."""
import math

import pytest
import torch

from reference.attention import attend_literal, null_weight
from reference.kernel import (cosine_distance_literal, log_link_prob_literal,
                              ni_compatibility_literal, normalize_literal)

E = math.exp
f64 = torch.float64


def _t(x):
    return torch.tensor(x, dtype=f64)


def _hand_qkv():
    # dk = 1, so the default scale dk^-0.5 is 1; scores: row 0 → (0.5, 1, 2), row 1 → (-0.5, -1, -2)
    q = _t([[1.0], [-1.0]])
    k = _t([[0.5], [1.0], [2.0]])
    v = _t([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    return q, k, v


def _check(out, w, w_expected, v):
    w_expected = _t(w_expected)
    torch.testing.assert_close(w, w_expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(out, w_expected @ v, rtol=0, atol=1e-15)


def test_literal_plain_2x3_by_hand():
    q, k, v = _hand_qkv()
    out, w = attend_literal(q, k, v)
    z0, z1 = E(.5) + E(1) + E(2), E(-.5) + E(-1) + E(-2)
    _check(out, w, [[E(.5) / z0, E(1) / z0, E(2) / z0], [E(-.5) / z1, E(-1) / z1, E(-2) / z1]], v)


def test_literal_explicit_scale_and_bias_by_hand():
    q, k, v = _hand_qkv()
    bias = _t([[0.0, 0.0, -1.0], [1.0, 0.0, 0.0]])
    out, w = attend_literal(q, k, v, bias=bias, scale=2.0)
    s0, s1 = [1.0, 2.0, 3.0], [0.0, -2.0, -4.0]  # 2·q·k + bias
    z0, z1 = sum(E(s) for s in s0), sum(E(s) for s in s1)
    _check(out, w, [[E(s) / z0 for s in s0], [E(s) / z1 for s in s1]], v)


def test_literal_topk_by_hand():
    q, k, v = _hand_qkv()
    out, w = attend_literal(q, k, v, topk=2)
    _check(out, w, [[0, E(1) / (E(1) + E(2)), E(2) / (E(1) + E(2))],
                    [E(-.5) / (E(-.5) + E(-1)), E(-1) / (E(-.5) + E(-1)), 0]], v)


def test_literal_null_slot_by_hand():
    q, k, v = _hand_qkv()
    out, w = attend_literal(q, k, v, null_kv=True)
    z0, z1 = 1 + E(.5) + E(1) + E(2), 1 + E(-.5) + E(-1) + E(-2)  # the null slot scores 0 → e^0 = 1
    _check(out, w, [[E(.5) / z0, E(1) / z0, E(2) / z0], [E(-.5) / z1, E(-1) / z1, E(-2) / z1]], v)
    torch.testing.assert_close(null_weight(w), _t([1 / z0, 1 / z1]), rtol=0, atol=1e-15)


def test_literal_null_slot_competes_in_topk_by_hand():
    q, k, v = _hand_qkv()
    out, w = attend_literal(q, k, v, null_kv=True, topk=2)
    # row 0: null (0) loses to keys 1, 2 (scores 1, 2); row 1: null (0) and key 0 (-0.5) win
    _check(out, w, [[0, E(1) / (E(1) + E(2)), E(2) / (E(1) + E(2))],
                    [E(-.5) / (1 + E(-.5)), 0, 0]], v)
    torch.testing.assert_close(null_weight(w), _t([0.0, 1 / (1 + E(-.5))]), rtol=0, atol=1e-15)


def test_literal_key_mask_and_empty_row_by_hand():
    q, k, v = _hand_qkv()
    q.requires_grad_(True)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    out, w = attend_literal(q, k, v, key_mask=mask)
    z0 = E(.5) + E(1)
    _check(out, w, [[E(.5) / z0, E(1) / z0, 0], [0, 0, 0]], v)
    assert torch.equal(out[1], torch.zeros(2, dtype=f64))  # exactly 0
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and q.grad[1].eq(0).all()
    # with the null slot the empty row reads the null value: still 0, null weight 1
    out, w = attend_literal(q, k, v, key_mask=mask, null_kv=True)
    assert torch.equal(out[1], torch.zeros(2, dtype=f64)) and null_weight(w)[1].item() == 1.0


def test_literal_row_scale_by_hand():
    q, k, v = _hand_qkv()
    out, w = attend_literal(q, k, v, row_scale=_t([2.0, 0.5]))
    z0, z1 = E(.5) + E(1) + E(2), E(-.5) + E(-1) + E(-2)
    _check(out, w, [[2 * E(.5) / z0, 2 * E(1) / z0, 2 * E(2) / z0],
                    [.5 * E(-.5) / z1, .5 * E(-1) / z1, .5 * E(-2) / z1]], v)


@pytest.mark.parametrize("lead", [(2, 3), (2, 2, 3)])
def test_literal_equals_textbook_softmax_attention(lead):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(*lead, 4, 3, generator=g, dtype=f64), torch.randn(*lead, 5, 3, generator=g, dtype=f64)
    v, bias = torch.randn(*lead, 5, 2, generator=g, dtype=f64), torch.randn(*lead, 4, 5, generator=g, dtype=f64)
    out, w = attend_literal(q, k, v, bias=bias)
    w_ref = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(3) + bias, dim=-1)
    torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-14)
    torch.testing.assert_close(out, w_ref @ v, rtol=0, atol=1e-14)
    # masking = -inf score, for rows that keep a key
    mask = torch.rand(*lead, 4, 5, generator=g) < 0.6
    mask[..., 0] = True
    out, w = attend_literal(q, k, v, bias=bias, key_mask=mask)
    w_ref = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(3) + bias).masked_fill(~mask, -math.inf), -1)
    torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-14)
    torch.testing.assert_close(out, w_ref @ v, rtol=0, atol=1e-14)


def test_literal_topk_with_null_keeps_k_entries_and_is_differentiable():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 4, generator=g, dtype=f64, requires_grad=True)
    k = torch.randn(2, 5, 4, generator=g, dtype=f64, requires_grad=True)
    v = torch.randn(2, 5, 3, generator=g, dtype=f64, requires_grad=True)
    bias = torch.randn(2, 3, 5, generator=g, dtype=f64, requires_grad=True)
    rs = torch.rand(2, 3, generator=g, dtype=f64).add(0.5).requires_grad_(True)
    mask = torch.rand(2, 3, 5, generator=g) < 0.8
    _, w = attend_literal(q, k, v, bias=bias, key_mask=mask, topk=2, null_kv=True)
    kept = (w != 0).sum(-1) + (null_weight(w).abs() > 1e-12).long()
    assert kept.eq(torch.minimum(mask.sum(-1) + 1, torch.tensor(2))).all()
    torch.autograd.gradcheck(
        lambda q, k, v, b, r: attend_literal(q, k, v, bias=b, key_mask=mask, row_scale=r, topk=2,
                                             null_kv=True)[0],
        (q, k, v, bias, rs))


def test_cosine_distance_literal_by_hand():
    a = _t([[1.0, 0.0]])
    b = _t([[0.0, 3.0], [1.0, 1.0], [-2.0, 0.0], [5.0, 0.0]])
    torch.testing.assert_close(cosine_distance_literal(a, b), _t([[1.0, 1 - 2 ** -0.5, 2.0, 0.0]]),
                               rtol=0, atol=1e-15)
    torch.testing.assert_close(log_link_prob_literal(a, b, 0.5), _t([[-2.0, -2 * (1 - 2 ** -0.5), -4.0, 0.0]]),
                               rtol=0, atol=1e-15)
    # leading axes broadcast: shared [Uk, d] against batched [B, Uq, d]
    d = cosine_distance_literal(torch.stack([a, -a]), b)
    torch.testing.assert_close(d[1], 2 - d[0], rtol=0, atol=1e-15)


def test_normalize_literal_by_hand():
    K = _t([[1.0, 3.0], [2.0, 2.0]])
    torch.testing.assert_close(normalize_literal(K, -1, 0.0), _t([[.25, .75], [.5, .5]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(normalize_literal(K, 0, 0.0), _t([[1 / 3, .6], [2 / 3, .4]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(normalize_literal(K, -1, 1.0), _t([[.2, .6], [2 / 5, 2 / 5]]), rtol=0, atol=1e-15)
    mask = torch.tensor([[True, False], [False, False]])
    torch.testing.assert_close(normalize_literal(K, -1, 1.0, mask), _t([[.5, 0], [0, 0]]), rtol=0, atol=1e-15)
    K3 = torch.arange(1.0, 9.0, dtype=f64).reshape(2, 2, 2)
    torch.testing.assert_close(normalize_literal(K3, 0, 0.0), K3 / K3.sum(0, keepdim=True), rtol=0, atol=1e-15)


def test_ni_compatibility_literal_by_hand():
    # signatures s_0 = e1, s_1 = e2; types t = (e1, e2, -e1); σ = 0.5, τ = 1 (d ≤ 1 kept), ε = 0.1
    s = _t([[1.0, 0.0], [0.0, 1.0]])
    t = _t([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    C = ni_compatibility_literal(s, t, 0.5, 1.0, 0.1)
    # d = [[0, 1, 2], [1, 0, 1]] → C̃ = [[1, e^-2, 0], [e^-2, 1, e^-2]]
    ct = _t([[1.0, E(-2), 0.0], [E(-2), 1.0, E(-2)]])
    torch.testing.assert_close(C, ct / (0.1 + ct.sum(0, keepdim=True)), rtol=0, atol=1e-15)


def test_ni_attention_weights_literal_by_hand():
    """NI Eq. 7 (sum over j in the denominator): s = (0.5, 0.25, 0.25), c = (1, 0, 2), r = 0.5, ε = 0.1:
    W̃ = (0.25, 0, 0.25), W = W̃ / (0.1 + 0.5); a row with r = 0 is all zeros."""
    from reference.ni import ni_attention_weights_literal

    s = _t([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]])
    w = ni_attention_weights_literal(s, _t([1.0, 0.0, 2.0]), _t([0.5, 0.0]), 0.1)
    torch.testing.assert_close(w, _t([[0.25 / 0.6, 0.0, 0.25 / 0.6], [0.0, 0.0, 0.0]]), rtol=0, atol=1e-15)
