"""`modwire eval` / `analyze` of a trained run: overrides of anything but the data, device,
precision or a model's evaluation options (the checkpoint decides the rest) are refused instead
of silently dropped; a
checkpoint without its run config needs the task; an output path that is a file is named."""
import pytest

import toy_task  # noqa: F401  (registers "toy_sets")

from modwire.analysis.runs import _check_eval_overrides, load_run


@pytest.mark.parametrize("item", ["model.name=perceiver_io_micro", "optim.lr=1", "model.overrides:={num_layers: 1}",
                                  "epochs=3", "datax.task=mnist"])
def test_overrides_the_checkpoint_decides_are_refused(item, tmp_path):
    with pytest.raises(ValueError, match=rf"override '{item.split('=')[0]}.*only data\.\*, device, precision and "
                                         rf"model\.overrides\.<evaluation option>"):
        load_run(tmp_path, [item])


@pytest.mark.parametrize("item", ["data.max_samples=4", "data.params:={root: /x}", "data.batch_size=8",
                                  "device=cpu", "precision=bf16"])
def test_data_device_and_precision_overrides_pass(item):
    _check_eval_overrides([item])


def test_repeated_eval_set_options_all_reach_the_check():
    from modwire import cli

    args = cli._parser().parse_args(["eval", "r", "--set", "data.max_samples=4", "--set", "model.name=x"])
    with pytest.raises(ValueError, match="got 'model.name'"):
        _check_eval_overrides(args.overrides)


def test_a_checkpoint_without_its_runs_config_needs_the_task(tmp_path):
    # it used to be scored on the default config's task (triangle, default size) without a word
    import torch

    import modwire
    from modwire.training.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "run", "last", modwire.create_model("nac_micro"), {"step": 1, "x": torch.ones(1)})
    with pytest.raises(FileNotFoundError, match=r"no config.yaml .* the task the model was trained on is unknown"):
        load_run(ckpt)
    cfg, model, info, dataset = load_run(ckpt, ["data.max_samples=3"], task="toy_sets")
    assert info.name == "toy_sets" and len(dataset) == 3


@pytest.mark.parametrize("sub", ["", "sub"])
def test_an_analysis_output_path_that_is_a_file_is_a_clear_error(tmp_path, sub):
    from modwire.analysis.runs import output_dir

    (tmp_path / "file").write_text("kept")
    with pytest.raises(ValueError, match=r"output directory .*file.*: expected a directory .* is a file"):
        output_dir(tmp_path / "file" / sub)
    assert (tmp_path / "file").read_text() == "kept"
    assert output_dir(tmp_path / "new" / "dir").is_dir()
