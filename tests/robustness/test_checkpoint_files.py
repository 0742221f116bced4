"""Checkpoint files a user (or a sync tool) damaged: a checkpoint saved with a checksum
manifest whose manifest was then deleted is refused, not loaded unverified."""
import pytest
import torch

import modwire
from modwire.training.checkpoint import load_state, save_checkpoint


@pytest.fixture()
def ckpt(tmp_path):
    model = modwire.create_model("nac_micro")
    return save_checkpoint(tmp_path / "run", "last", model, {"step": 3, "x": torch.ones(2)},
                           summary={"tag": "last", "step": 3}), model


def test_a_checkpoint_loads_with_its_manifest(ckpt):
    d, model = ckpt
    assert load_state(d)["step"] == 3
    loaded = modwire.from_pretrained(d)
    saved, own = loaded.state_dict(), model.state_dict()
    assert list(saved) == list(own) and all(torch.equal(saved[k], own[k]) for k in own)


@pytest.mark.parametrize("load", [load_state, modwire.from_pretrained], ids=["load_state", "from_pretrained"])
def test_a_deleted_manifest_is_refused_naming_the_file(ckpt, load):
    d, _ = ckpt
    (d / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"manifest.json is missing: the checkpoint in .* was saved with a "
                                                 r"checksum manifest"):
        load(d)


def test_a_save_pretrained_directory_without_a_manifest_still_loads(tmp_path):
    model = modwire.create_model("nac_micro")
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "manifest.json").unlink()        # written by hand, or by another tool
    assert isinstance(modwire.from_pretrained(tmp_path / "m"), torch.nn.Module)


def test_weights_of_another_model_config_name_the_differing_fields(ckpt):
    from modwire.training.checkpoint import load_weights

    d, _ = ckpt
    other = modwire.create_model("nac_micro", num_layers=1)     # e.g. config.yaml edited before --resume
    with pytest.raises(ValueError, match=r"does not match the model: model config \(saved vs model\) "
                                         r"\[num_layers: 2 vs 1\]; unexpected \[propagators\.1\."):
        load_weights(other, d / "model.safetensors")
