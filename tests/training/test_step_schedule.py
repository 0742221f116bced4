"""The step learning-rate schedule of Verma et al. 2019 (NFM Table 2's procedure: SGD lr 0.1, × 0.1 at
epochs 500, 1000 and 1500 of 2000)."""
import pytest

from modwire.training import load_config
from modwire.training.optim import lr_at


def test_step_schedule_multiplies_by_gamma_at_each_milestone():
    c = load_config(None, ["optim.lr=0.1", "optim.schedule=step", "optim.milestones=[500,1000,1500]",
                           "optim.gamma=0.1", "optim.min_lr=0"]).optim
    got = [lr_at(s, 2000, c) for s in (0, 499, 500, 999, 1000, 1500, 1999)]
    assert got == pytest.approx([0.1, 0.1, 0.01, 0.01, 1e-3, 1e-4, 1e-4])


def test_step_schedule_after_warmup():
    c = load_config(None, ["optim.lr=1.0", "optim.schedule=step", "optim.milestones=[20]", "optim.warmup_steps=10",
                           "optim.warmup_lr=0", "optim.min_lr=0", "optim.gamma=0.5"]).optim
    assert [lr_at(s, 30, c) for s in (0, 5, 10, 19, 20, 29)] == pytest.approx([0, 0.5, 1, 1, 0.5, 0.5])


@pytest.mark.parametrize("override, match", [
    ("optim.schedule=exponential", r"'optim.schedule': got 'exponential', expected one of \['cosine', 'linear', "
                                   r"'constant', 'step'\]"),
    ("optim.milestones=[10,-5]", r"'optim.milestones\[1\]': got -5"),
    ("optim.gamma=0", r"'optim.gamma': got 0"),
])
def test_bad_step_settings_are_clear_errors(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, [override])


@pytest.mark.parametrize("overrides, match", [
    (["optim.schedule=step"], r"the step schedule needs at least one milestone"),
    (["optim.milestones=[10]"], r"used only by optim.schedule: step \(the schedule is 'cosine'\)"),
    (["data.mixup=true", "data.mixup_alpha=0.2"], r"'data.mixup_alpha': got 0.2, but it sets Input Mixup only"),
])
def test_settings_that_would_be_silently_ignored_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, overrides)
