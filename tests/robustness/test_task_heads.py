"""Probe: head counts and index inputs a model or a task cannot use give clear errors."""
import pytest

from modwire.models import get_config
from modwire.models.inputs import InputSpec
from modwire.tasks import TaskInfo


@pytest.mark.parametrize("preset, kind", [("nac_micro", "'nac'"), ("perceiver_io_micro", "'perceiver_io'")])
def test_single_readout_models_refuse_several_heads(preset, kind):
    with pytest.raises(ValueError, match=rf"heads=20 predictions per sample.*{kind} model has a single read-out"
                                         r".*ViT or Neural Interpreter.*layout: pair"):
        get_config(preset).for_inputs(InputSpec.vectors(5, 1, ordered=True), 1, heads=20)


def test_tokenizers_refuse_an_index_input():
    with pytest.raises(ValueError, match=r"not an index input \(InputSpec.index\(vocab_size=3\)"):
        get_config("perceiver_io_micro").for_inputs(InputSpec.index(3), 10)
    with pytest.raises(ValueError, match="not an index input"):
        get_config("nac_micro").for_inputs({"x": InputSpec.image(3, 32, 32), "condition": InputSpec.index(3)}, 10)


@pytest.mark.parametrize("make, match", [
    (lambda: InputSpec.index(0), r"InputSpec.vocab_size \(index\): got 0, expected a positive int"),
    (lambda: InputSpec("index", vocab_size=3, length=2), r"fields \['length'\] do not apply"),
    (lambda: TaskInfo("t", "generator", "", 2, InputSpec.vectors(6, 8), heads=0),
     r"task 't': heads must be a positive int .*got 0"),
    (lambda: TaskInfo("t", "generator", "", 2, InputSpec.vectors(6, 8), heads=True), "heads must be a positive int"),
    (lambda: TaskInfo("t", "generator", "", describe=lambda p: (InputSpec.vectors(6, 8),)),
     r"describe\(params\) must return \(inputs, num_classes\) or \(inputs, num_classes, heads\)"),
])
def test_bad_index_specs_and_head_counts(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_nac_fuzzy_boolean_config_builds_in_the_pair_layout_and_the_sample_layout_says_why_not():
    from pathlib import Path

    from modwire.training import build_model_for_task, load_config

    path = Path(__file__).resolve().parents[2] / "configs" / "cpu" / "nac_fuzzy_boolean.yaml"
    model = build_model_for_task(load_config(path))
    assert model.config.tokenizer.input_dim == 31 and model.config.num_classes == 1
    with pytest.raises(ValueError, match=r"heads=20 predictions per sample.*'nac' model.*layout: pair"):
        build_model_for_task(load_config(path, ["data.params.layout=sample"]))


def test_unknown_fuzzy_boolean_layout():
    from modwire.tasks import build_dataset, describe_task

    for make in (lambda: build_dataset("fuzzy_boolean", "train", size=2, layout="pairs"),
                 lambda: describe_task("fuzzy_boolean", {"layout": "pairs"})):
        with pytest.raises(ValueError, match=r"parameter 'layout': got 'pairs', expected one of \['sample', 'pair'\]"):
            make()
    with pytest.raises(ValueError, match=r"function_ids must be distinct ids in \[0, 30\), got \(1, 1\)"):
        describe_task("fuzzy_boolean", {"function_ids": (1, 1)})


def test_augment_choices_on_a_multi_input_task():
    from modwire.tasks import get_task
    from modwire.training import apply_augmentation, load_config

    with pytest.raises(ValueError, match=r"config key 'data.augment': got 'rand', expected one of \[False, True, "
                                         r"'deit', 'randaugment', 'crop_flip', 'resized_crop_flip'\]"):
        load_config(None, ["data.augment=rand"])
    for extra in (["data.augment=true"], ["data.augment=randaugment", "data.mixup=true"]):
        cfg = load_config(None, ["data.task=digits_multitask_offline"] + extra)
        with pytest.raises(ValueError, match=r"task 'digits_multitask_offline' gives \{'x': 'image', 'task': 'index'\}"
                                             r".*only data.augment: randaugment, without mixup"):
            apply_augmentation(cfg, get_task("digits_multitask_offline"), [], [])


def test_list_tasks_keeps_name_and_kind_apart(capsys):
    from modwire.cli import main
    from modwire.tasks import get_task, list_tasks

    assert main(["list", "tasks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [[n, get_task(n).kind] for n in list_tasks()]


def test_list_models_shows_every_preset_name_in_full(capsys):
    """Issue 24: the names column cut long preset names (33 characters) into their source."""
    from modwire.cli import main
    from modwire.models import list_models

    assert main(["list", "models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list_models()
    assert any(len(n) > 32 for n in list_models())                 # the case the fixed column cut
