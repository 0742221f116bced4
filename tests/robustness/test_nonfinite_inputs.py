"""Issue 26, items 6 and 8: non-finite inputs, and finite ones large enough to overflow float32 inside a
model, are a clear error naming the input, not a silently non-finite output; NFM's random-attention
ablation on a model without NFM readers is refused."""
import sys
from pathlib import Path

import pytest
import torch

import modwire
from modwire.errors import UserError
from modwire.nn.checks import MAX_ABS_INPUT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_contract import make_inputs  # noqa: E402


def _spoil(t, value):
    t = t.clone()
    t.view(-1)[3] = value
    return t


@pytest.mark.parametrize("name,argument", [("nfm_cnn_mlp_micro", "question"), ("nfm_cnn_mlp_micro", "x"),
                                           ("preact_resnet_micro", "x"), ("nfm_preact_resnet_micro", "x"),
                                           ("gan_resnet_micro", "x"), ("nfm_gan_resnet_micro", "x")])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_input_is_a_clear_error(name, argument, value):
    model = modwire.create_model(name).eval()
    x, kw = make_inputs(model.config, seed=0)
    if argument == "x":
        x = _spoil(x, value)
    else:
        kw[argument] = _spoil(kw[argument], value)
    shown = "z" if model.config.model_type == "gan" else argument
    bad = "NaN" if value != value else "inf"
    with pytest.raises(UserError, match=rf"^{shown}: expected finite values, got {bad}"):
        model(x, **kw)


def test_the_gan_generator_checks_its_latents():
    gan = modwire.create_model("gan_resnet_micro")
    z, _ = make_inputs(gan.config, seed=0)
    assert torch.isfinite(gan.generator(z)).all()
    with pytest.raises(UserError, match=r"^z: expected finite values, got NaN"):
        gan.generator(_spoil(z, float("nan")))


@pytest.mark.parametrize("name", ["nac_micro", "perceiver_io_micro", "ni_micro", "vit_micro", "ait_micro"])
def test_inputs_that_would_overflow_float32_are_refused_and_smaller_ones_are_finite(name):
    model = modwire.create_model(name).eval()
    x, kw = make_inputs(model.config, seed=0)
    x = x / x.abs().max()                                    # max |x| = 1
    with torch.no_grad():
        assert torch.isfinite(model(x * MAX_ABS_INPUT, **kw)).all()            # the largest accepted: finite
        with pytest.raises(UserError, match=r"expected values of magnitude up to 1e\+18, got .*overflow float32"):
            model(x * 1e22, **kw)
        from modwire.nn import checks
        limit, checks.MAX_ABS_INPUT = checks.MAX_ABS_INPUT, float("inf")
        try:                                                 # why the limit: unchecked, 1e22 overflows
            assert not torch.isfinite(model(x * 1e22, **kw)).all()
        finally:
            checks.MAX_ABS_INPUT = limit


@pytest.mark.parametrize("name", ["transformer_lm_micro", "preact_resnet_micro", "gan_resnet_micro"])
def test_random_attention_without_nfm_is_refused(name):
    """Issue 26, item 8: the §4.4 ablation on a model without readers was accepted (the LM) and did nothing."""
    with pytest.raises(UserError, match=r"'nfm.random_attention'.*needs NFM readers.*nfm.enabled is false"):
        modwire.create_model(name, nfm={"random_attention": True})
    with pytest.raises(UserError, match=r"'nfm.random_attention'.*needs NFM readers"):
        modwire.create_model(name).set_eval_options(random_attention=True)


def test_nfm_refuses_an_empty_batch_and_batch_one_vector_states_in_training():
    """Issue 26, item 8: both were a raw RuntimeError / BatchNorm ValueError from deep inside."""
    from torch import nn

    from modwire.nn.nfm import NFM

    m = NFM([nn.Linear(8, 8), nn.Linear(8, 8)], channels=[8, 8, 8], k=2, passes=2).train()
    with pytest.raises(UserError, match=r"NFM: expected the input x as a non-empty batch \[B, C, \*spatial\]"):
        m(torch.randn(0, 8))
    with pytest.raises(UserError, match=r"BatchNorm .* needs more than one value per channel in training; got "
                                        r"batch 1 of vector states \[1, 8\]: train with a batch >= 2, or .*norm='none'"):
        m(torch.randn(1, 8))
    assert torch.isfinite(m(torch.randn(2, 8))).all()
    m.eval()
    assert m(torch.randn(1, 8)).shape == (1, 8)                     # evaluation uses running statistics
    assert NFM([nn.Linear(8, 8)], channels=[8, 8], k=2, passes=2, norm="none").train()(torch.randn(1, 8)).shape == (1, 8)
