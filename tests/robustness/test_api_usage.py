"""The Python API called the way a user guesses it: wrong argument types are a TypeError
that says what to pass, not an AttributeError from inside the trainer or a misparsed string."""
import pytest

from modwire.training import load_config, train


@pytest.mark.parametrize("cfg", [{"model": {"name": "nac_micro"}}, "configs/cpu/nac_triangle.yaml", None])
def test_train_needs_a_train_config(cfg):
    with pytest.raises(TypeError, match=r"train: expected a TrainConfig from modwire.training.load_config"):
        train(cfg)


@pytest.mark.parametrize("overrides", ["max_steps=3", {"max_steps": 3}, [3]])
def test_load_config_overrides_must_be_a_list_of_strings(overrides):
    with pytest.raises(TypeError, match=r"overrides: expected a list of 'key=value' strings"):
        load_config(None, overrides)


def test_load_config_overrides_as_a_tuple_still_apply():
    assert load_config(None, ("max_steps=3",)).max_steps == 3
