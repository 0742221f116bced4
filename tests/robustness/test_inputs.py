"""Probe: bad task descriptions, inputs a model cannot read, and bad image folders give clear errors."""
import pytest
from PIL import Image

from modwire.models import get_config
from modwire.models.inputs import InputSpec, check_inputs
from modwire.tasks import TaskInfo, build_dataset, describe_task
from modwire.training import build_model_for_task, load_config, train


@pytest.mark.parametrize("make, match", [
    (lambda: InputSpec("audio"), r"InputSpec.kind: got 'audio', expected one of \['image', 'tokens', 'vectors', 'index'\]"),
    (lambda: InputSpec.image(0, 32, 32), r"InputSpec.channels \(image\): got 0, expected a positive int"),
    (lambda: InputSpec.image(3, 32.0, 32), r"InputSpec.height \(image\): got 32.0"),
    (lambda: InputSpec.image(True, 32, 32), r"InputSpec.channels \(image\): got True"),
    (lambda: InputSpec.tokens(None, 16), r"InputSpec.length \(tokens\): got None, expected a positive int$"),
    (lambda: InputSpec.tokens(10, 16, pad_id=16), r"pad_id: got 16, expected None or an id in \[0, vocab_size=16\)"),
    (lambda: InputSpec.tokens(10, 16, padded=True), "padded tokens need a pad_id"),
    (lambda: InputSpec.vectors(6, 0), r"InputSpec.dim \(vectors\): got 0"),
    (lambda: InputSpec("image", channels=3, height=8, width=8, dim=4), r"fields \['dim'\] do not apply"),
    (lambda: InputSpec.vectors(6, 4, ordered="yes"), "InputSpec.ordered: got 'yes', expected True or False"),
])
def test_invalid_specs_name_the_field(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


@pytest.mark.parametrize("bad", [[InputSpec.vectors(6, 4)], {}, {"x": "image"}, None])
def test_inputs_must_be_a_spec_or_a_mapping_of_specs(bad):
    with pytest.raises(TypeError, match="expected an InputSpec or a mapping of input names to InputSpecs"):
        check_inputs(bad)


def test_task_infos_refuse_model_fields_and_missing_descriptions():
    with pytest.raises(TypeError, match="inputs describe the data, not a model.*model_overrides is gone"):
        TaskInfo("t", "generator", "", 2, {"tokenizer": "linear", "input_dim": 8})
    with pytest.raises(ValueError, match="give inputs="):
        TaskInfo("t", "generator", "", 2)
    with pytest.raises(ValueError, match="num_classes is required"):
        TaskInfo("t", "generator", "", inputs=InputSpec.vectors(6, 8))
    with pytest.raises(ValueError, match="num_classes must be a positive int, got 0"):
        TaskInfo("t", "generator", "", 0, InputSpec.vectors(6, 8))


def test_parameters_the_description_cannot_use():
    with pytest.raises(ValueError, match=r"task 'sort_of_clevr': parameter 'patch_size': got 4, expected one of "
                                         r"\[1, 3, 5, 15, 25, 75\]"):
        describe_task("sort_of_clevr", {"patch_size": 4})
    with pytest.raises(ValueError, match=r"task 'listops': InputSpec.length \(tokens\): got 0"):
        describe_task("listops", {"max_len": 0})
    with pytest.raises(KeyError, match=r"unknown parameter\(s\) \['patch'\] for task 'sort_of_clevr'"):
        describe_task("sort_of_clevr", {"patch": 4})


def test_models_say_which_inputs_they_cannot_read():
    with pytest.raises(ValueError, match=r"'perceiver_io' model reads one input, but the task gives the named "
                                         r"inputs \['condition', 'x'\]"):
        get_config("perceiver_io_micro").for_inputs(describe_task("sort_of_clevr_conditional").inputs, 10)
    with pytest.raises(ValueError, match=r"a NAC reads an input 'x' and optionally a 'condition'.*\['audio', 'x'\]"):
        get_config("nac_micro").for_inputs({"x": InputSpec.vectors(4, 2), "audio": InputSpec.vectors(4, 2)}, 2)
    with pytest.raises(ValueError, match=r"square images whose side is a multiple of 8.*1x28x28"):
        get_config("nac_micro").for_inputs(describe_task("mnist", {"pad_to": None}).inputs, 10)
    with pytest.raises(ValueError, match=r"square images.*3x32x48"):
        get_config("nac_micro").for_inputs(InputSpec.image(3, 32, 48), 10)
    cfg = load_config(None, ["model.name=nac_conditional_micro", "data.task=triangle"])
    with pytest.raises(ValueError, match=r"takes the inputs \['condition', 'x'\], but task 'triangle' gives \['x'\]"):
        build_model_for_task(cfg)


@pytest.mark.parametrize("given", [0, 3])
def test_a_class_count_the_task_does_not_have_is_refused_before_the_run_writes(tmp_path, given):
    # 0 (timm's model without classifier) would train a cross-entropy over its features; 3 of 10 classes
    # would end in an out-of-range target
    run = tmp_path / "run"
    cfg = load_config(None, [f"out_dir={run}", "model.name=vit_micro", "data.task=digits", "progress=false",
                             f"model.overrides={{num_classes: {given}}}"])
    with pytest.raises(ValueError, match=rf"config key 'model.overrides.num_classes': got {given}, but task 'digits' "
                                         rf"needs 10 outputs from model 'vit_micro'"):
        train(cfg)
    assert not run.exists()
    assert build_model_for_task(load_config(None, ["model.name=vit_micro", "data.task=digits",
                                                   "model.overrides={num_classes: 10}"])).num_classes == 10


def test_image_folder_bad_layouts(tmp_path):
    with pytest.raises(ValueError, match="root=... is required"):
        describe_task("image_folder")
    (tmp_path / "train" / "a").mkdir(parents=True)
    Image.new("RGB", (5, 7)).save(tmp_path / "train" / "a" / "0.png")
    (tmp_path / "train" / "b").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no images in the class folders \['b'\]"):
        build_dataset("image_folder", "train", root=str(tmp_path))
    Image.new("RGB", (5, 7)).save(tmp_path / "train" / "b" / "0.jpg")
    with pytest.raises(FileNotFoundError, match=r"no folder for split 'val'; tried .*val, .*valid, .*validation, .*test"):
        build_dataset("image_folder", "val", root=str(tmp_path))
    (tmp_path / "train" / "b" / "1.jpg").write_text("<html>not found</html>")
    ds = build_dataset("image_folder", "train", root=str(tmp_path))
    with pytest.raises(ValueError, match=r"1.jpg: not an image Pillow can decode"):
        ds[2]
    with pytest.raises(ValueError, match=r"parameter 'channels': got 2, expected one of \[1, 3\] \(1: grayscale, 3: RGB\)"):
        build_dataset("image_folder", "train", root=str(tmp_path), channels=2)
    with pytest.raises(ValueError, match=r"^task 'image_folder': parameter 'image_size': got -1, expected an integer >= 1"):
        describe_task("image_folder", {"root": str(tmp_path), "image_size": -1})


def test_augmentation_needs_an_image_task(tmp_path):
    from modwire.training.supervised import apply_augmentation

    cfg = load_config(None, ["model.name=nac_micro", "data.task=listops", "data.mixup=true"])
    with pytest.raises(ValueError, match=r"need an image classification task; task 'listops' gives \{'x': 'tokens'\}"):
        apply_augmentation(cfg, describe_task("listops"), [], [])
