"""Task parameters go through the one config system (modwire.fields): each task's
``TaskInfo.param_bounds`` / ``param_choices`` are checked by ``TaskInfo.merged_params``, so
``describe_task`` (which the trainer calls before it touches the run directory) refuses a bad
value with the task, the key, the value and what is allowed, before any data is read."""
import numpy as np
import pytest

from modwire.errors import UnknownNameError, UserError, UserTypeError
from modwire.fields import Bounds, Choices, check_mapping
from modwire.tasks import build_dataset, describe_task, get_task
from modwire.tasks.base import InputSpec, TaskInfo

NOWHERE = "/nonexistent/modwire-task-params"       # a loader would fail on it: the check comes first

BAD = [  # task, params, the whole message after "task '<task>': "
    ("digits", {"size": 12},
     r"parameter 'size': got 12, expected an integer >= 8 and a multiple of 8 \(the images are 8x8\)"),
    ("oxford_pet", {"root": NOWHERE, "image_size": 0}, r"parameter 'image_size': got 0, expected an integer >= 1"),
    ("oxford_pet", {"root": NOWHERE, "resize": "squash"},
     r"parameter 'resize': got 'squash', expected one of \['center_crop', 'stretch'\]"),
    ("image_folder", {"root": NOWHERE, "channels": 2},
     r"parameter 'channels': got 2, expected one of \[1, 3\] \(1: grayscale, 3: RGB\)"),
    ("imagenet", {"root": NOWHERE, "image_size": -3}, r"parameter 'image_size': got -3, expected an integer >= 1"),
    ("wikitext2", {"root": NOWHERE, "seq_len": 0}, r"parameter 'seq_len': got 0, expected an integer >= 1"),
    ("wikitext2", {"root": NOWHERE, "min_count": -1}, r"parameter 'min_count': got -1, expected an integer >= 1"),
    ("mnist", {"root": NOWHERE, "upsample_to": 0},
     r"parameter 'upsample_to': got 0, expected an integer >= 1 \(or None: pad to pad_to instead\)"),
    ("kmnist", {"root": NOWHERE, "channels": 2}, r"parameter 'channels': got 2, expected one of \[1, 3\]"),
    ("mnist_m", {"root": NOWHERE, "size": 0}, r"parameter 'size': got 0, expected an integer >= 1"),
    ("pgm", {"root": NOWHERE, "panel_size": 161},
     r"parameter 'panel_size': got 161, expected an integer in \[1, 160\] \(the files' panels are 160x160"),
    ("imdb_bytes", {"root": NOWHERE, "max_len": 0}, r"parameter 'max_len': got 0, expected an integer >= 1"),
    ("nlvr2_features", {"root": NOWHERE, "text_dim": 0}, r"parameter 'text_dim': got 0, expected an integer >= 1"),
    ("modelnet40", {"root": NOWHERE, "num_points": 0}, r"parameter 'num_points': got 0, expected an integer >= 1"),
    ("modelnet40", {"root": NOWHERE, "pick": "last"},
     r"parameter 'pick': got 'last', expected one of \['first', 'random'\]"),
    ("listops", {"max_depth": 0}, r"parameter 'max_depth': got 0, expected an integer >= 1"),
    ("listops", {"min_len": -1}, r"parameter 'min_len': got -1, expected an integer >= 0"),
    ("triangle", {"near_equilateral_ratio": 0.5},
     r"parameter 'near_equilateral_ratio': got 0.5, expected a finite number >= 1"),
    ("triangle", {"min_side": 31.0}, r"parameter 'min_side': got 31.0, expected a finite number in \[0, 30\] \(px\)"),
    ("triangle", {"seed": -1}, r"parameter 'seed': got -1, expected an integer >= 0"),
    ("sort_of_clevr", {"patch_size": 4},
     r"parameter 'patch_size': got 4, expected one of \[1, 3, 5, 15, 25, 75\] \(the divisors of the image side 75\)"),
    ("sort_of_clevr_image", {"holdout": 7}, r"parameter 'holdout': got 7, expected an integer in \[0, 6\] \(held-out"),
    ("multi_digit", {"digit_size": 2}, r"parameter 'digit_size': got 2, expected an integer in \[4, 1024\]"),
    ("fuzzy_boolean", {"layout": "pairs"}, r"parameter 'layout': got 'pairs', expected one of \['sample', 'pair'\]"),
    ("fuzzy_boolean_adapt", {"function_seed": -2}, r"parameter 'function_seed': got -2, expected an integer >= 0"),
    ("digits_multitask_offline", {"size": -1}, r"parameter 'size': got -1, expected an integer >= 0"),
]


