"""Issue 25: every model family compiles with ``torch.compile(fullgraph=True)`` in train and eval mode,
traces one graph and never recompiles over 20 optimizer steps at fixed shapes (also after an eager
call under ``torch.no_grad``: no cache keyed on parameter identity), and the compiled model gives
the eager model's outputs. Dynamo's capture (graph breaks, guards, recompiles) does not depend on the
backend, so the test compiles with ``aot_eager`` (dynamo + AOT autograd, no inductor code generation:
seconds instead of minutes); the speed of inductor's code is ``benchmarks/``' business."""
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


def _output(out):
    return out if torch.is_tensor(out) else out[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_one_graph_no_recompile_and_eager_outputs(name):
    torch.manual_seed(0)
    model = modwire.create_model(name)
    dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model.eval()
    x, kw = make_inputs(model.config, seed=0)
    with torch.no_grad():
        eager = _output(model(x, **kw))                 # an eager call first (NAC's former cache broke this)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(_output(compiled(x, **kw)), eager, atol=1e-4, rtol=1e-4)
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
        torch.testing.assert_close(_output(compiled(x, **kw)), _output(model(x, **kw)), atol=1e-4, rtol=1e-4)
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])
    assert counters["stats"]["unique_graphs"] == 2            # one eval graph, one train graph


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
