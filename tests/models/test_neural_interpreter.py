"""Neural Interpreters (``modwire.models.neural_interpreter``): the model against the literal loops
of ``tests/reference/ni.py`` (NI Eq. 2-3, 7-13), the identity property of Eq. 10-11, the reduction
to a ViT, dynamic inference (capacity extension, function dropping, anytime iterations), frozen
signatures, save/load and config errors."""
import copy
import inspect

import pytest
import torch
import torch.nn.functional as F

from modwire.models.neural_interpreter import (NeuralInterpreter, NeuralInterpreterConfig, max_identity_iterations,
                                               residual_growth)
from modwire.models.registry import create_model
from modwire.models.tokenizer_config import TokenizerConfig
from modwire.models.vit import ViT, ViTConfig
from reference.ni import fn_iter_literal, interpreter_literal

B = 2


def _config(**kw) -> NeuralInterpreterConfig:
    """4×4 images in 2×2 patches (4 grid tokens + 1 CLS token), 3 functions, 2 heads."""
    base = dict(num_classes=3, d_model=8, d_code=6, num_scripts=2, num_iterations=2, num_functions=3,
                num_heads=2, qk_head_dim=3, ffn_hidden=10, d_type=4, tau=1.6, type_hidden=7, pos_dim=3,
                eps=1e-3, tokenizer=TokenizerConfig(kind="patches", image_size=4, in_channels=1, patch_size=2,
                                            positions="relative"))
    return NeuralInterpreterConfig(**{**base, **kw})


def _model(seed=0, **kw) -> NeuralInterpreter:
    torch.manual_seed(seed)
    return NeuralInterpreter(_config(**kw)).double().eval()


def _x(seed=1, image=4):
    return torch.rand(B, 1, image, image, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _tokens(model, x):
    t = model.embed(x)
    return torch.cat([t, model.cls_tokens.expand(len(x), -1, -1)], dim=1)


# ----------------------------------------------------------------------------- equations

@pytest.mark.parametrize("residual", ["identity", "update", "none"])
def test_function_iteration_matches_literal_eq2_13(residual):
    """One FnIter (Eq. 12-13) of a script: types, C, per-function LOCs with positional biases,
    interpreter; vectorised over [B, U, N, d] vs one sample, function, head, pair at a time."""
    model = _model(interpreter_residual=residual, tau=1.2, num_locs=2)
    script = model.scripts[0]
    x = _tokens(model, _x()).detach()
    sig, codes = script.functions.all()
    biases = [loc.position_bias(codes, x.shape[1]) for loc in script.locs]
    C, _ = script.type_matching(x, sig)
    y, _ = script.interpret(x, codes, C, biases)
    assert (C == 0).any() and (C > 0).any()          # the truncation is active in this test
    for b in range(B):
        ref_y, ref_C = fn_iter_literal(script, x[b], codes, sig, script.log_sigma.exp(), 1.2, 1e-3,
                                       residual=residual, biases=biases)
        torch.testing.assert_close(C[b], ref_C, rtol=0, atol=1e-12)
        torch.testing.assert_close(y[b], ref_y, rtol=0, atol=1e-10)


def test_literal_gradients_match_for_codes_and_sigma():
    model = _model(num_scripts=1)
    script = model.scripts[0]
    x = _tokens(model, _x()).detach()[:1]
    sig, codes = script.functions.all()
    biases = [loc.position_bias(codes, x.shape[1]) for loc in script.locs]
    C, _ = script.type_matching(x, sig)
    y, _ = script.interpret(x, codes, C, biases)
    ref, _ = fn_iter_literal(script, x[0], codes, sig, script.log_sigma.exp(), 1.6, 1e-3, biases=biases)
    params = [script.functions.codes, script.log_sigma, script.locs[0].attn.fn.q.weight]
    g = torch.randn_like(ref)
    for a, r in zip(torch.autograd.grad((y[0] * g).sum(), params, retain_graph=True),
                    torch.autograd.grad((ref * g).sum(), params)):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-9)


