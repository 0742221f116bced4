"""``from_pretrained`` builds on the meta device and assigns the saved tensors: it samples
no initial weights, and the loaded model equals the saved one bit for bit (buffers,
``requires_grad`` flags and outputs included)."""
import pytest
import torch
from torch import nn

import modwire
import modwire.nn.init as init_module
from modwire.analysis.sparsify import eliminate_edges
from modwire.models.base import load_model


def _equal_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key
    assert [(n, p.requires_grad) for n, p in a.named_parameters()] == \
           [(n, p.requires_grad) for n, p in b.named_parameters()]
    assert not any(t.is_meta for t in (*b.parameters(), *b.buffers()))


@pytest.mark.parametrize("name,overrides", [
    ("nac_micro", {}), ("perceiver_io_micro", {}), ("nac_conditional_micro", {}),
    ("nac_micro", {"kernel": {"learn_epsilon": False}}),                       # log ε a buffer
    ("nac_micro", {"frozen_graph": {"name": "erdos_renyi", "seed": 3}}),          # frozen signatures
    ("nac_micro", {"graph_prior": {"name": "ring_of_cliques", "params": {"num_cliques": 3}}}),  # App. A
])
def test_loaded_model_is_the_saved_one_and_nothing_is_sampled(tmp_path, monkeypatch, name, overrides):
    torch.manual_seed(0)
    model = modwire.create_model(name, **overrides).eval()
    model.save_pretrained(tmp_path)

    normal_ = torch.Tensor.normal_

    def refuse(tensor, *args, **kwargs):   # sampling into a meta tensor costs nothing
        if not tensor.is_meta:
            raise AssertionError("from_pretrained sampled initial weights")
        return normal_(tensor, *args, **kwargs)

    monkeypatch.setattr(init_module, "_resample_outliers", refuse)
    monkeypatch.setattr(torch.Tensor, "normal_", refuse)
    loaded = modwire.from_pretrained(tmp_path).eval()
    again = type(model).from_pretrained(tmp_path).eval()
    monkeypatch.undo()
    _equal_state(model, loaded)
    _equal_state(model, again)
    x = torch.randn(2, 5, 8)
    kwargs = {"condition": torch.randint(0, 7, (2, 4))} if "conditional" in name else {}
    with torch.no_grad():
        assert torch.equal(loaded(x, **kwargs), model(x, **kwargs))
    if hasattr(model, "auxiliary_losses"):                    # train mode works too (graph prior: L_graph)
        model.train(), loaded.train()
        torch.manual_seed(1)
        model(x, **kwargs)
        torch.manual_seed(1)
        loaded(x, **kwargs)
        aux, aux_loaded = model.auxiliary_losses(), loaded.auxiliary_losses()
        assert aux.keys() == aux_loaded.keys() and all(torch.equal(aux[k], aux_loaded[k]) for k in aux)


def test_a_sparsified_nac_reloads_with_its_edge_mask(tmp_path):
    torch.manual_seed(0)
    model, mask = eliminate_edges(modwire.create_model("nac_micro").eval(), 0.5)
    assert not mask.all()
    model.save_pretrained(tmp_path)
    loaded = modwire.from_pretrained(tmp_path)
    _equal_state(model, loaded)
    assert type(loaded.propagator_kernel) is type(model.propagator_kernel)


class _WithUnsavedBuffer(nn.Module):
    """A module with a buffer outside the state dict: loading must not leave it on meta."""

    legacy_state_keys = ()

    def __init__(self, config=None):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("table", torch.arange(4.0), persistent=False)

    def prepare_state_dict(self, state):
        pass


class _WithTensorAttribute(_WithUnsavedBuffer):
    def __init__(self, config=None):
        super().__init__(config)
        self.inner = nn.Sequential(nn.Linear(2, 2))
        self.inner[0].scale = torch.full((2,), 3.0)      # neither parameter nor buffer


@pytest.mark.parametrize("cls", [_WithUnsavedBuffer, _WithTensorAttribute])
def test_a_tensor_outside_the_state_dict_falls_back_to_a_normal_build(cls):
    saved = cls()
    loaded = load_model(cls, None, saved.state_dict(), "memory", "cpu")
    assert torch.equal(loaded.table, torch.arange(4.0))
    if cls is _WithTensorAttribute:
        assert torch.equal(loaded.inner[0].scale, torch.full((2,), 3.0))
    _equal_state(saved, loaded)


def test_loading_keeps_the_models_dtype(tmp_path):
    model = modwire.create_model("perceiver_io_micro")
    half = {k: v.half() for k, v in model.state_dict().items()}
    loaded = load_model(type(model), model.config, half, "memory", "cpu")
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    torch.testing.assert_close(loaded.state_dict()["latents"], model.state_dict()["latents"].half().float())