@pytest.mark.parametrize("task, params, message", BAD, ids=[f"{t}-{next(iter(p.keys() - {'root'}))}"
                                                              for t, p, _ in BAD])
def test_describe_task_refuses_a_bad_value_before_reading_data(task, params, message):
    with pytest.raises(UserError, match=rf"^task '{task}': {message}"):
        describe_task(task, params)


def test_build_dataset_checks_the_same_tables():
    with pytest.raises(UserError, match=r"^task 'digits': parameter 'size': got 20, expected an integer >= 8 and a "
                                        r"multiple of 8 \(the images are 8x8\)$"):
        build_dataset("digits", "train", size=20)
    with pytest.raises(UserError, match=r"^task 'mnist': parameter 'channels': got 2"):
        build_dataset("mnist", "train", root=NOWHERE, channels=2)       # not the missing root


@pytest.mark.parametrize("task, name, params", [
    ("digits", "size", {}), ("pgm", "panel_size", {"root": NOWHERE}), ("wikitext2", "seq_len", {"root": NOWHERE}),
    ("sort_of_clevr", "holdout", {}), ("triangle", "seed", {}), ("listops", "max_depth", {}),
])
def test_a_bool_or_a_float_for_an_int_parameter_is_refused(task, name, params):
    for bad, kind in ((True, "bool"), (16.0, "float")):
        with pytest.raises(UserTypeError, match=rf"^task '{task}': parameter '{name}': got {bad!r} \({kind}\), "
                                                rf"expected an int like its default"):
            describe_task(task, {**params, name: bad})


@pytest.mark.parametrize("bad", [True, 32.0, "32"])
def test_a_parameter_with_a_none_default_is_checked_by_its_integer_bounds(bad):
    """``upsample_to`` (default None) has no type from its default: ``Bounds(integer=True)`` refuses them."""
    with pytest.raises(UserError, match=rf"^task 'mnist': parameter 'upsample_to': got {bad!r}, expected an integer >= 1"):
        describe_task("mnist", {"root": NOWHERE, "upsample_to": bad})
    for bad_size in (bad, 2.5, -1):
        with pytest.raises(UserError, match=rf"^task 'triangle': parameter 'size': got {bad_size!r}, expected an integer"):
            describe_task("triangle", {"size": bad_size})


def test_each_element_of_a_list_or_mapping_parameter_is_checked():
    with pytest.raises(UserError, match=r"^task 'fuzzy_boolean': parameter 'function_ids\[2\]': got 30, expected an "
                                        r"integer in \[0, 30\) \(ids of the family's functions\)"):
        describe_task("fuzzy_boolean", {"function_ids": [0, 1, 30]})
    with pytest.raises(UserError, match=r"parameter 'function_ids\[0\]': got True, expected an integer in \[0, 30\)"):
        describe_task("fuzzy_boolean", {"function_ids": [True, 2]})
    with pytest.raises(UserError, match=r"^task 'digits_multitask': parameter 'sources\[1\]': got 'mnistm', expected "
                                        r"one of \['svhn', 'mnist_m', 'mnist'\]"):
        describe_task("digits_multitask", {"sources": ["svhn", "mnistm"]})
    with pytest.raises(UserError, match=r"^task 'listops': parameter 'size.val': got -2, expected an integer >= 0"):
        describe_task("listops", {"size": {"train": 8, "val": -2}})
    with pytest.raises(UserError, match=r"^task 'sort_of_clevr': parameter 'size.test': got 1.5, expected an integer"):
        build_dataset("sort_of_clevr", "train", size={"train": 1, "test": 1.5})


