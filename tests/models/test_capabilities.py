"""Issue 24: a model's optional capabilities are declared Protocols (modwire.models.capabilities),
checked with isinstance, listed by ``modwire list models``; no hasattr probe in the harness."""
import ast
from pathlib import Path

import pytest
import torch

from modwire import cli, create_model
from modwire.models.base import MODEL_TYPES
from modwire.models.capabilities import (CAPABILITIES, EpochAware, FineTunable, GrowsFunctions, capabilities)

SRC = Path(__file__).resolve().parents[2] / "src" / "modwire"


def test_each_model_type_declares_what_it_can_do():
    got = {name: capabilities(cls) for name, cls in MODEL_TYPES.items()}
    assert got["ait"] == ["finetune", "eval_options", "epoch_hook", "records", "workspace"]
    assert got["neural_interpreter"] == ["finetune", "add_functions", "records", "module_dropping"]
    assert got["nac"] == ["finetune", "records", "module_dropping"]
    assert got["gan"] == ["adversarial", "eval_options", "nfm"]     # a GAN has no classifier head to replace
    for kind in ("preact_resnet", "transformer_lm", "cnn_mlp"):     # NFM as a config option (NFM §3)
        assert "nfm" in got[kind]
    assert set(CAPABILITIES) == {c for caps in got.values() for c in caps}


def test_a_method_missing_means_no_capability():
    class HalfTunable(torch.nn.Module):
        def parameter_sets(self):
            return {"all": ("",)}

    class Tunable(HalfTunable):
        def new_task(self, num_classes, heads=1):
            pass

    assert not isinstance(HalfTunable(), FineTunable) and isinstance(Tunable(), FineTunable)
    assert capabilities(Tunable) == ["finetune"] and capabilities(HalfTunable) == []
    ni, vit = create_model("ni_micro"), create_model("vit_micro")
    assert isinstance(ni, GrowsFunctions) and not isinstance(vit, GrowsFunctions)
    assert isinstance(create_model("ait_micro"), EpochAware) and not isinstance(vit, EpochAware)


def test_finetune_offers_only_all_on_a_model_without_the_capability():
    from modwire.training.finetune_setup import select_trainable

    gan = create_model("gan_resnet_micro")
    assert select_trainable(gan, ["all"])[0] == gan.num_parameters()      # every model has "all"
    with pytest.raises(ValueError, match="unknown parameter set\\(s\\) \\['head'\\].*valid: \\['all'\\]"):
        select_trainable(gan, ["head"])


def test_list_models_names_the_capabilities(capsys):
    assert cli.main(["list", "models"]) == 0
    (line,) = [l for l in capsys.readouterr().out.splitlines() if l.startswith("nac_micro ")]
    assert line.endswith("[finetune, records, module_dropping]")


@pytest.mark.parametrize("part", ["training", "analysis", "cli.py"])
def test_no_hasattr_probe_in_the_harness(part):
    files = sorted((SRC / part).rglob("*.py")) if (SRC / part).is_dir() else [SRC / part]
    probes = [f"{f.relative_to(SRC)}:{node.lineno}" for f in files for node in ast.walk(ast.parse(f.read_text()))
              if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr"]
    assert probes == []
