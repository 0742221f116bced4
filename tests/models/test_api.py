import json

import pytest
import torch

import modwire
from modwire.models import NACConfig, PerceiverIOConfig
from modwire.models.nac import KernelConfig


def test_list_models_and_sources():
    names = modwire.list_models()
    for name in ("nac_tiny_imagenet", "nac_imagenet", "perceiver_io_tiny_imagenet"):
        assert name in names
    assert modwire.list_models("perceiver*") == [n for n in names if n.startswith("perceiver")]
    assert modwire.model_source("nac_tiny_imagenet").startswith("NAC Table 4;")


def test_unknown_model_lists_valid_names_and_suggests():
    with pytest.raises(KeyError, match=r"nac_tiny_imagnet.*Did you mean.*nac_tiny_imagenet.*Valid"):
        modwire.create_model("nac_tiny_imagnet")


def test_unknown_override_names_valid_fields():
    with pytest.raises(KeyError, match=r"\['num_modules'\].*valid fields.*num_processor_modules"):
        modwire.create_model("nac_micro", num_modules=3)


@pytest.mark.parametrize("cls", [NACConfig, PerceiverIOConfig])
def test_config_json_round_trip(cls):
    cfg = cls(num_classes=7, d_model=48, kernel=KernelConfig(truncation=0.3)) if cls is NACConfig \
        else cls(num_classes=7)
    again = cls.from_json(cfg.to_json())
    assert again == cfg
    assert json.loads(cfg.to_json())["model_type"] == cls.model_type


def test_config_from_dict_rejects_other_model_type_and_unknown_keys():
    with pytest.raises(ValueError, match="'perceiver_io', not 'nac'"):
        NACConfig.from_dict({"model_type": "perceiver_io"})
    with pytest.raises(KeyError, match="bogus"):
        NACConfig.from_dict({"bogus": 1})


def test_overrides_accept_nested_names():
    nested = modwire.get_config("nac_micro", kernel={"tau": 1.0, "eval_mode": "sample", "enabled": True},
                                tokenizer={"max_len": 9})
    assert nested.kernel.tau == 1.0 and nested.kernel.eval_mode == "sample" and nested.tokenizer.max_len == 9
    assert nested.tokenizer.kind == "linear" and nested.tokenizer.input_dim == 8   # partial dicts merge
    assert NACConfig().replace(kernel={"truncation": 0.3}) == NACConfig(kernel=KernelConfig(truncation=0.3))
    assert not modwire.get_config("nac_micro", kernel={"enabled": False}).kernel.enabled
    with pytest.raises(TypeError):
        NACConfig(tau=1.0)  # the dataclass constructor takes only the new names


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0])
def test_non_finite_or_non_positive_values_are_refused_with_the_full_path(value):
    with pytest.raises(ValueError, match="'kernel.tau'"):
        modwire.create_model("nac_micro", kernel={"tau": value})
    with pytest.raises(ValueError, match="'kernel.epsilon'"):
        NACConfig(kernel=KernelConfig(epsilon=value))


@pytest.mark.parametrize("name", ["nac_micro", "perceiver_io_micro"])
def test_save_load_round_trip_identical_outputs(tmp_path, name):
    torch.manual_seed(0)
    model = modwire.create_model(name, kernel={"learn_epsilon": True}) if name.startswith("nac") \
        else modwire.create_model(name)
    model.eval()
    with torch.no_grad():  # weights away from their init, so a fresh model would differ
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    x = torch.randn(2, 5, 8)
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    for loaded in (type(model).from_pretrained(tmp_path / "m"), modwire.from_pretrained(tmp_path / "m")):
        loaded.eval()
        assert loaded.config == model.config
        torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


def test_loading_bad_directories_gives_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json and .*model.safetensors"):
        modwire.from_pretrained(tmp_path)
    model = modwire.create_model("nac_micro")
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x80\x04not a safetensors file")  # e.g. a pickle
    with pytest.raises(ValueError, match="model.safetensors is corrupted: its sha256 differs"):
        modwire.from_pretrained(tmp_path)
    (tmp_path / "manifest.json").unlink()                 # swapped in by hand, without checksums
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        modwire.from_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_processor_modules"] = 13
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="(?s)do not match its config.json.*size mismatch"):
        modwire.from_pretrained(tmp_path)
    cfg["model_type"] = "perceiver_io"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KeyError, match="unknown PerceiverIOConfig field"):
        modwire.from_pretrained(tmp_path)


def test_from_pretrained_on_the_wrong_class(tmp_path):
    modwire.create_model("perceiver_io_micro").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a 'perceiver_io' model, not 'nac'"):
        modwire.NAC.from_pretrained(tmp_path)


def test_save_is_atomic_no_temporary_files_left(tmp_path):
    model = modwire.create_model("nac_micro")
    for _ in range(2):  # overwriting an existing save
        model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "manifest.json", "model.safetensors"]


def test_overrides_never_modify_the_callers_dicts():
    tok = {"kind": "linear", "input_dim": 8}
    gen = {"kind": "conditional", "tokenizer": {"kind": "embedding", "vocab_size": 9}}
    cfg = modwire.get_config("nac_micro", tokenizer=tok, generator=gen).replace(tokenizer={"token_dim": 12})
    assert cfg.tokenizer.token_dim == 12 and cfg.generator.tokenizer.vocab_size == 9
    assert tok == {"kind": "linear", "input_dim": 8}
    assert gen == {"kind": "conditional", "tokenizer": {"kind": "embedding", "vocab_size": 9}}
