"""``modwire eval RUN --task OTHER``: a task whose inputs the run's model cannot read is one
clear error naming the differing input-layer fields, not a shape error deep in a tokenizer."""
import json

import pytest

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire import cli
from modwire.analysis.runs import check_task_fits
from modwire.tasks import InputSpec, TaskInfo, describe_task, get_task, register_task
from training_helpers import train_toy_run

try:
    get_task("toy_sets_twin")
except KeyError:  # the same inputs as toy_sets, another name: a task the model does fit
    register_task(TaskInfo("toy_sets_twin", "generator", "toy_sets again", 2, InputSpec.vectors(6, 8),
                           params={"size": 64, "seed": 0, "delay": 0.0}), toy_task.ToySets)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_toy_run(tmp_path_factory.mktemp("fit") / "run", "max_steps=1")


def test_eval_on_a_task_with_other_inputs_names_what_differs(run, capsys):
    assert cli.main(["eval", str(run), "--task", "digits"]) == 2
    err = capsys.readouterr().err
    assert "task 'digits' does not fit this run's 'nac' model" in err
    assert "tokenizer.kind: the model has 'linear', the task needs 'conv'" in err and "Traceback" not in err


def test_eval_on_a_task_with_the_same_inputs_scores(run, capsys):
    assert cli.main(["eval", str(run), "--task", "toy_sets_twin"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["task"] == "toy_sets_twin"


def test_a_wider_feature_dim_is_named(run):
    from modwire import from_pretrained

    model = from_pretrained(run / "checkpoints" / "last")
    info = describe_task("toy_sets")
    check_task_fits(model, info)                                      # its own task fits
    wider = TaskInfo("wider", "generator", "", 2, InputSpec.vectors(6, 9))
    with pytest.raises(ValueError, match=r"tokenizer.input_dim: the model has 8, the task needs 9"):
        check_task_fits(model, wider)
