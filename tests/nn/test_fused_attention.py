"""Issue 25 (fused attention): every hot attention call takes shapes and masks that SDPA's fused
kernels accept, checked by running each model with SDPA restricted to the fused CPU kernel
(``SDPBackend.FLASH_ATTENTION`` is the CPU's fused kernel); and :func:`fused_attention`'s reshaping
and padding are exact. NI's ModLins fold the codes once per forward, not once per iteration."""
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import modwire
from modwire.models.neural_interpreter import LOC
from modwire.nn.attention import fused_attention
from modwire.nn.modulated import ModulatedLinear

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_contract import make_inputs  # noqa: E402

FAMILIES = ["nac_micro", "nac_conditional_micro", "perceiver_io_micro", "ni_micro", "vit_micro", "ait_micro",
            "transformer_lm_micro", "nfm_transformer_lm_micro"]
# Families whose training-mode attention carries a learned additive bias, which the CPU's fused kernel
# cannot differentiate (it has no bias gradient): NAC's log K̂ (Eq. 3), the relative position biases of
# NI (App. C.2.3) and its ViT. Their training attention runs SDPA's math path on the CPU.
LEARNED_BIAS = {"nac_micro", "nac_conditional_micro", "ni_micro", "vit_micro"}


def _math(q, k, v, bias, scale):
    s = (q @ k.transpose(-1, -2)) * scale
    return (s if bias is None else s + bias).softmax(-1) @ v


@pytest.mark.parametrize("q_shape,kv_shape,dv,bias_shape", [
    ((2, 3, 4, 5, 8), (2, 3, 4, 7, 8), 9, (3, 4, 5, 7)),        # NI: [B, U, H, N, d], augmented values
    ((2, 3, 4, 5, 8), (2, 3, 4, 7, 8), 8, (4, 5, 7)),           # a bias shared by the functions
    ((2, 4, 5, 8), (2, 4, 7, 8), 8, (2, 1, 5, 7)),              # NAC: a bias per example
    ((2, 4, 5, 8), (1, 4, 7, 8), 13, None),                     # broadcast keys, unequal widths
    ((5, 8), (7, 8), 8, (5, 7)),                                # no batch axes
    ((2, 5, 8), (2, 7, 8), 3, None),                            # one batch axis
])
@pytest.mark.parametrize("bias_grad", [False, True])
def test_fused_attention_is_exact(q_shape, kv_shape, dv, bias_shape, bias_grad):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(q_shape, generator=g, requires_grad=True)
    k = torch.randn(kv_shape, generator=g, requires_grad=True)
    v = torch.randn(*kv_shape[:-1], dv, generator=g, requires_grad=True)
    bias = None if bias_shape is None else torch.randn(bias_shape, generator=g, requires_grad=bias_grad)
    out = fused_attention(q, k, v, bias, 0.3)
    ref = _math(q, k, v, bias, 0.3)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    leaves = [t for t in (q, k, v, bias) if t is not None and t.requires_grad]
    cot = torch.randn(ref.shape, generator=g)
    got = torch.autograd.grad(out, leaves, cot)
    want = torch.autograd.grad(ref, leaves, cot)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fused_attention_runs_on_the_fused_cpu_kernel():
    """The 5-D, unequal-width NI case (which SDPA alone sends to the math path) runs on the fused kernel."""
    q, k = torch.randn(2, 3, 4, 5, 8), torch.randn(2, 3, 4, 7, 8)
    v, bias = torch.randn(2, 3, 4, 7, 17), torch.randn(3, 4, 5, 7)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        with pytest.raises(RuntimeError, match="No available kernel"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        fused_attention(q, k, v, bias, 0.3)


class _Spy:
    """Runs every SDPA call on the fused CPU kernel only (an error where none applies), except a call
    whose bias needs a gradient, which it records and runs unrestricted."""

    def __init__(self, monkeypatch):
        self.real, self.fused, self.learned = F.scaled_dot_product_attention, 0, 0
        monkeypatch.setattr(F, "scaled_dot_product_attention", self)

    def __call__(self, q, k, v, attn_mask=None, **kw):
        if attn_mask is not None and attn_mask.requires_grad:
            self.learned += 1
            return self.real(q, k, v, attn_mask=attn_mask, **kw)
        self.fused += 1
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return self.real(q, k, v, attn_mask=attn_mask, **kw)


@pytest.mark.parametrize("name", FAMILIES)
def test_models_attention_on_fused_kernels(name, monkeypatch):
    spy = _Spy(monkeypatch)
    torch.manual_seed(0)
    model = modwire.create_model(name)
    x, kw = make_inputs(model.config, seed=0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.eval()
        model(x, **kw)                                  # evaluation: every call fused
        assert spy.fused > 0 and spy.learned == 0
        model.train()
        spy.fused = 0
        model(x, **kw)                                  # no gradient wanted: every call fused
        assert spy.learned == 0
    model.train()
    out = model(x, **kw)
    (out if torch.is_tensor(out) else out[0]).float().square().mean().backward()
    assert (spy.learned > 0) == (name in LEARNED_BIAS), (spy.fused, spy.learned)


def test_ni_folds_its_codes_once_per_forward(monkeypatch):
    """NI: one ``W diag LN(W_c c)`` per ModLin per forward, however many function iterations run."""
    calls = []
    real = ModulatedLinear.folded_weight
    monkeypatch.setattr(ModulatedLinear, "folded_weight", lambda self, code: calls.append(self) or real(self, code))
    counts = {}
    for iterations in (1, 3):
        torch.manual_seed(0)
        model = modwire.create_model("ni_micro", num_iterations=iterations)
        x, kw = make_inputs(model.config, seed=0)
        calls.clear()
        model(x, **kw)
        counts[iterations] = len(calls)
        assert len(set(map(id, calls))) == len(calls)    # each layer once
    locs = [m for m in model.modules() if isinstance(m, LOC)]
    modlins = sum(isinstance(m, ModulatedLinear) for loc in locs for m in (loc.attn.fn, loc.ffn.fn) for m in m.modules())
    assert modlins == 6 * len(locs) and counts == {1: modlins, 3: modlins}


def test_folded_weight_equals_the_modulated_product():
    torch.manual_seed(0)
    layer = ModulatedLinear(6, 5, code_dim=4, modulation="ni", fold=True)
    codes, x = torch.randn(3, 4), torch.randn(2, 3, 7, 6)
    ref = F.linear(x * layer.modulation_factor(codes).unsqueeze(-2), layer.weight, layer.bias)
    torch.testing.assert_close(layer(x, folded=layer.folded_weight(codes)), ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(layer(x, codes.unsqueeze(-2)), ref, atol=1e-6, rtol=1e-6)
