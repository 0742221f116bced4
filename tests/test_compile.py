"""Issue 25: every model family compiles with ``torch.compile(fullgraph=True)`` in train and eval mode,
traces one graph and never recompiles over 20 optimizer steps at fixed shapes (also after an eager
call under ``torch.no_grad``: no cache keyed on parameter identity), and the compiled model gives
the eager model's outputs. Dynamo's capture (graph breaks, guards, recompiles) does not depend on the
backend, so the test compiles with ``aot_eager`` (dynamo + AOT autograd, no inductor code generation:
seconds instead of minutes); the speed of inductor's code is ``benchmarks/``' business. The families with
a learned attention bias compile with ``attention_backend="flex"`` too (issue 39: FlexAttention traced into
the graph; on the CPU only the evaluation graph runs it, training takes SDPA: torch has no CPU backward)."""
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo as dynamo

import modwire

sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))
from test_contract import make_inputs  # noqa: E402

FAMILIES = ["nac_micro", "nac_conditional_micro", "perceiver_io_micro", "ni_micro", "vit_micro", "ait_micro",
            "nfm_preact_resnet_micro", "nfm_cnn_mlp_micro", "transformer_lm_micro", "nfm_transformer_lm_micro",
            "nfm_gan_resnet_micro"]
CASES = [(name, {}) for name in FAMILIES] + [(name, {"attention_backend": "flex"})
                                             for name in ("nac_micro", "ni_micro", "vit_micro")]


def _output(out):
    return out if torch.is_tensor(out) else out[0]


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides", CASES, ids=[n + "".join(f"-{v}" for v in o.values()) for n, o in CASES])
def test_one_graph_no_recompile_and_eager_outputs(name, overrides):
    torch.manual_seed(0)
    model = modwire.create_model(name, **overrides)
    # the eager outputs: the model itself, or (flex) an SDPA twin with its weights, since eager FlexAttention
    # compiles graphs of its own (tests/nn/test_flex_attention.py checks that the two backends agree)
    eager_model = model if not overrides else modwire.create_model(name)
    dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def eager(x, kw):
        eager_model.load_state_dict(model.state_dict())
        return _output(eager_model.train(model.training)(x, **kw))
    model.eval()
    x, kw = make_inputs(model.config, seed=0)
    with torch.no_grad():
        expected = eager(x, kw)                         # an eager call first (NAC's former cache broke this)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(_output(compiled(x, **kw)), expected, atol=1e-4, rtol=1e-4)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(20):                              # parameters change at every step
        x, kw = make_inputs(model.config, seed=step)
        opt.zero_grad()
        _output(compiled(x, **kw)).float().square().mean().backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        x, kw = make_inputs(model.config, seed=99)
        torch.testing.assert_close(_output(compiled(x, **kw)), eager(x, kw), atol=1e-4, rtol=1e-4)
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])
    assert counters["stats"]["unique_graphs"] == 2            # one eval graph, one train graph


@pytest.mark.slow
@pytest.mark.parametrize("kw", [{}, {"rescale": "nearest"}])
def test_an_nfm_reading_gathered_sources_compiles_to_one_graph(kw):
    """Sizes 9 → 5 → 5 → 3 → vector: every read between unequal grids is gathered (modwire.nn.nfm_read),
    the path the micro presets (power-of-2 ratios, all views) do not take."""
    from modwire.nn import NFM
    from tests.nn.test_nfm_reader_plans import conv_blocks

    torch.manual_seed(0)
    m = NFM(conv_blocks(), channels=[3, 4, 6, 6, 5], k=3, d_k=4, d_v=3, num_heads=2, **kw)
    dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    for step in range(3):
        x = torch.randn(2, 3, 9, 9, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(compiled(x), m(x), atol=1e-5, rtol=1e-5)
        compiled(x).square().mean().backward()
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])


def test_every_model_method_has_its_own_code():
    """Dynamo keeps compiled graphs per code object, at most ``recompile_limit`` (8) per code. Every
    model's ``forward`` (wrapped by models/base.py for its output dtype) has its own code, so compiling
    one model never counts against another's limit (issue 39: with one shared code, the fifth family
    compiled in one process failed under fullgraph=True)."""
    from modwire.models.base import MODEL_TYPES

    codes = [cls.__dict__[n].__code__ for cls in MODEL_TYPES.values()
             for n in ("forward", "forward_record", "forward_head") if n in cls.__dict__]
    assert len({id(c) for c in codes}) == len(codes) > 10


