"""Evaluation options are config fields and are type-checked as such (issue 24: one config system;
``--set model.overrides.eval_memory_forward=banana`` used to be taken as True)."""
import pytest

import modwire
from modwire.errors import UserError
from modwire.models.capabilities import EvalOptions

CASES = [("ait_micro", "eval_memory_forward", "eval_memory_forward"),
         ("nfm_preact_resnet_micro", "random_attention", "nfm.random_attention"),
         ("nfm_transformer_lm_micro", "random_attention", "nfm.random_attention"),
         ("nfm_cnn_mlp_micro", "random_attention", "random_attention"),
         ("nfm_gan_resnet_micro", "random_attention", "nfm.random_attention")]


@pytest.mark.parametrize("name,option,field", CASES, ids=[c[0] for c in CASES])
def test_an_eval_option_of_the_wrong_type_is_refused_and_a_bool_is_applied(name, option, field):
    model = modwire.create_model(name)
    assert isinstance(model, EvalOptions) and option in model.eval_options
    with pytest.raises(UserError, match=rf"config field '{field}': got 'banana' \(str\), expected bool"):
        model.set_eval_options(**{option: "banana"})
    default = model.config.eval_memory_forward if option == "eval_memory_forward" else False
    model.set_eval_options(**{option: not default})
    value = model.config
    for part in field.split("."):
        value = getattr(value, part)
    assert value is (not default)
