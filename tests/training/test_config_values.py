"""``load_config(..., values=...)``: settings given as data (what code passes, e.g. the studies of
modwire.experiments) go through the same schema and validation as ``--set`` strings, and give the
same config; their errors name the key."""
from pathlib import Path

import pytest

from modwire.errors import UserError, UserTypeError
from modwire.training.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "cpu" / "nfm_multi_digit.yaml")


def test_values_give_the_config_their_override_strings_give(tmp_path):
    values = {"optim.lr": 1e-3, "data": {"batch_size": 8}, "out_dir": tmp_path / "run", "seed": 3,
              "data.params": {"size": 64}, "model.overrides": {"n_modules": 4}, "progress": False}
    strings = ["optim.lr=0.001", "data.batch_size=8", f"out_dir={tmp_path / 'run'}", "seed=3",
               "data.params={size: 64}", "model.overrides={n_modules: 4}", "progress=false"]
    got = load_config(CONFIG, values=values)
    assert got == load_config(CONFIG, strings)
    assert got.optim.lr == 1e-3 and got.out_dir == str(tmp_path / "run") and got.data.params["size"] == 64
    assert got.data.params["counts"] == load_config(CONFIG).data.params["counts"]      # merged, not replaced


def test_a_key_ending_in_a_colon_replaces_the_subtree_as_the_replace_override_does():
    got = load_config(CONFIG, values={"data.params:": {"size": 16}, "optim:": {"lr": 0.5}})
    assert got == load_config(CONFIG, ["data.params:={size: 16}", "optim:={lr: 0.5}"])
    assert got.data.params == {"size": 16} and got.optim.lr == 0.5
    assert got.optim.name == load_config(None).optim.name           # a typed section restarts from its defaults


def test_overrides_apply_after_the_values():
    got = load_config(CONFIG, ["optim.lr=0.5"], values={"optim.lr": 1e-3, "max_steps": 7})
    assert (got.optim.lr, got.max_steps) == (0.5, 7)


@pytest.mark.parametrize("values, error, needle", [
    ({"optim.lrr": 1e-3}, ConfigError, "config value 'optim.lrr': key 'optim.lrr': Key 'lrr' not in"),
    ({"optim.lr": "fast"}, ConfigError, "config value 'optim.lr': key 'optim.lr': Value 'fast'"),
    ({"optim": 3}, ConfigError, "config value 'optim'"),
    ({"max_steps": -3}, UserError, "config key 'max_steps': got -3, expected an integer >= 0"),
    ({"base": "other.yaml"}, ConfigError, "config value 'base': expected a config key ('base:' is read from"),
    ({":": 1}, ConfigError, "config value ':': expected a config key"),
    ({"data.params:": 3}, ConfigError, "config value 'data.params:'"),
    (["max_steps=3"], UserTypeError, "values: expected a mapping of config keys"),
    ({"": 1}, UserTypeError, "values: expected a mapping of config keys"),
])
def test_bad_values_name_the_key(values, error, needle):
    with pytest.raises(error) as e:
        load_config(None, values=values)
    assert needle in str(e.value)