def test_zero_compatibility_leaves_variable_unchanged():
    """Eq. 10: C_ui = 0 ⇒ LOC(x)_ui = x_ui; Eq. 11: C_·i = 0 ⇒ y_i = x_i (identity and update)."""
    for residual in ("identity", "update"):
        model = _model(interpreter_residual=residual)
        script = model.scripts[0]
        x = _tokens(model, _x()).detach()
        sig, codes = script.functions.all()
        C, _ = script.type_matching(x, sig)
        C = C.clone()
        C[:, 1, 2] = 0          # function 1 may not touch token 2
        C[:, :, 3] = 0          # no function touches token 3
        loc = script.locs[0]
        xs, _ = loc(x.unsqueeze(1), loc.folds(codes), C, eps=1e-3, bias=loc.position_bias(codes, x.shape[1]))
        torch.testing.assert_close(xs[:, 1, 2], x[:, 2], rtol=0, atol=0)
        assert (xs[:, 0, 2] - x[:, 2]).abs().max() > 1e-3
        y, _ = script.interpret(x, codes, C, [loc.position_bias(codes, x.shape[1])])
        torch.testing.assert_close(y[:, 3], x[:, 3], rtol=0, atol=0)
        assert (y[:, 2] - x[:, 2]).abs().max() > 1e-3


