"""Models saved by modwire v0.1 (flat ``config.json``, v0.1 state-dict names) load into the
current models and give the logits v0.1 recorded for them (``tests/fixtures/legacy_v0_1``)."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import modwire
from modwire.analysis.sparsify import get_edge_mask
from modwire.models import NACConfig, PerceiverIOConfig
from modwire.nn import EdgeMaskedKernel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "legacy_v0_1"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text())
SAVED = ["nac_micro", "perceiver_io_micro", "nac_micro_edges"]


def raw_config(name):
    return json.loads((FIXTURES / name / "config.json").read_text())


def test_reference_covers_every_fixture():
    assert sorted(REFERENCE["logits"]) == sorted(SAVED) == sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", SAVED)
def test_v0_1_weights_give_the_recorded_logits(name):
    model = modwire.from_pretrained(FIXTURES / name).eval()
    x = torch.tensor(REFERENCE["input"])
    assert list(x.shape) == REFERENCE["input_shape"]
    with torch.no_grad():
        logits = model(x)
    torch.testing.assert_close(logits, torch.tensor(REFERENCE["logits"][name]), atol=1e-5, rtol=0)
    again = type(model).from_pretrained(FIXTURES / name).eval()   # through the class, too
    with torch.no_grad():
        torch.testing.assert_close(again(x), logits, atol=0, rtol=0)


def test_edge_eliminated_v0_1_model_comes_back_with_its_edge_mask():
    model = modwire.from_pretrained(FIXTURES / "nac_micro_edges").eval()
    saved = load_file(str(FIXTURES / "nac_micro_edges" / "model.safetensors"))["edge_mask"].bool()
    assert not saved.all() and saved.diagonal().all()          # the fixture really eliminated edges
    assert isinstance(model.propagator_kernel, EdgeMaskedKernel)
    assert torch.equal(get_edge_mask(model), saved)
    with torch.no_grad():
        p = model.link_probs()
    assert (p[~saved] == 0).all() and (p[saved] > 0).all()      # eliminated links are reported as 0
    inter = model.forward_intermediates(torch.tensor(REFERENCE["input"]))
    for w in inter.propagator_attention:                        # and carry no attention
        assert (w[..., ~saved] == 0).all()
    assert get_edge_mask(modwire.from_pretrained(FIXTURES / "nac_micro")) is None


@pytest.mark.parametrize("name", ["nac_micro", "nac_micro_edges"])
def test_flat_v0_1_nac_config_maps_onto_the_nested_config(name):
    raw = raw_config(name)
    cfg = modwire.from_pretrained(FIXTURES / name).config
    assert isinstance(cfg, NACConfig) and NACConfig.from_dict(raw) == cfg
    assert cfg.tokenizer.kind == raw["tokenizer"] == "linear"
    for key in ("image_size", "in_channels", "conv_channels", "pos_dim", "input_dim", "vocab_size", "token_dim",
                "max_len", "pad_id"):
        assert getattr(cfg.tokenizer, key) == raw[key], key
    assert cfg.kernel.enabled is raw["use_kernel"] is True
    for key in ("tau", "epsilon", "learn_epsilon", "delta", "truncation"):
        assert getattr(cfg.kernel, key) == raw[key], key
    assert cfg.kernel.train_mode == raw["kernel_train_mode"] and cfg.kernel.eval_mode == raw["kernel_eval_mode"]
    assert cfg.frozen_graph.name == raw["frozen_graph"] is None
    assert cfg.frozen_graph.params == raw["frozen_graph_params"] and cfg.frozen_graph.seed == raw["frozen_graph_seed"]
    for key in ("num_classes", "d_model", "num_layers", "num_processor_modules", "num_output_modules", "num_heads",
                "read_in_heads", "read_out_heads", "ffn_hidden", "activation", "d_sig", "d_code", "initial_state",
                "modulation", "alpha_init"):
        assert getattr(cfg, key) == raw[key], key
    assert cfg.generator.kind == "unconditional"                # v0.1 had no conditional generator
    # it is the preset it was saved from (the edge-eliminated one was saved with a truncation)
    assert cfg == modwire.get_config("nac_micro", truncation=raw["truncation"])


def test_flat_v0_1_perceiver_io_config_maps_onto_the_renamed_fields():
    raw = raw_config("perceiver_io_micro")
    cfg = modwire.from_pretrained(FIXTURES / "perceiver_io_micro").config
    assert isinstance(cfg, PerceiverIOConfig) and PerceiverIOConfig.from_dict(raw) == cfg
    assert cfg.read_in_heads == raw["cross_heads"] and cfg.read_out_heads == raw["output_heads"]
    assert cfg.num_output_modules == raw["num_output_queries"]
    assert cfg.tokenizer.kind == raw["tokenizer"] == "linear"
    assert (cfg.tokenizer.input_dim, cfg.tokenizer.token_dim) == (raw["input_dim"], raw["token_dim"])
    for key in ("num_classes", "d_model", "num_layers", "num_latents", "num_heads", "ffn_hidden", "activation"):
        assert getattr(cfg, key) == raw[key], key
    assert cfg == modwire.get_config("perceiver_io_micro")


@pytest.mark.parametrize("name", SAVED)
def test_a_v0_1_model_saved_again_writes_the_current_format(name, tmp_path):
    model = modwire.from_pretrained(FIXTURES / name).eval()
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert "tokenizer" in data and isinstance(data["tokenizer"], dict)   # nested now
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(model.state_dict())
    again = modwire.from_pretrained(tmp_path).eval()
    assert again.config == model.config
    x = torch.tensor(REFERENCE["input"])
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), atol=0, rtol=0)
