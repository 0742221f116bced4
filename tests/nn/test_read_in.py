"""The factorized read-in (notes §1) against a literal NAC Eq. 4-5, outputs and gradients."""
import pytest
import torch

from reference import nac as literal
from modwire.nn import ModulatedAttention, ModulationSpec


def _attn(d, H, d_in, d_c, **kwargs):
    torch.manual_seed(0)
    attn = ModulatedAttention(d, H, mod=ModulationSpec("nac", d_c), kv_dim=d_in, kv_code="receiver", **kwargs).double()
    with torch.no_grad():  # non-trivial α and biases, so every term of the identity is exercised
        for lin in (attn.q, attn.k, attn.v, attn.o):
            lin.alpha.uniform_(0.2, 0.9)
            if lin.bias is not None:  # the key has none: its bias would cancel in the softmax
                lin.bias.normal_()
    return attn


@pytest.mark.parametrize("heads", [1, 2])
def test_factorized_read_in_equals_literal_eq4_5(heads):
    U, N, B, d, d_in, d_c = 6, 7, 3, 8, 10, 5
    attn = _attn(d, heads, d_in, d_c)
    theta0 = torch.randn(U, d, dtype=torch.float64)
    x = torch.randn(B, N, d_in, dtype=torch.float64)
    codes = torch.randn(U, d_c, dtype=torch.float64)
    ref = literal.read_in(attn, theta0, x, codes)
    fact, _ = attn(theta0, x, code_q=codes, method="factorized")
    lit, _ = attn(theta0, x, code_q=codes, method="literal")
    torch.testing.assert_close(fact, ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(lit, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("heads, head_dim, qv_bias", [(1, 3, True), (2, 5, False), (3, 4, True)])
def test_factorized_read_in_with_heads_of_any_width_equals_literal_eq4_5(heads, head_dim, qv_bias):
    """Heads ``head_dim`` wide whatever d is (the NAC authors' read-in: one head of 64 for d 384):
    the attention is ``heads·head_dim`` wide, with or without query/value biases, masked or not."""
    U, N, B, d, d_in, d_c = 5, 7, 2, 8, 10, 5
    attn = _attn(d, heads, d_in, d_c, head_dim=head_dim, qv_bias=qv_bias)
    assert attn.q.weight.shape == (heads * head_dim, d) and attn.o.weight.shape == (d, heads * head_dim)
    assert (attn.q.bias is None) == (not qv_bias) and (attn.v.bias is None) == (not qv_bias)
    theta0 = torch.randn(U, d, dtype=torch.float64)
    x = torch.randn(B, N, d_in, dtype=torch.float64)
    codes = torch.randn(U, d_c, dtype=torch.float64)
    ref = literal.read_in(attn, theta0, x, codes)
    for method in ("factorized", "literal"):
        out, _ = attn(theta0, x, code_q=codes, method=method)
        torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    mask = torch.ones(B, 1, 1, N, dtype=torch.bool)
    mask[..., -2:] = False                                      # the last two tokens are padding
    masked, _ = attn(theta0, x, code_q=codes, key_mask=mask)
    torch.testing.assert_close(masked, literal.read_in(attn, theta0, x[:, :-2], codes), atol=1e-10, rtol=1e-10)


def test_factorized_read_in_fp32_outputs_and_gradients_within_1e_5():
    U, N, B, d, d_in, d_c, H = 16, 9, 4, 12, 12, 6, 1
    attn = _attn(d, H, d_in, d_c).float()
    theta0 = torch.randn(U, d)
    x = torch.randn(B, N, d_in)
    codes = torch.randn(U, d_c)
    target = torch.randn(B, U, d)

    def grads(method):
        attn.zero_grad()
        leaves = [t.clone().requires_grad_() for t in (theta0, x, codes)]
        out, _ = attn(leaves[0], leaves[1], code_q=leaves[2], method=method)
        ((out - target) ** 2).sum().backward()
        return out.detach(), [l.grad for l in leaves] + [p.grad.clone() for p in attn.parameters()]

    out_f, g_f = grads("factorized")
    out_l, g_l = grads("literal")
    assert (out_f - out_l).abs().max() < 1e-5
    for a, b in zip(g_f, g_l):
        assert (a - b).abs().max() / (1 + b.abs().max()) < 1e-5


def test_read_in_per_sample_codes_and_attention_weights():
    U, N, B, d, d_in, d_c = 4, 5, 2, 8, 6, 3
    attn = _attn(d, 2, d_in, d_c)
    theta0 = torch.randn(B, U, d, dtype=torch.float64)
    x = torch.randn(B, N, d_in, dtype=torch.float64)
    codes = torch.randn(B, U, d_c, dtype=torch.float64)
    fact, w_f = attn(theta0, x, code_q=codes, method="factorized", return_weights=True)
    lit, w_l = attn(theta0, x, code_q=codes, method="literal", return_weights=True)
    torch.testing.assert_close(fact, lit)
    torch.testing.assert_close(w_f, w_l)
    for b in range(B):  # each sample against the literal loop with its own codes
        torch.testing.assert_close(fact[b:b + 1], literal.read_in(attn, theta0[b], x[b:b + 1], codes[b]))
    torch.testing.assert_close(w_f.sum(-1), torch.ones(B, 2, U, dtype=torch.float64))


def test_every_module_sees_its_own_keys():
    # Two modules with the same initial state but different codes attend differently.
    attn = _attn(8, 1, 6, 4)
    theta0 = torch.randn(1, 8, dtype=torch.float64).expand(2, 8)
    _, w = attn(theta0, torch.randn(1, 5, 6, dtype=torch.float64), code_q=torch.randn(2, 4, dtype=torch.float64),
                return_weights=True)
    assert (w[0, 0, 0] - w[0, 0, 1]).abs().max() > 1e-3