def test_intermediates_compatibility_and_types():
    model = _model()
    inter = model.forward_record(_x())
    assert len(inter.compatibility) == len(inter.types) == 2 * 2         # n_s · n_i
    C, t = inter.compatibility[0], inter.types[0]
    assert C.shape == (B, 3, 5) and t.shape == (B, 5, 4)
    torch.testing.assert_close(t.norm(dim=-1), torch.ones(B, 5, dtype=t.dtype))
    assert (C >= 0).all() and (C.sum(1) <= 1).all()
    assert inter.propagator_attention[0].shape == (B, 3, 2, 5, 5)        # [B, U, H, N, N]
    torch.testing.assert_close(inter.logits, model(_x()), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- reduction to a ViT

def _vit_from_ni(ni: NeuralInterpreter) -> ViT:
    """The ViT whose linear maps are NI's ModLins at the one function's code: ``W·diag(LN(W_c c))``."""
    c = ni.config
    vit = ViT(ViTConfig(num_classes=c.num_classes, d_model=c.d_model, num_layers=c.num_locs, num_heads=c.num_heads,
                        ffn_hidden=c.ffn_hidden, num_cls_tokens=c.num_cls_tokens, tokenizer=c.tokenizer)).double()
    vit.embed.load_state_dict(ni.embed.state_dict())
    vit.norm.load_state_dict(ni.norm.state_dict())
    vit.heads.load_state_dict(ni.heads.state_dict())
    vit.cls_tokens.data.copy_(ni.cls_tokens.data)
    code = ni.scripts[0].functions.codes[0]
    with torch.no_grad():
        for block, loc in zip(vit.blocks, ni.scripts[0].locs):
            block.attn.norm.load_state_dict(loc.attn.norm.state_dict())
            block.ffn.norm.load_state_dict(loc.ffn.norm.state_dict())
            pairs = [(block.attn.fn.q, loc.attn.fn.q), (block.attn.fn.k, loc.attn.fn.k), (block.attn.fn.v, loc.attn.fn.v),
                     (block.attn.fn.o, loc.attn.fn.o), (block.ffn.fn.fc1, loc.ffn.fn.fc1), (block.ffn.fn.fc2, loc.ffn.fn.fc2)]
            for plain, mod in pairs:
                plain.weight.copy_(mod.weight * mod.modulation_factor(code))
                if plain.bias is not None:                               # the ViT's keys have no bias
                    plain.bias.copy_(torch.zeros_like(plain.bias) if mod.bias is None else mod.bias)
    return vit.eval()


@pytest.mark.parametrize("residual", ["update", "none", "identity"])
def test_reduces_to_vit_with_one_function(residual):
    """U = 1, ε = 0, no truncation (C ≡ 1), one script, one iteration, n_l = 2 LOCs, key width =
    value width per head: a ViT with 2 pre-LN layers (``update`` / ``none``); Eq. 11 as printed
    (``identity``) adds the input once more: ``y = x + ViT-layers(x)``."""
    ni = _model(num_functions=1, eps=0.0, tau=None, num_scripts=1, num_iterations=1, num_locs=2, qk_head_dim=4,
                interpreter_residual=residual, tokenizer=TokenizerConfig(kind="linear", input_dim=3, max_len=0))
    vit = _vit_from_ni(ni)
    x = torch.randn(B, 6, 3, dtype=torch.float64)
    tokens = _tokens(ni, x)
    y_ni, extra = ni.encode(tokens, record=False)
    y_vit, _ = vit.encode(tokens, record=False)
    expected = y_vit + tokens if residual == "identity" else y_vit
    torch.testing.assert_close(y_ni, expected, rtol=0, atol=1e-10)
    if residual != "identity":
        torch.testing.assert_close(ni(x), vit(x), rtol=0, atol=1e-10)


def test_default_eq11_reading_is_the_printed_equation_and_matches_the_reference_default():
    """The default of the model and of the literal reference is Eq. 11 as printed,
    ``y_i = x_i + Σ_u C_ui LOCs(x)_ui`` (the paper speaks; the text under it holds for it)."""
    assert NeuralInterpreterConfig().interpreter_residual == "identity"
    assert inspect.signature(interpreter_literal).parameters["residual"].default == "identity"
    assert inspect.signature(fn_iter_literal).parameters["residual"].default == "identity"
    for name in ("ni_digits", "ni_fuzzy_boolean", "ni_pgm_neutral", "ni_micro"):
        assert create_model(name).config.interpreter_residual == "identity", name


def test_residual_stream_growth_of_the_three_readings():
    """Eq. 11 as printed (``identity``) doubles the residual stream every function iteration
    (Σ_u C_ui ≈ 1 without truncation); ``update`` / ``none`` keep its scale."""
    growth = {}
    for residual in ("identity", "update", "none"):
        model = _model(interpreter_residual=residual, num_scripts=1, num_iterations=6, tau=None)
        growth[residual] = residual_growth(model, _tokens(model, _x()))
        assert len(growth[residual]) == 6
    per_iteration = [b / a for a, b in zip([1.0] + growth["identity"][:-1], growth["identity"])]
    assert all(1.8 < g < 2.2 for g in per_iteration), per_iteration
    assert all(0.5 < r < 2 for r in growth["update"] + growth["none"]), growth


def test_eq11_as_printed_refuses_iterations_that_overflow_and_says_why_the_others_run_them():
    """``iterations=50``: ``update`` and ``none`` stay finite; Eq. 11 as printed (the default) would
    scale the stream by 2^(n_s·k) and is refused (with the reason) before it overflows into NaN."""
    torch.manual_seed(0)
    x = torch.rand(B, 1, 4, 4)
    for residual in ("update", "none"):
        model = NeuralInterpreter(_config(interpreter_residual=residual)).eval()   # float32, 2 scripts
        with torch.no_grad():
            assert torch.isfinite(model(x, iterations=50)).all()
    literal = NeuralInterpreter(_config()).eval()
    assert literal.config.interpreter_residual == "identity"
    assert max_identity_iterations(torch.float32) == 60
    with torch.no_grad():
        assert torch.isfinite(literal(x, iterations=30)).all()                # 2 · 30 = 60: allowed
        with pytest.raises(ValueError, match=r"doubles the residual stream.*2\^100.*'update'"):
            literal(x, iterations=50)
        assert torch.isfinite(literal.double()(x.double(), iterations=50)).all()   # float64: 508
    with pytest.raises(ValueError, match="num_iterations.*doubles"):
        _config(interpreter_residual="identity", num_scripts=2, num_iterations=31)


# ----------------------------------------------------------------------------- dynamic inference

def test_capacity_extension_unchanged_when_new_functions_match_nothing():
    model = _model(tau=1.6)
    x = _x()
    e0 = torch.zeros(4, dtype=torch.float64)
    e0[0] = 1
    with torch.no_grad():                 # types near e_0 for every input ...
        for s in model.scripts:
            s.type_inference.mlp[-1].bias.copy_(8 * e0)
    before = model(x)
    model.add_functions(2)
    assert model.config.num_added_functions == 2 and model.config.total_functions == 5
    with torch.no_grad():                 # ... and new signatures at -e_0: d ≈ 2 > τ, never matched
        for s in model.scripts:
            s.functions.added_signatures.copy_(-e0.expand(2, 4))
    inter = model.forward_record(x)
    assert all(C.shape[1] == 5 and C[:, 3:].abs().max() == 0 for C in inter.compatibility)
    torch.testing.assert_close(inter.logits, before, rtol=0, atol=1e-12)
    names = [n for n, _ in model.named_parameters() if n.startswith(model.parameter_sets()["new_functions"])]
    assert sorted(names) == sorted(f"scripts.{i}.functions.added_{k}" for i in range(2) for k in ("signatures", "codes"))


def test_capacity_extension_trains_only_new_functions():
    model = _model().train()
    model.add_functions(1)
    new = model.parameter_sets()["new_functions"]
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(new))
    old = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(_x()).square().sum().backward()
    opt.step()
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, old[k])}
    assert changed and all(".functions.added_" in k for k in changed)


