"""The run-kind table (``modwire.training.kinds``): the trainer, the config check, resume, eval,
finetune and analyze ask it, so a family that trains differently is its own module plus one row.

The last tests add a throwaway kind here, in the test file alone (a denoiser trained to reconstruct
its input, scored by its own measure), and run it through ``modwire train`` / ``--resume`` / ``eval`` /
``finetune`` / ``analyze`` with nothing in the library naming it."""
import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pytest
import torch
from torch import Tensor, nn

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire import cli
from modwire.errors import UserError
from modwire.models import list_models
from modwire.models.base import MODEL_TYPES, PretrainedModel
from modwire.models.capabilities import Adversarial
from modwire.models.config import ModelConfig
from modwire.models.registry import get_preset, register_preset
from modwire.training import kinds, load_config, train
from modwire.training.kinds import RunKind, kind_of_preset, register_kind
from modwire.training.optim import build_optimizer, build_scheduler
from modwire.training.run import TrainingRun
from modwire.training.state import TrainState


def test_each_preset_has_the_kind_of_its_declared_capability():
    assert list(kinds.RUN_KINDS) == ["adversarial", "supervised"]
    for name in list_models():
        adversarial = issubclass(get_preset(name)[0], Adversarial)
        assert kind_of_preset(name).name == ("adversarial" if adversarial else "supervised"), name
    assert kind_of_preset("no_such_model").name == "supervised"          # the trainer names the unknown model


@pytest.mark.parametrize("key", ["nonfinite=skip", "data.bad_samples=skip", "ema_decay=0.5", "epochs=3",
                                 "aux_loss_weights.x=1.0", "optim.label_smoothing=0.1", "data.num_workers=0"])
def test_a_key_a_gan_run_does_not_read_is_refused_by_name(key):
    with pytest.raises(UserError, match=f"config key '{key.split('=')[0]}': got .* a GAN run .* does not read it"):
        load_config(None, ["model.name=gan_resnet_micro", "max_steps=2", key])
    load_config(None, ["model.name=gan_resnet_micro", "max_steps=2", "nonfinite=stop", "optim.lr=1e-3"])   # defaults pass


def test_another_kinds_section_is_refused():
    with pytest.raises(UserError, match=r"config key 'gan.n_dis': the gan.\* settings apply to GAN runs only; "
                                        r"model 'nac_micro' trains as a supervised run"):
        load_config(None, ["model.name=nac_micro", "gan.n_dis=3"])


def test_resume_allows_each_kinds_harmless_keys():
    assert "gan.eval.every" in kinds.harmless_keys() and "max_steps" in kinds.harmless_keys()
    assert "optim.lr" not in kinds.harmless_keys()


# ----------------------------------------------------------------------------- a throwaway sixth kind

@runtime_checkable
class Denoises(Protocol):
    """The toy capability: ``noisy(x, generator)``."""

    def noisy(self, x: Tensor, generator: torch.Generator) -> Tensor: ...


@dataclass
class ToyDenoiserConfig(ModelConfig):
    model_type = "toy_denoiser"
    dim: int = 8

    @property
    def num_classes(self) -> int:
        return 0


class ToyDenoiser(PretrainedModel):
    config_class = ToyDenoiserConfig

    def __init__(self, config: ToyDenoiserConfig) -> None:
        super().__init__()
        self.config = config
        self.net = nn.Linear(config.dim, config.dim)

    def noisy(self, x: Tensor, generator: torch.Generator) -> Tensor:
        return x + 0.1 * torch.randn(x.shape, generator=generator)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


@dataclass
class Reconstruction:
    """The toy kind's Program: one SGD step on ``‖f(x + ε) − x‖²`` for a batch drawn from ``(seed, step)``."""

    best_metric: tuple[str, bool] = ("mse", True)

    def batch(self, seed: int, step: int) -> tuple[Tensor, Tensor]:
        g = torch.Generator().manual_seed(seed * 100003 + step)
        x = torch.randn(16, 8, generator=g)
        return ToyDenoiser.noisy(None, x, g), x

    def step(self, run: TrainingRun, state: TrainState) -> dict[str, Tensor]:
        noisy, x = self.batch(run.cfg.seed, state.step)
        loss = (state.model(noisy) - x).square().mean()
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.scheduler.step()
        state.step += 1
        state.val_pending = state.step >= run.total
        return {"loss": loss.detach()}

    def evaluate(self, run: TrainingRun, state: TrainState, stop) -> dict[str, float]:
        noisy, x = self.batch(run.cfg.seed, -1)
        with torch.no_grad():
            return {"mse": float((state.model(noisy) - x).square().mean())}

    def summary(self, run: TrainingRun, state: TrainState) -> dict[str, str]:
        return {"data": "synthetic vectors", "steps": f"{run.total} reconstruction steps"}

    def log_fields(self) -> dict[str, Any]:
        return {}