@pytest.mark.slow
def test_compiling_one_model_leaves_another_its_recompile_limit():
    """The same, end to end: with a limit of 1, two models compile, one graph each."""
    dynamo.reset()
    with dynamo.config.patch(recompile_limit=1), torch.no_grad():
        for name in ("perceiver_io_micro", "vit_micro"):
            torch.manual_seed(0)
            model = modwire.create_model(name).eval()
            x, kw = make_inputs(model.config)
            torch.compile(model, fullgraph=True, backend="eager")(x, **kw)


# ------------------------------------------------------------------ the model's own inductor options

def test_a_model_holding_an_nfm_compiles_on_the_cpu_with_layout_optimization_off_and_no_other_sets_options():
    """docs/speed.md: inductor's layout optimization made the compiled NFM pairs slower than eager."""
    nfm = [n for n in FAMILIES if n.startswith("nfm_")]
    for name in FAMILIES:
        options = modwire.create_model(name).compile_options()
        assert options == ({"layout_optimization": False} if name in nfm else {}), name
    assert modwire.create_model("nfm_cnn_mlp_micro").to("meta").compile_options() == {}   # not on the CPU: unmeasured


def test_compile_kwargs_turn_a_mode_into_its_options_and_keep_the_callers_own():
    from torch._inductor import list_mode_options

    nfm, vit = modwire.create_model("nfm_cnn_mlp_micro"), modwire.create_model("vit_micro")
    assert vit.compile_kwargs(mode="max-autotune", fullgraph=True) == {"mode": "max-autotune", "fullgraph": True}
    got = nfm.compile_kwargs(mode="max-autotune", fullgraph=True)
    assert got == {"fullgraph": True, "options": {**list_mode_options("max-autotune"), "layout_optimization": False}}
    assert nfm.compile_kwargs(options={"layout_optimization": True})["options"] == {"layout_optimization": True}
    assert nfm.compile_kwargs(mode="default") == {"options": {"layout_optimization": False}}
    assert nfm.compile_kwargs(mode="no-such-mode") == {"mode": "no-such-mode"}     # torch's own error names the modes
    assert nfm.compile_kwargs(backend="aot_eager") == {"backend": "aot_eager"}      # not inductor: no options
    assert nfm.compile_kwargs(backend=None) == {"backend": None, "options": {"layout_optimization": False}}
    torch.compiler.set_default_backend("aot_eager")          # a user's own default: it gets no inductor options
    try:
        assert nfm.compile_kwargs(fullgraph=True) == {"fullgraph": True}
        assert nfm.compile_kwargs(backend=None) == {"backend": None}
        assert nfm.compile_kwargs(backend="inductor")["options"] == {"layout_optimization": False}
    finally:
        torch.compiler.set_default_backend(None)
    with pytest.raises(TypeError, match=r"options must be a dict of inductor settings, got str 'max-autotune'"):
        nfm.compile(options="max-autotune")


def test_module_compile_and_the_training_harness_pass_the_models_options(monkeypatch):
    from modwire.training.precision import compile_net

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, *a, **kw: seen.append(kw) or fn)
    nfm = modwire.create_model("nfm_cnn_mlp_micro")
    nfm.compile(fullgraph=True)
    compile_net(nfm, "reduce-overhead", nfm)
    compile_net(nfm, False, nfm)                                                     # off: not compiled
    vit = modwire.create_model("vit_micro")
    compile_net(vit, True, vit)
    assert seen == [{"fullgraph": True, "options": {"layout_optimization": False}},
                    {"options": {"triton.cudagraphs": True, "layout_optimization": False}},
                    {"mode": "default"}]


@pytest.mark.slow
def test_an_nfm_compiled_by_inductor_with_its_options_gives_the_eager_outputs():
    torch.manual_seed(0)
    model = modwire.create_model("nfm_cnn_mlp_micro").eval()
    x, kw = make_inputs(model.config, 4)
    dynamo.reset()
    compiled = torch.compile(model, **model.compile_kwargs(fullgraph=True))
    with torch.no_grad():
        torch.testing.assert_close(_output(compiled(x, **kw)), _output(model(x, **kw)), rtol=1e-4, atol=1e-5)