def test_drop_functions_matches_analysis_module_dropping():
    from modwire.analysis.sparsify import drop_modules

    model = _model()
    x = _x()
    via_analysis = drop_modules(model, 1, order=[1])
    model.drop_functions([1])
    assert model.config.num_functions == via_analysis.config.num_functions == 2
    torch.testing.assert_close(model(x), via_analysis(x), rtol=0, atol=0)
    # the same as a 2-function model holding the kept rows
    fresh = NeuralInterpreter(model.config).double().eval()
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="at least one"):
        model.drop_functions([0, 1])
    with pytest.raises(ValueError, match=r"indices in \[0, 2\)"):
        model.drop_functions([5])


def test_dropping_a_function_changes_the_output_and_keeps_the_rest():
    model = _model()
    x = _x()
    full = model(x)
    model.drop_functions([0])
    out = model(x)
    assert torch.isfinite(out).all() and (out - full).abs().max() > 1e-6
    assert model.scripts[1].functions.codes.shape == (2, 6)


def test_anytime_iterations():
    model = _model(num_iterations=3)
    x = _x()
    torch.testing.assert_close(model(x, iterations=3), model(x), rtol=0, atol=0)
    short = NeuralInterpreter(model.config.replace(num_iterations=1)).double().eval()
    short.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(x, iterations=1), short(x), rtol=0, atol=1e-12)
    assert len(model._run(x, None, record=True, iterations=1).compatibility) == 2
    with pytest.raises(ValueError, match="iterations must be a positive int"):
        model(x, iterations=0)


# ----------------------------------------------------------------------------- training, saving, config

def test_frozen_signatures_stay_fixed_after_an_optimizer_step():
    model = _model(freeze_signatures=True, freeze_codes=False).train()
    sig0 = model.scripts[0].functions.signatures.detach().clone()
    code0 = model.scripts[0].functions.codes.detach().clone()
    torch.testing.assert_close(sig0.norm(dim=-1), torch.ones(3, dtype=sig0.dtype))   # on the sphere
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    model(_x()).square().sum().backward()
    opt.step()
    assert torch.equal(model.scripts[0].functions.signatures, sig0)
    assert not torch.equal(model.scripts[0].functions.codes, code0)
    frozen_codes = _model(freeze_codes=True)
    assert not frozen_codes.scripts[0].functions.codes.requires_grad


def test_save_load_round_trip(tmp_path):
    from modwire.models.registry import from_pretrained

    model = _model()
    model.add_functions(2)
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path).double().eval()
    assert loaded.config == model.config
    torch.testing.assert_close(loaded(_x()), model(_x()), rtol=0, atol=0)
    assert not loaded.scripts[0].functions.signatures.requires_grad        # frozen stays frozen
    assert loaded.scripts[0].functions.added_signatures.requires_grad


def test_parameter_sets_name_existing_parameters():
    model = _model()
    sets = model.parameter_sets()
    assert set(sets) == {"cls", "heads", "type_inference", "signatures_codes", "functions", "all"}
    names = [n for n, _ in model.named_parameters()]
    for key, prefixes in sets.items():
        assert any(n.startswith(prefixes) for n in names), key
    ti = [n for n in names if n.startswith(sets["type_inference"])]
    assert "scripts.1.log_sigma" in ti and "scripts.0.functions.signatures" in ti
    assert any(".type_inference.mlp." in n for n in ti) and not any(".locs." in n for n in ti)


@pytest.mark.parametrize("field,value,match", [
    ("tau", 2.5, "tau"), ("tau", -0.1, "tau"), ("d_type", 1, "d_type"), ("eps", -1.0, "eps"),
    ("num_heads", 3, "num_heads"), ("interpreter_residual", "double", "interpreter_residual"),
    ("sigma_init", 0.0, "sigma_init"), ("num_functions", 0, "num_functions")])
def test_bad_config_values_name_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        _config(**{field: value})


def test_presets_build_and_digits_count():
    n = create_model("ni_digits").num_parameters()
    assert abs(n - 6.43e5) / 6.43e5 < 0.02, n
    pgm = create_model("ni_pgm_neutral").num_parameters()         # the count the _pgm docstring states
    assert pgm == 1_403_795 and -0.13 < (pgm - 1.6e6) / 1.6e6 < -0.12
    for name in ("ni_fuzzy_boolean", "ni_micro"):
        m = create_model(name)
        assert m.num_parameters() > 0
