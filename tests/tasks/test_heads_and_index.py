"""The task → model interface of NI (issue 11): ``InputSpec.index`` and ``TaskInfo.heads``."""
import pytest
import torch

from modwire.models import get_config
from modwire.models.inputs import InputSpec, example_inputs
from modwire.tasks import TaskInfo, describe_task


def test_index_spec_shape_example_and_repr():
    spec = InputSpec.index(3)
    assert spec.kind == "index" and spec.vocab_size == 3 and spec.shape == ()
    x = spec.example(50, seed=1)
    assert x.dtype == torch.long and x.shape == (50,) and set(x.tolist()) == {0, 1, 2}
    assert torch.equal(x, spec.example(50, seed=1)) and repr(spec) == "InputSpec.index(vocab_size=3)"
    both = example_inputs({"x": InputSpec.image(3, 8, 8), "task": spec}, 4)
    assert both["x"].shape == (4, 3, 8, 8) and both["task"].shape == (4,)


def test_heads_default_given_and_described():
    plain = TaskInfo("t", "generator", "", 2, InputSpec.vectors(6, 8))
    assert plain.heads == 1 and plain.resolve().heads == 1
    assert TaskInfo("t", "generator", "", 2, InputSpec.vectors(6, 8), heads=4).heads == 4
    described = TaskInfo("t", "generator", "", describe=lambda p: (InputSpec.vectors(5, 1), 1, len(p["ids"])),
                         params={"ids": (1, 2, 3)})
    assert described.heads == 3 and described.resolve({"ids": (7,)}).heads == 1
    two = TaskInfo("t", "generator", "", describe=lambda p: (InputSpec.vectors(5, 1), 1), heads=2)
    assert two.heads == 2 and two.resolve().heads == 2   # a describe without heads keeps the field


def test_single_readout_models_accept_one_head():
    spec = InputSpec.vectors(5, 1, ordered=True)
    for preset in ("nac_micro", "perceiver_io_micro"):
        cfg = get_config(preset)
        assert cfg.for_inputs(spec, 1) == cfg.for_inputs(spec, 1, heads=1)
        assert cfg.for_inputs(spec, 1).num_classes == 1
    assert describe_task("mnist").heads == 1
