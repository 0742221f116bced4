import pytest
import torch
import torch.nn.functional as F

from reference.nac import layer_norm, modfc, modlin
from modwire.nn import ModulatedFFN, ModulatedLinear, ModulationSpec


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_modfc_matches_nac_eq1_shared_codes():
    U, B, d_in, d_out, d_c = 5, 3, 7, 4, 6
    layer = ModulatedLinear(d_in, d_out, d_c, "nac")
    with torch.no_grad():
        layer.alpha.fill_(0.37)  # away from the init so α visibly enters
        layer.bias.normal_()
    x, codes = torch.randn(B, U, d_in), torch.randn(U, d_c)
    y = layer(x, codes)
    for u in range(U):
        ref = modfc(x[:, u], codes[u], layer.weight, layer.bias, layer.code_proj, layer.alpha)
        torch.testing.assert_close(y[:, u], ref, atol=1e-5, rtol=1e-5)


def test_modfc_per_sample_codes():
    U, B, d_in, d_out, d_c = 4, 2, 5, 3, 6
    layer = ModulatedLinear(d_in, d_out, d_c, "nac")
    x, codes = torch.randn(B, U, d_in), torch.randn(B, U, d_c)
    y = layer(x, codes)
    for b in range(B):
        for u in range(U):
            ref = modfc(x[b, u], codes[b, u], layer.weight, layer.bias, layer.code_proj, layer.alpha)
            torch.testing.assert_close(y[b, u], ref, atol=1e-5, rtol=1e-5)


def test_modlin_matches_ni_eq4():
    U, d_in, d_out, d_c = 3, 6, 5, 4
    layer = ModulatedLinear(d_in, d_out, d_c, "ni")
    assert not hasattr(layer, "alpha")
    x, codes = torch.randn(2, U, d_in), torch.randn(U, d_c)
    y = layer(x, codes)
    for u in range(U):
        torch.testing.assert_close(y[:, u], modlin(x[:, u], codes[u], layer.weight, layer.bias, layer.code_proj),
                                   atol=1e-5, rtol=1e-5)


def test_unmodulated_is_plain_linear_and_alpha_zero_removes_conditioning():
    plain = ModulatedLinear(6, 4, modulation="none")
    x = torch.randn(3, 5, 6)
    torch.testing.assert_close(plain(x), F.linear(x, plain.weight, plain.bias))
    assert {n for n, _ in plain.named_parameters()} == {"weight", "bias"}
    mod = ModulatedLinear(6, 4, 3, "nac")
    with torch.no_grad():
        mod.alpha.zero_()
    torch.testing.assert_close(mod(x, torch.randn(5, 3)), F.linear(x, mod.weight, mod.bias))


def test_alpha_initialised_to_table4_value_and_gradients_reach_alpha_and_codes():
    layer = ModulatedLinear(8, 8, 4, "nac", alpha_init=0.1)
    assert layer.alpha.item() == pytest.approx(0.1)
    codes = torch.randn(3, 4, requires_grad=True)
    layer(torch.randn(2, 3, 8), codes).square().sum().backward()
    assert layer.alpha.grad.abs() > 0 and codes.grad.abs().sum() > 0 and layer.code_proj.grad.abs().sum() > 0


def test_modfc_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="modulation must be one of"):
        ModulatedLinear(3, 3, 2, "film")
    with pytest.raises(ValueError, match="code tensor"):
        ModulatedLinear(3, 3, 2)(torch.randn(1, 2, 3))


@pytest.mark.parametrize("activation", ["gelu", "geglu"])
def test_modffn_is_two_modfcs_sharing_the_code(activation):
    d, h, d_c, U = 6, 10, 5, 4
    ffn = ModulatedFFN(d, h, mod=ModulationSpec("nac", d_c), activation=activation)
    x, codes = torch.randn(2, U, d), torch.randn(U, d_c)
    y = ffn(x, codes)
    f1, f2 = ffn.fc1, ffn.fc2
    for u in range(U):
        z = modfc(x[:, u], codes[u], f1.weight, f1.bias, f1.code_proj, f1.alpha)
        if activation == "geglu":
            a, g = z.chunk(2, -1)
            z = a * F.gelu(g)
        else:
            z = F.gelu(z)
        ref = modfc(z, codes[u], f2.weight, f2.bias, f2.code_proj, f2.alpha)
        torch.testing.assert_close(y[:, u], ref, atol=1e-5, rtol=1e-5)


