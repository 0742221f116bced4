"""``modwire finetune`` misused: each mistake is one line naming what was expected, exit 2."""
import pytest

import toy_fewshot  # noqa: F401  (registers "toy_classes")
import toy_task  # noqa: F401  (registers "toy_sets")
from modwire import cli
from training_helpers import train_toy_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_toy_run(tmp_path_factory.mktemp("pre") / "nac", "epochs=1")


def error_of(capsys, argv) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("modwire finetune: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def finetune(run, tmp_path, *extra):
    return ["finetune", str(run), "--task", "toy_classes", "--seeds", "0", "--epochs", "1", "--out",
            str(tmp_path / "ft"), "--set", "progress=false", *extra]


def test_unknown_parameter_set_lists_the_valid_ones(run, tmp_path, capsys):
    msg = error_of(capsys, finetune(run, tmp_path, "--train", "cls,head"))
    assert "unknown parameter set(s) ['cls']" in msg and "valid: ['all', 'head', 'readout']" in msg
    assert not (tmp_path / "ft").exists()                             # a refused run leaves nothing behind


def test_more_shots_than_a_class_has(run, tmp_path, capsys):
    msg = error_of(capsys, finetune(run, tmp_path, "--shots", "11"))   # toy_classes: 10 per class in train
    assert "'data.few_shot.shots': got 11, but class 0 has only 10 training samples" in msg


def test_more_ways_than_the_task_has(run, tmp_path, capsys):
    msg = error_of(capsys, finetune(run, tmp_path, "--shots", "1", "--ways", "7"))
    assert "'data.few_shot.ways': got 7, but task 'toy_classes' has 6 classes" in msg


def test_few_shot_on_a_regression_task_is_refused(run, tmp_path, capsys):
    argv = ["finetune", str(run), "--task", "fuzzy_boolean", "--shots", "2", "--seeds", "0", "--out",
            str(tmp_path / "ft"), "--set", "progress=false", "data.params={size: 64, layout: pair}"]
    assert "is not single-head classification (loss 'mse'" in error_of(capsys, argv)


def test_a_multi_head_task_for_a_single_read_out_model_is_refused(run, tmp_path, capsys):
    argv = ["finetune", str(run), "--task", "fuzzy_boolean_adapt", "--seeds", "0", "--out", str(tmp_path / "ft"),
            "--set", "progress=false", "data.params={size: 64}"]
    assert "the task gives heads=10 predictions per sample" in error_of(capsys, argv)


def test_missing_and_nonexistent_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["finetune", "--task", "toy_classes"])
    assert e.value.code == 2 and "the following arguments are required: RUN" in capsys.readouterr().err
    msg = error_of(capsys, ["finetune", str(tmp_path / "nope"), "--task", "toy_classes"])
    assert f"no run directory or checkpoint at {tmp_path / 'nope'}" in msg


@pytest.mark.parametrize("flags,expected", [
    (["--seeds", "0,x"], "--seeds: expected distinct non-negative integers"),
    (["--seeds", "1,1"], "--seeds: expected distinct non-negative integers"),
    (["--train", ","], "--train: expected comma-separated parameter-set names"),
    (["--shots", "-1"], "--shots: expected an integer >= 0, got -1"),
    (["--lr", "0"], "--lr: expected a positive number, got 0.0"),
    (["--set", "model.overrides.d_model=64"], "config key 'model.overrides': got ['d_model']"),
    (["--set", "finetune.new_task=false"], "has 2 outputs per head, but task 'toy_classes' needs 6"),
    (["--set", "finetune.add_functions=2"], "a 'nac' model has no functions to add"),
])
def test_bad_flags_and_settings(run, tmp_path, capsys, flags, expected):
    assert expected in error_of(capsys, finetune(run, tmp_path, *flags))


def test_new_task_without_init_is_refused(capsys, tmp_path):
    assert cli.main(["train", "--set", "finetune.new_task=true", f"out_dir={tmp_path / 'r'}"]) == 2
    assert "config key 'finetune.new_task': new task outputs replace a trained model's" in capsys.readouterr().err
