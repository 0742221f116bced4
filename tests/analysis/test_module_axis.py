"""The per-module axis protocol: models describe their modules (``module_axis()``) and
``modwire.analysis`` uses that description instead of checking the model's class."""
import dataclasses

import pytest
import torch
from torch import nn

import modwire
from modwire.analysis import drop_modules, eliminate_edges, module_importance
from modwire.analysis.sparsify import module_axis, set_edge_mask
from modwire.models import ModuleAxis


def test_nac_and_perceiver_io_describe_their_axis():
    nac = modwire.create_model("nac_micro")
    assert nac.module_axis() == ModuleAxis(
        "modules", 12, "num_processor_modules", ("generator.processors.signatures", "generator.processors.codes"),
        link_probs=True)
    no_kernel = modwire.create_model("nac_micro", kernel={"enabled": False}).module_axis()
    assert no_kernel.tensors == ("generator.processors.codes",) and not no_kernel.link_probs
    cond = modwire.create_model("nac_conditional_micro").module_axis()
    assert cond.fixed and "per sample" in cond.fixed and not cond.link_probs and cond.tensors == ()
    pio = modwire.create_model("perceiver_io_micro")
    assert pio.module_axis() == ModuleAxis("latents", 12, "num_latents", ("latents",))
    for model in (nac, pio):                                     # the tensors exist, modules on dim 0
        axis = model.module_axis()
        assert all(model.get_parameter(n).shape[0] == axis.size for n in axis.tensors)


@dataclasses.dataclass
class _ToyConfig:
    num_slots: int = 6
    dim: int = 4
    model_type = "toy"

    def replace(self, **overrides):
        return dataclasses.replace(self, **overrides)


class _Toy(nn.Module):
    """Not a NAC nor a PerceiverIO: a set of slots read out by a shared linear layer."""

    def __init__(self, config: _ToyConfig, declare=("slots",)):
        super().__init__()
        self.config, self.declare = config, declare
        self.slots = nn.Parameter(torch.randn(config.num_slots, config.dim))
        self.gate = nn.Parameter(torch.ones(config.num_slots))
        self.proj = nn.Linear(config.dim, 3)

    def forward(self, x):                                         # x [B, 3]
        return x + self.proj(self.slots * self.gate[:, None]).sum(0)

    def module_axis(self) -> ModuleAxis:
        return ModuleAxis("slots", self.config.num_slots, "num_slots", self.declare)


class _ToyFull(_Toy):
    def __init__(self, config: _ToyConfig):
        super().__init__(config, declare=("slots", "gate"))


def test_any_model_that_describes_its_axis_can_be_pruned():
    toy = _ToyFull(_ToyConfig())
    small = drop_modules(toy, 2, order=[0, 5])
    assert small.config.num_slots == 4 and toy.config.num_slots == 6
    assert torch.equal(small.slots, toy.slots[1:5]) and torch.equal(small.gate, toy.gate[1:5])
    x = torch.randn(2, 3)
    expected = x + toy.proj(toy.slots[1:5]).sum(0)
    torch.testing.assert_close(small(x), expected)
    with pytest.raises(TypeError, match="link probabilities"):  # no P over its slots
        module_importance(toy)
    with pytest.raises(ValueError, match="edge masks need"):
        set_edge_mask(toy, torch.ones(6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="eliminate_edges needs"):
        eliminate_edges(toy, 0.5)


def test_an_incomplete_description_is_caught():
    """A model that forgets a per-module tensor is refused, naming the tensors that depend on U."""
    toy = _Toy(_ToyConfig())                                      # declares "slots" but not "gate"
    with pytest.raises(RuntimeError, match=r"\['gate', 'slots'\]"):
        drop_modules(toy, 2)


def test_a_model_without_a_description_gets_a_clear_error():
    with pytest.raises(TypeError, match="module_axis"):
        drop_modules(nn.Linear(3, 3), 1)
    with pytest.raises(TypeError, match="module_axis"):
        module_axis(nn.Linear(3, 3))


def test_a_conditional_nac_says_why_its_modules_cannot_be_dropped():
    with pytest.raises(ValueError, match="per sample"):
        drop_modules(modwire.create_model("nac_conditional_micro"), 1)
