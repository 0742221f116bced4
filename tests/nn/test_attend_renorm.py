"""NI Eq. 7 in ``modwire.nn.attend``: ``key_scale`` (``c_j = C_uj``), ``row_scale`` (``r_i = C_ui``)
and ``renorm_eps`` (ε) give ``W_ij = r_i c_j s_ij / (ε + Σ_j r_i c_j s_ij)`` with
``s = softmax_j(scale·q·k + bias)``; checked against the literal loops of
``tests/reference/ni.py`` (float64, gradients), on the fused path (one SDPA over the augmented
values ``[c_j v_j, c_j]``) and the explicit path (weights asked for)."""
import pytest
import torch

from modwire.nn import attend
from reference.attention import attend_literal
from reference.ni import ni_attention_weights_literal

LEAD, N_Q, N_K, D_K, D_V = (2, 3), 4, 5, 3, 2


def _inputs(seed=0, zero_rows=True):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(*LEAD, n, D_K, generator=g, dtype=torch.float64) for n in (N_Q, N_K))
    v = torch.randn(*LEAD, N_K, D_V, generator=g, dtype=torch.float64)
    bias = torch.randn(*LEAD, N_Q, N_K, generator=g, dtype=torch.float64)
    c = torch.rand(*LEAD, N_K, generator=g, dtype=torch.float64)
    r = torch.rand(*LEAD, N_Q, generator=g, dtype=torch.float64)
    if zero_rows:
        c[0, 0] = 0.0          # no key may be read in this slice: every row is 0
        c[1, 2, 1] = 0.0       # one key unreadable
        r[0, 1, 2] = 0.0       # one query with C_ui = 0
    return q, k, v, bias, c, r


def _literal(q, k, v, bias, c, r, eps):
    _, s = attend_literal(q, k, v, bias=bias)                  # s = softmax_j(q·k/√d + bias)
    w = ni_attention_weights_literal(s, c, r, eps)            # NI Eq. 7
    return w @ v, w


@pytest.mark.parametrize("eps", [1e-6, 0.3, 0.0])
@pytest.mark.parametrize("weights", [False, True], ids=["fused", "explicit"])
def test_key_scale_matches_eq7_literal(eps, weights):
    q, k, v, bias, c, r = _inputs()
    inputs = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out, w = attend(*inputs[:3], bias=inputs[3], key_scale=c, row_scale=r, renorm_eps=eps, return_weights=weights)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    ref, ref_w = _literal(*ref_in, c, r, eps)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    if weights:
        torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-10)
        torch.testing.assert_close(w @ v, out, rtol=0, atol=1e-12)   # out = weights @ v
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * g).sum(), ref_in)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-8)


def test_zero_compatibility_rows_are_finite_and_zero():
    q, k, v, bias, c, r = _inputs()
    for eps in (1e-6, 0.0):
        for weights in (False, True):
            out, _ = attend(q, k, v, bias=bias, key_scale=c, row_scale=r, renorm_eps=eps, return_weights=weights)
            assert torch.isfinite(out).all()
            assert out[0, 0].abs().max() == 0            # all c_j = 0
            assert out[0, 1, 2].abs().max() == 0         # r_i = 0
            assert out[1, 2].abs().max() > 0


def test_unreadable_key_gets_no_weight_and_row_sums():
    """c_j = 0 → W_ij = 0; with ε = 0 and r_i > 0 the row sums to 1 (renormalised), and r_i cancels."""
    q, k, v, bias, c, r = _inputs()
    _, w = attend(q, k, v, bias=bias, key_scale=c, row_scale=r, renorm_eps=0.0, return_weights=True)
    assert w[1, 2, :, 1].abs().max() == 0
    torch.testing.assert_close(w[1].sum(-1), torch.ones_like(w[1].sum(-1)), rtol=0, atol=1e-12)
    _, w1 = attend(q, k, v, bias=bias, key_scale=c, renorm_eps=0.0, return_weights=True)
    torch.testing.assert_close(w[1], w1[1], rtol=0, atol=1e-12)


def test_unit_key_scale_is_plain_attention_times_row_scale_at_eps0():
    q, k, v, bias, _, r = _inputs(zero_rows=False)
    out, _ = attend(q, k, v, bias=bias, key_scale=torch.ones(N_K, dtype=q.dtype), renorm_eps=0.0)
    plain, _ = attend(q, k, v, bias=bias)
    torch.testing.assert_close(out, plain, rtol=0, atol=1e-12)
    # with ε > 0 the row scale no longer cancels: r/(ε + r) of the plain output
    out, _ = attend(q, k, v, bias=bias, key_scale=torch.ones(N_K, dtype=q.dtype), row_scale=r, renorm_eps=0.5)
    torch.testing.assert_close(out, plain * (r / (0.5 + r)).unsqueeze(-1), rtol=0, atol=1e-12)


def test_key_scale_with_mask_and_broadcast_shapes():
    """key_scale broadcast ``[1, 1, Nk]``; a row with no allowed key reads zeros."""
    q, k, v, bias, c, r = _inputs(zero_rows=False)
    mask = torch.ones(*LEAD, N_Q, N_K, dtype=torch.bool)
    mask[0, 0, 1] = False
    c1 = c[:1, :1]
    out, _ = attend(q, k, v, bias=bias, key_mask=mask, key_scale=c1, row_scale=r, renorm_eps=1e-3)
    bias_m = bias.masked_fill(~mask, -1e9)
    ref, _ = _literal(q, k, v, bias_m, c1, r, 1e-3)
    ref[0, 0, 1] = 0
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    assert out[0, 0, 1].abs().max() == 0


def test_float32_fused_matches_explicit():
    q, k, v, bias, c, r = (t.float() for t in _inputs())
    a, _ = attend(q, k, v, bias=bias, key_scale=c, row_scale=r, renorm_eps=1e-6)
    b, _ = attend(q, k, v, bias=bias, key_scale=c, row_scale=r, renorm_eps=1e-6, return_weights=True)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bad_options_are_errors():
    q, k, v, bias, c, r = _inputs()
    with pytest.raises(ValueError, match="renorm_eps"):
        attend(q, k, v, renorm_eps=0.1)
    with pytest.raises(ValueError, match="renorm_eps must be a number >= 0"):
        attend(q, k, v, key_scale=c, renorm_eps=-1.0)
    with pytest.raises(ValueError, match="null_kv"):
        attend(q, k, v, key_scale=c, null_kv=True)