def test_good_values_pass():
    assert describe_task("digits", {"size": 16}).inputs == InputSpec.image(1, 16, 16)
    assert describe_task("mnist", {"root": NOWHERE, "upsample_to": 32, "channels": 3}).inputs == \
        InputSpec.image(3, 32, 32)
    assert describe_task("mnist", {"root": NOWHERE, "upsample_to": None}).inputs == InputSpec.image(1, 32, 32)
    assert describe_task("pgm", {"root": NOWHERE, "panel_size": 160}).inputs == InputSpec.image(16, 160, 160)
    assert describe_task("sort_of_clevr", {"patch_size": 15, "holdout": 6}).inputs.length == 25
    assert describe_task("fuzzy_boolean", {"function_ids": [0, 29], "layout": "sample"}).heads == 2
    assert describe_task("multi_digit", {"image_size": 8, "digit_size": 4}).inputs == InputSpec.image(1, 8, 8)
    assert describe_task("oxford_pet", {"root": NOWHERE, "image_size": 1, "resize": "center_crop"}).inputs == \
        InputSpec.image(3, 1, 1)
    assert len(build_dataset("triangle", "train", size={"train": np.int64(3)}, seed=0)) == 3   # a numpy count too
    assert len(build_dataset("sort_of_clevr", "train", size=1, holdout=0)) == 20
    params = get_task("listops").merged_params({"size": 4, "min_len": 0, "max_depth": 1})
    assert (params["size"], params["min_len"], params["max_depth"]) == (4, 0, 1)


def test_checks_between_parameters_stay_in_the_task():
    with pytest.raises(UserError, match=r"digit_size 40 exceeds image_size 32"):
        build_dataset("multi_digit", "train", size=1, image_size=32, digit_size=40)
    with pytest.raises(UserError, match=r"function_ids must be distinct ids in \[0, 30\), got \[1, 1\]"):
        describe_task("fuzzy_boolean", {"function_ids": [1, 1]})


def test_the_tables_are_checked_at_registration():
    spec = InputSpec.vectors(2, 3)
    with pytest.raises(UnknownNameError, match=r"task 't': param_bounds / param_choices name \['sise'\], which are "
                                               r"not parameters.*Did you mean \['size'\]"):
        TaskInfo("t", "generator", "", 2, spec, params={"size": 8}, param_bounds={"sise": Bounds(lo=1)})
    with pytest.raises(UserError, match=r"^task 't': parameter 'mode': got 'c', expected one of \['a', 'b'\]"):
        TaskInfo("t", "generator", "", 2, spec, params={"mode": "c"}, param_choices={"mode": ("a", "b")})
    info = TaskInfo("t", "generator", "", 2, spec, params={"n": 4, "lo": 1},
                    param_bounds={"n": Bounds(lo="lo", integer=True)})   # a sibling parameter as the bound
    with pytest.raises(UserError, match=r"^task 't': parameter 'n': got 2, expected an integer >= lo=3$"):
        info.merged_params({"n": 2, "lo": 3})


def test_fields_helpers():
    assert Bounds(lo=1, integer=True).holds(np.int32(3)) and not Bounds(lo=1, integer=True).holds(3.0)
    assert not Bounds(lo=0, integer=True).holds(True) and Bounds(lo=0).holds(3.0)          # the default is unchanged
    assert Bounds(lo=1, integer=True).describe() == "an integer >= 1"
    check_mapping({"k": [1, 2], "m": None}, bounds={"k": Bounds(lo=1), "m": Bounds(lo=1)})
    with pytest.raises(UserError, match=r"^key 'k\[1\]': got 0, expected an integer >= 1$"):
        check_mapping({"k": [1, 0]}, bounds={"k": Bounds(lo=1)})
    choices = Choices(("x", "y"), note="why")
    assert choices == ("x", "y") and choices.note == "why"
    with pytest.raises(UserError, match=r"^p 'c': got 'z', expected one of \['x', 'y'\] \(why\)$"):
        check_mapping({"c": "z"}, choices={"c": choices}, label="p")
    import copy
    import pickle
    assert pickle.loads(pickle.dumps(choices)).note == "why" and copy.deepcopy(choices).note == "why"
