"""Issue 37, item 4: one name per idea. The former config field names (``ConfigBase.renamed``; the table
in docs/layout.md) still load, with a FutureWarning naming the current one: from a checkpoint's
``config.json`` (to the same model), from ``model.overrides`` (a YAML or ``--set``) and from
``create_model`` keywords; a former and a current name together is a UserError. The weights' names do
not follow the config's: renaming a field renames no parameter."""
import json
import re
from pathlib import Path

import pytest
import torch

import modwire
from modwire.errors import UserError
from modwire.models.config import ConfigBase
from modwire.models.nfm import NFMConfig
from modwire.models.set_model import SetModelConfig

FORMER = {SetModelConfig: {"embed": "tokenizer"}, NFMConfig: {"heads": "num_heads", "hidden": "ffn_hidden"}}


def test_the_rename_tables_are_the_documented_ones():
    tables = {cls: dict(cls.renamed) for cls in FORMER}
    assert tables == FORMER
    assert ConfigBase.renamed == {}
    doc = (Path(__file__).resolve().parents[2] / "docs" / "layout.md").read_text(encoding="utf-8")
    for table in FORMER.values():
        for old, new in table.items():
            assert re.search(rf"`{old}` *\| *`{new}`", doc), (old, new)


@pytest.mark.parametrize("name,old_json,new", [
    ("vit_micro", {"embed": None}, "tokenizer"),
    ("ait_micro", {"embed": None}, "tokenizer"),
    ("ni_micro", {"embed": None}, "tokenizer"),
    ("nfm_cnn_mlp_micro", {"nfm.heads": None, "nfm.hidden": None}, None),
])
def test_an_old_key_config_json_loads_to_the_same_model(name, old_json, new, tmp_path):
    torch.manual_seed(0)
    model = modwire.create_model(name).eval()
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    if new is not None:                                         # tokenizer → embed
        data["embed"] = data.pop(new)
    else:                                                       # nfm.num_heads → nfm.heads, ffn_hidden → hidden
        data["nfm"]["heads"], data["nfm"]["hidden"] = data["nfm"].pop("num_heads"), data["nfm"].pop("ffn_hidden")
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.warns(FutureWarning, match="is now called") as caught:
        loaded = modwire.from_pretrained(tmp_path).eval()
    said = " ".join(str(w.message) for w in caught)
    for old in old_json:
        assert repr(old) in said
    assert loaded.config == model.config
    assert list(loaded.state_dict()) == list(model.state_dict())            # no parameter renamed
    x, kw = _inputs(model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, **kw), model(x, **kw), atol=0, rtol=0)


def _inputs(model):
    inputs = model.config.example_inputs(2, seed=0)
    return inputs.pop(model.config.input_names()[0]), inputs


def test_old_keys_in_model_overrides_and_create_model():
    new = modwire.get_config("vit_micro", tokenizer={"positions": "absolute"})
    with pytest.warns(FutureWarning, match="'embed' is now called 'tokenizer'"):
        assert modwire.get_config("vit_micro", embed={"positions": "absolute"}) == new
    with pytest.warns(FutureWarning, match="'nfm.heads' is now called 'nfm.num_heads'"):
        old = modwire.get_config("nfm_cnn_mlp_micro", nfm={"heads": 4})
    assert old == modwire.get_config("nfm_cnn_mlp_micro", nfm={"num_heads": 4}) and old.nfm.num_heads == 4


@pytest.mark.parametrize("how", ["yaml", "set"])
def test_old_keys_in_a_training_config_model_overrides(how, tmp_path):
    from modwire.training.config import load_config
    from modwire.training.supervised import model_overrides_for_task

    if how == "yaml":
        path = tmp_path / "run.yaml"
        path.write_text("model: {name: vit_micro, overrides: {embed: {positions: absolute}}}\ndata: {task: triangle}\n")
        cfg = load_config(path)
    else:
        cfg = load_config(None, ["model.name=vit_micro", "model.overrides.embed.positions=absolute", "data.task=triangle"])
    with pytest.warns(FutureWarning, match="'embed' is now called 'tokenizer'"):
        overrides = model_overrides_for_task(cfg)
    assert "embed" not in overrides and overrides["tokenizer"]["positions"] == "absolute"
    assert modwire.get_config("vit_micro", **overrides).tokenizer.image_size == 64        # the task's, merged


@pytest.mark.parametrize("name,both", [
    ("vit_micro", dict(embed={"patch_size": 2}, tokenizer={"patch_size": 4})),
    ("nfm_cnn_mlp_micro", dict(nfm={"heads": 2, "num_heads": 4})),
])
def test_both_names_at_once_is_a_clear_error(name, both):
    with pytest.raises(UserError, match=r"is the former name of .*give one of them, not both"):
        modwire.get_config(name, **both)
