"""Auxiliary losses: a model reports them, the config weighs them, the trainer adds and logs
them with no model-specific code. This toy model is unknown to the trainer."""
import json
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor, nn

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire.models import list_models
from modwire.models.base import PretrainedModel
from modwire.models.config import ModelConfig
from modwire.models.tokenizer_config import TokenizerConfig, build_tokenizer, single_input
from modwire.models.registry import register_model_type, register_preset
from modwire.training import load_config, train


@dataclass
class ToyAuxConfig(ModelConfig):
    model_type = "toy_aux"
    num_classes: int = 2
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(kind="linear", input_dim=8,
                                                                                token_dim=16))

    def input_overrides(self, inputs, num_classes: int, heads: int = 1) -> dict:
        return {"tokenizer": TokenizerConfig.for_input(single_input(inputs, self.model_type)),
                "num_classes": num_classes}


class ToyAux(PretrainedModel):
    """Mean-pooled tokens → logits; reports ``{"l2": ‖W‖²}`` of its head from each training forward."""

    config_class = ToyAuxConfig

    def __init__(self, config: ToyAuxConfig) -> None:
        super().__init__()
        self.config = config
        self.tokenizer = build_tokenizer(config.tokenizer)
        self.head = nn.Linear(config.tokenizer.token_dim, config.num_classes)
        self._aux: dict[str, Tensor] = {}

    def forward(self, x: Tensor) -> Tensor:
        self._aux = {"l2": self.head.weight.square().sum()} if self.training else {}
        return self.head(self.tokenizer(x).mean(1))

    def auxiliary_losses(self) -> dict[str, Tensor]:
        return dict(self._aux)


@pytest.fixture(autouse=True)
def toy_aux_registered(monkeypatch):
    """Registered for these tests only (the registry's tables are restored afterwards)."""
    from modwire.models import registry

    monkeypatch.setattr(registry, "_PRESETS", dict(registry._PRESETS))
    monkeypatch.setattr(registry, "_MODEL_TYPES", dict(registry._MODEL_TYPES))
    register_model_type(ToyAux)
    register_preset("toy_aux_micro", ToyAux, ToyAuxConfig, "test model with an auxiliary loss")
    assert "toy_aux_micro" in list_models()


def cfg(out, *extra):
    return load_config(None, [f"out_dir={out}", "model.name=toy_aux_micro", "data.task=toy_sets", "data.batch_size=16",
                              "max_steps=1", "optim.name=sgd", "optim.betas=[0.0, 0.0]", "optim.grad_clip=0",
                              "optim.weight_decay=0", "optim.lr=0.5", "progress=false", "log_every=1", *extra])


@pytest.mark.parametrize("accum", [1, 4])
def test_a_new_aux_loss_is_weighted_added_scaled_and_logged(tmp_path, accum):
    """One SGD step: head.weight moves by lr·(task gradient + w·2W), with or without accumulation."""
    torch.manual_seed(0)
    w0 = ToyAux(ToyAuxConfig()).head.weight.detach().clone()    # what train() builds with seed 0
    a = train(cfg(tmp_path / "a", "aux_loss_weights.l2=3.0", f"grad_accum={accum}"))["model"]
    b = train(cfg(tmp_path / "b", "aux_loss_weights.l2=0.0", f"grad_accum={accum}"))["model"]
    torch.testing.assert_close(b.head.weight - a.head.weight, 0.5 * 3.0 * 2 * w0, rtol=1e-5, atol=1e-6)
    record = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["aux/l2"] == pytest.approx(w0.square().sum().item(), rel=1e-6)


def test_a_reported_loss_without_a_weight_names_the_key_to_set(tmp_path):
    with pytest.raises(ValueError, match=r"reports the auxiliary loss\(es\) \['l2'\].*aux_loss_weights.l2"):
        train(cfg(tmp_path))


@pytest.mark.parametrize("bad", ["nan", "-1", "inf"])
def test_an_aux_loss_weight_must_be_finite_and_non_negative(tmp_path, bad):
    with pytest.raises(ValueError, match=r"config key 'aux_loss_weights.l2': got .*expected a finite number >= 0"):
        cfg(tmp_path, f"aux_loss_weights.l2={bad}")
