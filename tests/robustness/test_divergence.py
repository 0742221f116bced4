"""Issue 26, item 3: a run whose loss or gradients become non-finite stops with a clear error and a
non-zero exit, keeps its last finite checkpoint as ``last`` and ``best`` and records the step; with
``nonfinite: skip`` such steps are skipped and counted instead. Item 8: an empty validation split and
a model whose heads do not fit the task's targets are clear errors."""
import json
import os

import pytest
import torch

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire import cli, from_pretrained
from modwire.training import load_config, train
from modwire.training.divergence import TrainingDiverged


def cfg(out, *extra):
    return load_config(None, [f"out_dir={out}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                              "epochs=3", "optim.lr=3e-3", "progress=false", "log_every=1", *extra])


@pytest.fixture
def poison_at_step(monkeypatch):
    """The task loss of optimizer step ``n`` (0-based) becomes NaN, as a diverging run's would."""
    from modwire.training import objective as trainer     # the task loss of every training step

    real, calls = trainer.compute_loss, []

    def arm(n):
        def loss(*a, **k):
            calls.append(1)
            value = real(*a, **k)
            return value * float("nan") if len(calls) == n + 1 else value
        monkeypatch.setattr(trainer, "compute_loss", loss)
    return arm


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_diverging_run_stops_keeping_its_last_finite_checkpoint(tmp_path, poison_at_step):
    run = tmp_path / "run"
    poison_at_step(6)                                      # step 7 of 12; epochs end at steps 4, 8, 12
    with pytest.raises(TrainingDiverged, match=r"training diverged: the loss or a gradient was not finite .* at step "
                                               r"6; .*the last finite checkpoint \(step 4\) is kept"):
        train(cfg(run))
    assert os.readlink(run / "checkpoints" / "last") == "last-00000004"
    assert os.readlink(run / "checkpoints" / "best").startswith("best-0000000")
    for tag in ("last", "best"):
        model = from_pretrained(run / "checkpoints" / tag)
        assert all(torch.isfinite(p).all() for p in model.parameters())
    last = _records(run)[-1]
    assert last["event"] == "diverged" and last["first_nonfinite_step"] == 6 and last["kept_checkpoint_step"] == 4
    assert all(r["step"] <= 7 for r in _records(run))      # the diverged step was logged at most once


def test_the_cli_exits_1_with_the_message(tmp_path, poison_at_step, capsys):
    poison_at_step(2)
    config = tmp_path / "c.yaml"
    config.write_text(f"out_dir: {tmp_path / 'run'}\nmodel: {{name: nac_micro}}\ndata: {{task: toy_sets, batch_size: 16}}\n"
                      f"epochs: 2\nprogress: false\nlog_every: 1\n")
    assert cli.main(["train", str(config)]) == 1
    err = capsys.readouterr().err
    assert "modwire train: error: training diverged" in err and "no checkpoint was written before it" in err
    assert "Traceback" not in err


def test_skip_mode_skips_the_step_and_counts_it(tmp_path, poison_at_step):
    poison_at_step(5)
    out = train(cfg(tmp_path / "run", "nonfinite=skip"))
    assert out["status"] == "finished" and out["step"] == 12
    assert all(torch.isfinite(p).all() for p in out["model"].parameters())
    skipped = [r.get("skipped_steps", 0) for r in _records(tmp_path / "run") if "loss" in r]
    assert skipped[:5] == [0] * 5 and skipped[5:] == [1] * 7


def test_an_unknown_nonfinite_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"nonfinite.*'ignore'.*stop.*skip"):
        cfg(tmp_path / "run", "nonfinite=ignore")


class _NoVal(toy_task.ToySets):
    def __init__(self, split, **params):
        super().__init__(split, **params)
        self.size = 0 if split == "val" else self.size


def test_an_empty_validation_split_is_refused_before_training(tmp_path):
    """Issue 26, item 8: found before the first step, not after the first epoch."""
    from modwire.tasks import InputSpec, TaskInfo, get_task, register_task

    try:
        get_task("toy_sets_no_val")
    except KeyError:
        register_task(TaskInfo("toy_sets_no_val", "generator", "toy_sets with an empty val split", 2,
                               InputSpec.vectors(6, 8), params={"size": 64, "seed": 0, "delay": 0.0}), _NoVal)
    with pytest.raises(ValueError, match=r"'data.val_split': the 'val' split of task 'toy_sets_no_val' is empty"):
        train(cfg(tmp_path / "run", "data.task=toy_sets_no_val"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_model_whose_heads_do_not_fit_the_task_layout_is_a_clear_error(tmp_path):
    """Issue 26, item 8: NI's 20 fuzzy-Boolean heads on the one-target 'pair' layout (was a RuntimeError)."""
    c = load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=ni_fuzzy_boolean", "data.task=fuzzy_boolean",
                           "data.params.layout=pair", "data.params.size=64", "max_steps=1", "progress=false"])
    with pytest.raises(ValueError, match=r"task 'fuzzy_boolean' gives \(1,\) regression target.*model outputs "
                                         r"\[\d+, 20\]: the model's heads do not match the task's layout"):
        train(c)


def test_fp16_overflowing_gradients_are_the_scalers_to_skip_not_a_divergence():
    """Found on an H200: an fp16 run with grad_clip stopped as 'diverged' at step 0, where the loss scaler's
    first scale (65536) overflows the gradients by design. The scaler skips that step and lowers its scale;
    the guard must not count it. (A CPU GradScaler stands in for CUDA's: the same unscale / found-inf logic.)"""
    from types import SimpleNamespace

    from modwire.training.divergence import NonFiniteGuard
    from modwire.training.state import TrainState
    from modwire.training.supervised import optimizer_step

    w = torch.nn.Parameter(torch.ones(3))
    model = torch.nn.Module()
    model.w = w
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    state = TrainState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), scaler)
    program = SimpleNamespace(micro_used=10, batches=None)
    run = SimpleNamespace(cfg=SimpleNamespace(optim=SimpleNamespace(grad_clip=1.0), precision="fp16"),
                          guard=NonFiniteGuard("stop"), program=program, total=10)
    scaler.scale(torch.zeros(()))                            # (what the backward's scaler.scale(loss) does first)
    w.grad = torch.full((3,), float("inf"))                  # an overflowed scaled gradient
    optimizer_step(run, state, torch.tensor(0.7))
    run.guard.check([w])                                     # no TrainingDiverged
    assert torch.equal(w.detach(), torch.ones(3)) and scaler.get_scale() == 2.0 ** 15   # skipped, scale halved
    w.grad = torch.full((3,), 2.0 ** 16)                     # a finite scaled gradient: the step is taken
    optimizer_step(run, state, torch.tensor(0.7))
    assert not torch.equal(w.detach(), torch.ones(3))
    run.guard.observe(2, torch.tensor(float("nan")), None)   # a non-finite loss is still a divergence
    with pytest.raises(TrainingDiverged, match="step 2"):
        run.guard.check()