def _ffn_stack_weight_count(L, d_in, d_h, d_c, U):
    """Weights (not biases, not α) of L plain-GELU ModFFNs plus U codes."""
    stack = torch.nn.ModuleList(ModulatedFFN(d_in, d_h, mod=ModulationSpec("nac", d_c), activation="gelu")
                                for _ in range(L))
    n = sum(p.numel() for name, p in stack.named_parameters() if name.endswith(("weight", "code_proj")))
    return n + U * d_c, stack


def test_app_b1_parameter_formula():
    # NAC App. B.1: L·(2·d_in·d_h + 2·d_c·d_h) + U·d_c. The second term counts the two
    # code projections as d_c·d_h each; the first one really maps d_c → d_in, so the
    # formula is exact when d_in = d_h (and ignores biases and α).
    L, d, d_c, U = 3, 24, 16, 50
    count, _ = _ffn_stack_weight_count(L, d, d, d_c, U)
    assert count == L * (2 * d * d + 2 * d_c * d) + U * d_c
    # General d_in ≠ d_h: exact count is L·(2·d_in·d_h + d_c·(d_in + d_h)) + U·d_c.
    d_in, d_h = 12, 36
    count, stack = _ffn_stack_weight_count(L, d_in, d_h, d_c, U)
    assert count == L * (2 * d_in * d_h + d_c * (d_in + d_h)) + U * d_c
    total = sum(p.numel() for p in stack.parameters())
    assert total - (count - U * d_c) == L * (d_h + d_in + 2)  # biases of fc1, fc2 and their two α


def test_layer_norm_helper_matches_torch():
    v = torch.randn(4, 9)
    torch.testing.assert_close(layer_norm(v), F.layer_norm(v, (9,)))


def test_the_modulation_follows_parameter_updates_at_inference():
    layer = ModulatedLinear(6, 4, 3, "nac")
    codes = torch.nn.Parameter(torch.randn(5, 3))
    x = torch.randn(2, 5, 6)

    def literal_out():
        return torch.stack([modfc(x[:, u], codes[u], layer.weight, layer.bias, layer.code_proj, layer.alpha)
                            for u in range(5)], 1).detach()

    with torch.inference_mode():
        first = layer(x, codes)
        torch.testing.assert_close(first, literal_out(), atol=1e-5, rtol=1e-5)
    for update in (lambda: codes.add_(1.0), lambda: layer.code_proj.add_(torch.randn_like(layer.code_proj)), lambda: layer.alpha.fill_(0.7)):
        with torch.no_grad():
            update()
            y = layer(x, codes)
        torch.testing.assert_close(y, literal_out(), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(y, first, atol=1e-4)
        first = y
    layer.load_state_dict({k: torch.randn_like(v) for k, v in layer.state_dict().items()})
    with torch.no_grad():
        torch.testing.assert_close(layer(x, codes), literal_out(), atol=1e-5, rtol=1e-5)
    # with autograd on, gradients flow
    layer(x, codes).sum().backward()
    assert codes.grad is not None and layer.code_proj.grad is not None


@pytest.mark.parametrize("shared", [True, False], ids=["x shared by the codes", "x per code"])
def test_folded_modulation_equals_the_product_form_with_gradients(shared):
    """``fold=True``: ``(W diag m_u) x_u`` is ``W (x_u ⊙ m_u)`` (NI's grid ``[B, U, N, d]``), values
    and gradients, for an input shared by every code (``U = 1``) and one per code."""
    torch.manual_seed(0)
    plain = ModulatedLinear(6, 5, 4, "ni").double()
    folded = ModulatedLinear(6, 5, 4, "ni", fold=True).double()
    folded.load_state_dict(plain.state_dict())
    code = torch.randn(3, 1, 4, dtype=torch.float64)                      # [U, 1, d_code]
    x = torch.randn(2, 1 if shared else 3, 7, 6, dtype=torch.float64, requires_grad=True)
    outs, grads = [], []
    for layer in (plain, folded):
        y = layer(x, code)
        assert y.shape == (2, 3, 7, 5)
        y.backward(torch.linspace(-1, 1, y.numel(), dtype=torch.float64).view_as(y))
        outs.append(y.detach())
        grads.append([x.grad.clone()] + [p.grad.clone() for p in layer.parameters()])
        x.grad = None
    torch.testing.assert_close(outs[1], outs[0], atol=1e-12, rtol=1e-12)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    # an input that is not a grid over the codes takes the product form
    e = torch.randn(9, 6, dtype=torch.float64)
    torch.testing.assert_close(folded(e, code), plain(e, code))