def build_reconstruction_run(cfg, dist_info, run_dir, overrides=None):
    torch.manual_seed(cfg.seed)
    model = ToyDenoiser(ToyDenoiserConfig())
    optimizer = build_optimizer(model, cfg.optim)
    state = TrainState(model, optimizer, build_scheduler(optimizer, cfg.max_steps, cfg.optim),
                       torch.amp.GradScaler("cpu", enabled=False))
    return TrainingRun(cfg, dist_info, run_dir, Reconstruction(), cfg.max_steps), state


RECONSTRUCTION = RunKind("reconstruction", Denoises, model_overrides=lambda cfg: {},
                         build_run=build_reconstruction_run,
                         reads=("model", "seed", "out_dir", "device", "max_steps", "log_every", "progress", "optim"),
                         score=lambda run_dir, overrides: {"run": str(run_dir), "reconstruction": "scored"},
                         scores="its reconstructions", task_outputs=False,
                         instead="What applies to a reconstruction run: modwire eval RUN.")


@pytest.fixture
def toy_kind(monkeypatch):
    """The toy model, preset and kind, registered for one test (the tables are restored afterwards)."""
    from modwire.models import registry

    monkeypatch.setattr(registry, "_PRESETS", dict(registry._PRESETS))
    monkeypatch.setitem(MODEL_TYPES, "toy_denoiser", ToyDenoiser)     # the one table loading reads
    monkeypatch.setattr(kinds, "RUN_KINDS", dict(kinds.RUN_KINDS))
    register_preset("toy_denoiser_micro", ToyDenoiser, ToyDenoiserConfig, "test model of a sixth run kind")
    register_kind(RECONSTRUCTION)
    return ["model.name=toy_denoiser_micro", "max_steps=4", "progress=false", "log_every=1",
            "optim.name=sgd", "optim.betas=[0.0, 0.0]", "optim.lr=0.1", "optim.weight_decay=0", "optim.grad_clip=0", "optim.schedule=constant"]


def test_a_sixth_kind_trains_resumes_and_is_scored_through_the_table_alone(toy_kind, tmp_path, capsys):
    run = tmp_path / "run"
    straight = train(load_config(None, [*toy_kind, f"out_dir={tmp_path / 'straight'}"]))
    stopped = train(load_config(None, [*toy_kind, "max_steps=2", f"out_dir={run}"]))
    assert stopped["step"] == 2
    resumed = train(load_config(None, [*toy_kind, f"out_dir={run}"]), resume=True, allow_change=["max_steps"])
    assert resumed["step"] == 4 and resumed["val"]["mse"] == straight["val"]["mse"]
    torch.testing.assert_close(resumed["model"].net.weight, straight["model"].net.weight, rtol=0, atol=0)
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1 and first["loss"] > 0
    assert cli.main(["eval", str(run)]) == 0                                   # its kind's score
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["reconstruction"] == "scored"
    assert cli.main(["eval", str(run), "--split", "val"]) == 2
    assert "is a reconstruction run: eval scores its reconstructions, --split does not apply" in capsys.readouterr().err
    assert cli.main(["finetune", str(run), "--task", "toy_sets"]) == 2
    assert "no task outputs to fine-tune. What applies to a reconstruction run" in capsys.readouterr().err
    assert cli.main(["analyze", str(run), "--no-plots"]) == 0                 # no task: no task metrics
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    assert summary["metrics"] is None and summary["analyses"] == []
    assert "a reconstruction has no task metrics: modwire eval" in capsys.readouterr().out


def test_a_sixth_kind_refuses_what_it_does_not_read(toy_kind):
    with pytest.raises(UserError, match="config key 'ema_decay': got 0.9, but a reconstruction run .* does not read"):
        load_config(None, [*toy_kind, "ema_decay=0.9"])
    with pytest.raises(UserError, match=r"config key 'gan.n_dis': the gan.\* settings apply to GAN runs only"):
        load_config(None, [*toy_kind, "gan.n_dis=2"])
