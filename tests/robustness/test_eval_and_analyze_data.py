"""Issue 26, item 5: silently wrong evaluations become correct or a clear error. ``eval --task X`` keeps
the ``data.params`` given for X; ``--occlusion`` on a task without images is refused; ``analyze
--baseline`` refuses a run trained on another task or other data."""
import json

import pytest

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire import cli
from modwire.errors import UserError
from modwire.tasks import InputSpec, TaskInfo, get_task, register_task
from modwire.training import load_config, train

try:
    get_task("toy_sets_other")
except KeyError:     # the same inputs as toy_sets, another task
    register_task(TaskInfo("toy_sets_other", "generator", "test task: toy_sets under another name", 2,
                           InputSpec.vectors(6, 8), params={"size": 64, "seed": 0, "delay": 0.0}), toy_task.ToySets)


def _run(tmp_path, name, *extra):
    run = tmp_path / name
    train(load_config(None, [f"out_dir={run}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                             "epochs=1", "progress=false", *extra]))
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return _run(tmp, "a"), _run(tmp, "b", "data.params.seed=3")


def test_eval_of_another_task_keeps_its_data_params(runs, capsys):
    assert cli.main(["eval", str(runs[0]), "--task", "toy_sets_other", "--set", "data.params.size=24"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["task"], out["samples"]) == ("toy_sets_other", 24)      # was 64: the override was dropped


def test_occlusion_on_a_task_without_images_is_refused(runs, capsys):
    assert cli.main(["eval", str(runs[0]), "--occlusion", "16"]) == 2
    err = capsys.readouterr().err
    assert "--occlusion puts a Cutout box on images (NFM §4.4); task 'toy_sets' gives vectors inputs" in err


def test_a_baseline_trained_on_other_data_is_refused(runs):
    from modwire.analysis.report import analyze

    with pytest.raises(UserError, match=r"--baseline .*b: trained on task 'toy_sets' with params .*'seed': 3.*"
                                        r"a baseline must share the run's task and data"):
        analyze(runs[0], [runs[1]], drop=[0.5], max_samples=16, batch=8, iters=1, plots=False)
