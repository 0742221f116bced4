"""The one declarative config mechanism (modwire.fields): ``bounds`` / ``choices`` tables on a
dataclass, checked by one function for model configs, training configs alike; close-match hints
for unknown names (model config fields, task parameters, training config keys)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from modwire.errors import UnknownNameError, UserError, UserTypeError
from modwire.fields import (COUNT, NON_NEGATIVE, POSITIVE, UNIT, Bounds, check_fields, check_tree, declared_rules,
                            did_you_mean)


@dataclass
class Inner:
    rate: float = 0.5

    bounds: ClassVar[dict[str, Bounds]] = {"rate": UNIT}


@dataclass
class Toy:
    size: int = 8
    heads: int = 2
    lr: float = 1e-3
    pad: int = -1
    mode: str = "a"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    weights: dict[str, float] = field(default_factory=lambda: {"graph": 1.0})
    inner: Inner = field(default_factory=Inner)

    bounds: ClassVar[dict[str, Bounds]] = {
        "size": COUNT, "heads": Bounds(lo=1, divides="size"), "lr": POSITIVE,
        "pad": Bounds(lo=-1, hi="size", hi_open=True, note="-1: none"), "betas": UNIT, "weights": NON_NEGATIVE}
    choices: ClassVar[dict[str, tuple]] = {"mode": ("a", "b")}


def _error(obj, **kw) -> str:
    with pytest.raises(UserError) as info:
        check_tree(obj, **kw)
    return str(info.value)


def test_a_valid_instance_passes():
    check_tree(Toy())
    check_fields(Toy(pad=7, heads=8, betas=[0, 0.5], weights={}))


def test_scalar_bounds_name_the_key_the_value_and_the_range():
    assert _error(Toy(lr=-1.0)) == "config key 'lr': got -1.0, expected a finite number > 0"
    assert _error(Toy(size=0), prefix="model.") == "config key 'model.size': got 0, expected an integer >= 1"
    assert _error(Toy(lr=math.nan)) == "config key 'lr': got nan, expected a finite number > 0"   # NaN refused
    assert "got inf" in _error(Toy(lr=math.inf))
    assert _error(Toy(size=-2), label="config field").startswith("config field 'size': got -2")


def test_bounds_apply_to_each_list_element_and_dict_value():
    assert _error(Toy(betas=[0.9, 1.0]), prefix="optim.") == \
        "config key 'optim.betas[1]': got 1.0, expected a finite number in [0, 1)"
    assert _error(Toy(weights={"graph": 1.0, "balance": -2.0})) == \
        "config key 'weights.balance': got -2.0, expected a finite number >= 0"


def test_sibling_field_bounds():
    assert _error(Toy(pad=8)) == "config key 'pad': got 8, expected an integer in [-1, size=8) (-1: none)"
    assert _error(Toy(heads=3)) == "config key 'heads': got 3, expected an integer >= 1 that divides size=8"


def test_choices_and_the_sub_dataclasses():
    assert _error(Toy(mode="c")) == "config key 'mode': got 'c', expected one of ['a', 'b']"
    assert _error(Toy(inner=Inner(rate=2.0)), prefix="x.") == \
        "config key 'x.inner.rate': got 2.0, expected a finite number in [0, 1)"


def test_declared_rules_list_every_key_with_a_star_for_containers():
    rules = declared_rules(Toy)
    assert set(rules) == {"size", "heads", "lr", "pad", "betas.*", "weights.*", "inner.rate"}
    assert rules["inner.rate"] is UNIT and declared_rules(Toy, "choices") == {"mode": ("a", "b")}


def test_did_you_mean():
    assert did_you_mean("lrr", ["lr", "epochs"]) == " Did you mean ['lr']?"
    assert did_you_mean(["num_modules"], ["num_processor_modules", "d_model"]) == \
        " Did you mean ['num_processor_modules']?"
    assert did_you_mean("zzz", ["lr"]) == ""


# ----------------------------------------------------------------------------- the three users


def test_a_model_config_goes_through_the_shared_checker():
    from modwire.models import get_config

    with pytest.raises(UserError, match=r"^config field 'kernel.tau': got -1.0, expected a finite number > 0$"):
        get_config("nac_micro", kernel={"tau": -1.0})
    with pytest.raises(UserError, match=r"config field 'tokenizer.kind': got 'patches', expected one of "
                                        r"\['conv', 'linear', 'embedding'\]"):
        get_config("nac_micro", tokenizer={"kind": "patches"})
    with pytest.raises(UnknownNameError, match=r"\['num_layer'\].*valid fields.*Did you mean \['num_layers'"):
        get_config("nac_micro", num_layer=2)


def test_a_training_config_goes_through_the_shared_checker():
    from modwire.training.config import load_config

    with pytest.raises(UserError, match=r"^config key 'optim.lr': got -1.0, expected a finite number > 0$"):
        load_config(None, ["optim.lr=-1"])
    with pytest.raises(UserError, match=r"config key 'aux_loss_weights.graph': got -1.0"):
        load_config(None, ["aux_loss_weights={graph: -1}"])
    with pytest.raises(UserError, match=r"config key 'data.mixup': got 'cutmix', expected one of"):
        load_config(None, ["data.mixup=cutmix"])


def test_a_task_parameter_is_type_checked_and_unknown_names_get_a_hint():
    from modwire.tasks import build_dataset, get_task

    with pytest.raises(UserTypeError, match=r"task 'triangle': parameter 'min_side': got 'x' \(str\), expected a "
                                            r"number \(int or float\) like its default 8.0"):
        build_dataset("triangle", "train", min_side="x")          # not a TypeError from deep inside the task
    with pytest.raises(UserTypeError, match=r"task 'triangle': parameter 'seed': got '3' \(str\), expected an int "
                                            r"like its default 0"):
        build_dataset("triangle", "train", seed="3")              # a parameter with a table rule: the type error
    with pytest.raises(UserTypeError, match=r"parameter 'min_side': got True \(bool\), expected a number"):
        get_task("triangle").merged_params({"min_side": True})
    assert get_task("triangle").merged_params({"min_side": 8})["min_side"] == 8        # an int is a float too
    with pytest.raises(UnknownNameError, match=r"unknown parameter\(s\) \['sed'\].*Did you mean \['seed'"):
        get_task("triangle").merged_params({"sed": 1})


def test_check_argument_returns_a_valid_choice_and_names_the_argument_and_the_choices():
    from modwire.fields import check_argument

    assert check_argument("layout", "pair", ("sample", "pair")) == "pair"
    with pytest.raises(UserError, match=r"^NFM: rescale must be one of \['a', 'b'\], got 'c'$"):
        check_argument("rescale", "c", ("a", "b"), "NFM")
    with pytest.raises(UserError, match=r"^modulation must be one of \['none'\], got 1$"):
        check_argument("modulation", 1, ("none",))


def test_choices_or_import_takes_its_values_and_import_paths_of_callables_and_imports_without_calling():
    import copy
    import pickle

    from modwire.fields import ChoicesOrImport, check_table, import_object, is_import_path

    allowed = ChoicesOrImport(("a", "b"), note="why")
    assert "a" in allowed and "os.path:join" in allowed and "c" not in allowed and "a:b:c" not in allowed
    assert [is_import_path(v) for v in ("pkg.mod:f", "pkg:Cls.make", "pkg:", ":f", "pkg mod:f", 3)] == \
        [True, True, False, False, False, False]
    assert import_object("os.path:join") is __import__("os").path.join
    for clone in (copy.deepcopy(allowed), pickle.loads(pickle.dumps(allowed))):
        assert type(clone) is ChoicesOrImport and clone.note == "why" and "os:getcwd" in clone

    @dataclass
    class Holder:
        how: str = "a"
        choices: ClassVar[dict[str, tuple]] = {"how": allowed}

    check_table(Holder("os:getcwd"), choices=Holder.choices)
    with pytest.raises(UserError, match=r"config key 'how': got 'os:sep', which names a str, expected an import "
                                        r"path 'package.module:attribute' naming a callable"):
        check_table(Holder("os:sep"), choices=Holder.choices)
    with pytest.raises(UserError, match=r"config key 'how': got 'c', expected one of \['a', 'b'\] or an import path "
                                        r"'package.module:attribute' \(why\)"):
        check_table(Holder("c"), choices=Holder.choices)
