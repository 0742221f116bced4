"""``from_pretrained`` builds on the meta device and assigns the saved tensors: it samples
no initial weights, and the loaded model equals the saved one bit for bit (buffers,
``requires_grad`` flags and outputs included)."""
import pytest
import torch
from torch import nn

import modwire
import modwire.nn.init as init_module
from modwire.analysis.sparsify import eliminate_edges
from modwire.models.base import _load


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


def test_a_buffer_outside_the_state_dict_falls_back_to_a_normal_build():
    saved = _WithUnsavedBuffer()
    loaded = _load(_WithUnsavedBuffer, None, saved.state_dict(), "memory", "cpu")
    assert torch.equal(loaded.table, torch.arange(4.0))
    _equal_state(saved, loaded)


def test_loading_keeps_the_models_dtype(tmp_path):
    model = modwire.create_model("perceiver_io_micro")
    half = {k: v.half() for k, v in model.state_dict().items()}
    loaded = _load(type(model), model.config, half, "memory", "cpu")
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    torch.testing.assert_close(loaded.state_dict()["latents"], model.state_dict()["latents"].half().float())
