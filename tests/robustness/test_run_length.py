"""Issue 36, item 4: settings that count steps or samples, checked against the run before its first
step: one that cannot do what it says in this run warns (:class:`modwire.errors.ConfigWarning`, one
line from the command), naming the field, the run's length and what the run does instead."""
import re
import warnings

import pytest

import toy_task  # noqa: F401  (registers "toy_sets": 64 samples per split)
from modwire import cli
from modwire.errors import ConfigWarning
from modwire.training import load_config, train

# 64 training samples in batches of 16: 4 steps per epoch
BASE = ["model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16", "progress=false"]


def _train(out, *extra):
    return train(load_config(None, [*BASE, f"out_dir={out}", *extra]))


@pytest.mark.parametrize("extra,match", [
    (["optim.warmup_steps=1000", "max_steps=4"],
     r"'optim.warmup_steps': 1000, but the run has 4 optimizer steps in all: it ends still warming up"),
    (["optim.warmup_steps=8", "epochs=2"], r"'optim.warmup_steps': 8, but the run has 8 optimizer steps"),
    (["optim.schedule=step", "optim.milestones=[10,20]", "epochs=2"],
     r"'optim.milestones': \[10, 20\], but the run has 8 optimizer steps in all: the learning rate never steps"),
    (["keep_weights_every=5", "epochs=1"], r"'keep_weights_every': 5, but the run has 4 optimizer steps.*no weights"),
    (["max_steps=100"], r"'max_steps': 100 is beyond epochs=1 × 4 steps per epoch: the run stops after 4 steps"),
    (["optim.decay_steps=50"], r"'optim.decay_steps': 50 is beyond the run's 4 steps: the cosine decay stops"),
    (["log_every=20"], r"'log_every': 20 is beyond the run's 4 steps: metrics.jsonl gets the last step's"),
    (["checkpoint_every=10"], r"'checkpoint_every': 10 is beyond the run's 4 steps: checkpoints are written at "
                              r"epoch ends only"),
    (["data.max_samples=1000"], r"'data.max_samples': 1000 is more than the 'train' split's 64 samples: all of "
                                r"them are used"),
    (["optim.name=sgd", "optim.betas=[0.9,0.5]"], r"'optim.betas\[1\]': 0.5 is not read by this run \(optim.name is "
                                                   r"'sgd'\); only adamw and radam"),
])
def test_a_setting_the_run_cannot_honour_warns_before_the_first_step(tmp_path, extra, match, monkeypatch):
    from modwire.training import supervised as trainer

    steps = []
    real = trainer.optimizer_step
    monkeypatch.setattr(trainer, "optimizer_step", lambda run, state, *a: (steps.append(len(warned)), real(run, state, *a)))
    with pytest.warns(ConfigWarning, match=match) as warned:
        result = _train(tmp_path / "run", *extra)
    assert result["step"] in (4, 8) and steps[0] >= 1                 # warned before the first step


def test_a_warning_can_be_made_an_error_and_then_nothing_is_trained(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        with pytest.raises(ConfigWarning, match="optim.warmup_steps"):
            _train(tmp_path / "run", "optim.warmup_steps=1000")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_run_that_fits_its_settings_does_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        _train(tmp_path / "run", "epochs=2", "optim.warmup_steps=7", "log_every=8", "checkpoint_every=8",
               "keep_weights_every=8", "max_steps=8", "data.max_samples=64")


def test_the_command_shows_a_config_warning_on_one_line(tmp_path, capsys):
    assert cli.main(["train", "--set", *BASE, f"out_dir={tmp_path / 'run'}", "log_every=20"]) == 0
    err = capsys.readouterr().err
    assert "modwire: warning: config key 'log_every': 20 is beyond the run's 4 steps" in err
    assert "ConfigWarning" not in err and ".py:" not in err


def test_log_every_at_its_default_does_not_warn_in_a_short_run(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        assert _train(tmp_path / "run", "max_steps=2")["step"] == 2


@pytest.mark.parametrize("extra,match", [
    (["ema_decay=0.999"], r"'ema_decay': 0.999 averages over about 1000 steps, but the run has 4 optimizer steps"),
    (["optim.decay_steps=2", "optim.warmup_steps=3"],
     r"'optim.decay_steps': 2 is not after the warm-up's 3 steps: the learning rate drops to optim.min_lr"),
])
def test_an_ema_or_decay_that_cannot_act_in_the_run_warns(tmp_path, extra, match):
    with pytest.warns(ConfigWarning, match=match):
        _train(tmp_path / "run", *extra)


@pytest.mark.parametrize("extra,key", [(["optim.gamma=0.5"], "optim.gamma"),
                                       (["optim.decay_steps=10", "optim.schedule=linear"], "optim.decay_steps")])
def test_a_schedule_setting_the_schedule_does_not_use_is_refused(extra, key):
    from modwire.errors import UserError

    with pytest.raises(UserError, match=rf"config key '{key}': got .*, but it is used only by optim.schedule"):
        load_config(None, [*BASE, *extra])


@pytest.mark.parametrize("extra,notes", [
    (["optim.schedule=constant", "optim.min_lr=0"], [r"'optim.min_lr': 0.0 is not read by this run \(the schedule is "
                                                     r"'constant'\); only optim.schedule cosine or linear"]),
    (["optim.schedule=step", "optim.milestones=[3]", "optim.min_lr=0"], [r"'optim.min_lr'.*the schedule is 'step'"]),
    (["optim.warmup_lr=0"], [r"'optim.warmup_lr': 0.0 is not read by this run \(optim.warmup_steps is 0\); only a "
                             r"warm-up"]),
    (["optim.weight_decay=0", "optim.filter_bias_and_norm=false"],
     [r"'optim.filter_bias_and_norm': False is not read by this run \(optim.weight_decay is 0\); only weight decay"]),
    (["optim.name=sgd", "optim.betas=[0.8,0.9]", "optim.warmup_lr=0", "optim.schedule=constant", "optim.min_lr=0"],
     [r"'optim.min_lr'", r"'optim.warmup_lr'", r"'optim.betas\[1\]': 0.9"]),
    # each read where it is set, or left at its default: nothing to say
    (["optim.min_lr=0", "optim.warmup_lr=0", "optim.warmup_steps=2", "optim.schedule=linear", "optim.betas=[0.8,0.9]",
      "optim.filter_bias_and_norm=false"], []),
    (["optim.name=sgd", "optim.betas=[0.5,0.999]", "optim.weight_decay=0", "optim.schedule=constant"], []),
])
def test_optimizer_settings_this_optimizer_and_schedule_never_read_are_named(extra, notes):
    from modwire.training.config import unread_optim_notes

    got = unread_optim_notes(load_config(None, [*BASE, *extra]).optim)
    assert len(got) == len(notes)
    for note, match in zip(got, notes):
        assert re.search(match, note), note
