"""Probe (issue 9, item 5): bad model-config values are clear errors naming the key path,
the value given and what is expected; good edge values still build. Also ``config.json``
files that are not a model config and ``create_model`` with a non-string name."""
from __future__ import annotations

import json
import math
import re

import pytest

import modwire
from modwire.models import NAC, NACConfig, PerceiverIO, get_config

NAN, INF = math.nan, math.inf

# (preset, overrides, key path in the message, expected-text fragment)
BAD = [
    *[("nac_micro", {"kernel": {f: v}}, f"kernel.{f}", want) for f in ("tau", "epsilon", "delta")
      for v, want in ((0.0, "> 0"), (-1.0, "> 0"), (NAN, "finite"), (INF, "finite"), (-INF, "finite"))],
    *[("nac_micro", {"kernel": {"truncation": v}}, "kernel.truncation", want)
      for v, want in ((0.0, "> 0"), (-0.5, "> 0"), (NAN, "finite"))],
    *[("nac_micro", {"alpha_init": v}, "alpha_init", want) for v, want in ((-0.1, ">= 0"), (NAN, "finite"),
                                                                            (INF, "finite"))],
    *[("nac_micro", {f: v}, f, ">= 1") for f in ("d_model", "num_layers", "num_processor_modules",
                                                 "num_output_modules", "ffn_hidden", "d_sig", "d_code")
      for v in (0, -3)],
    *[(p, {"num_classes": -3}, "num_classes", ">= 0 (0: no classifier") for p in ("nac_micro", "perceiver_io_micro",
                                                                                 "vit_micro", "preact_resnet_micro",
                                                                                 "cnn_mlp_micro")],
    *[(p, {f: v}, f, ">= 1") for p in ("nac_micro", "perceiver_io_micro")
      for f in ("num_heads", "read_in_heads", "read_out_heads", "head_dim") for v in (0, -2)],
    *[(p, {"head_dim": None, f: 5}, f, "divides d_model=32") for p in ("nac_micro", "perceiver_io_micro")
      for f in ("num_heads", "read_in_heads", "read_out_heads")],        # head_dim None: the heads split d_model
    *[("perceiver_io_micro", {f: 0}, f, ">= 1") for f in ("num_latents", "num_output_modules", "d_model")],
    ("nac_micro", {"frozen_graph": {"seed": -1}}, "frozen_graph.seed", ">= 0"),
    *[("nac_small", {"tokenizer": {f: v}}, f"tokenizer.{f}", want)
      for f, v, want in (("image_size", 30, "multiple of 8"), ("image_size", 0, ">= 8"), ("in_channels", 0, ">= 1"),
                         ("conv_channels", -1, ">= 1"), ("stem_channels", 0, ">= 1"), ("pos_dim", 0, ">= 1"),
                         ("conv_layer_scale", -1e-6, ">= 0"), ("conv_norm_eps", 0.0, "> 0"), ("pos_std", -1.0, ">= 0"),
                         ("conv_down_norm", "middle", "'before'"), ("conv_block_norms", 3, "[2, 1]"),
                         ("conv_init", "xavier", "'torch'"))],
    *[("nac_micro", {"tokenizer": {f: v}}, f"tokenizer.{f}", want)
      for f, v, want in (("input_dim", 0, ">= 1"), ("token_dim", -4, ">= 1"), ("max_len", -1, ">= 0"))],
    *[("nac_micro", {"tokenizer": {"kind": "embedding", "vocab_size": 16, **kw}}, f"tokenizer.{f}", want)
      for kw, f, want in (({"vocab_size": 0}, "vocab_size", ">= 1"), ({"pad_id": 16}, "pad_id", "vocab_size=16)"),
                          ({"pad_id": -2}, "pad_id", "[-1, vocab_size=16)"), ({"max_len": -5}, "max_len", ">= 0"))],
    ("nac_conditional_micro", {"generator": {"num_heads": 0}}, "generator.num_heads", ">= 1"),
    ("nac_conditional_micro", {"head_dim": None, "generator": {"num_heads": 3}}, "generator.num_heads",
     "divides d_model=32"),
    ("nac_conditional_micro", {"generator": {"tokenizer": {"vocab_size": 0}}}, "generator.tokenizer.vocab_size",
     ">= 1"),
]


def _id(case) -> str:
    return f"{case[0]}-{case[2]}={list(_leaf(case[1]))[-1]!r}"


def _leaf(d: dict):
    for v in d.values():
        yield from (_leaf(v) if isinstance(v, dict) else (v,))


@pytest.mark.parametrize("preset, overrides, path, want", BAD, ids=map(_id, BAD))
def test_bad_value_names_path_value_and_expectation(preset, overrides, path, want):
    given = list(_leaf(overrides))[-1]
    with pytest.raises(ValueError) as e:
        get_config(preset, **overrides)
    msg = str(e.value)
    assert f"config field '{path}'" in msg and f"got {given!r}" in msg and want in msg, msg


GOOD_EDGES = [
    ("nac_micro", {"kernel": {"tau": 1e-6, "epsilon": 1e-6, "delta": 1e-30, "truncation": 1e-3}}),
    ("nac_micro", {"alpha_init": 0.0}),                            # a learned α may start at 0
    ("nac_micro", {"modulation": "none", "alpha_init": -1.0}),     # unused without ModFC
    ("nac_micro", {"num_layers": 1, "num_processor_modules": 1, "num_output_modules": 1, "num_classes": 1,
                   "d_sig": 1, "ffn_hidden": 1}),
    ("nac_micro", {"num_heads": 32, "read_in_heads": 1, "read_out_heads": 16, "head_dim": None}),
    ("nac_micro", {"num_heads": 5, "read_out_heads": 3, "head_dim": 1}),   # a head_dim: any count
    ("nac_micro", {"frozen_graph": {"seed": 0}}),
    ("nac_small", {"tokenizer": {"image_size": 8, "in_channels": 1}}),
    ("nac_micro", {"tokenizer": {"kind": "embedding", "vocab_size": 1, "pad_id": 0, "max_len": 0}}),
    ("nac_micro", {"tokenizer": {"kind": "embedding", "vocab_size": 16, "pad_id": -1}}),
    ("nac_micro", {"tokenizer": {"max_len": 0}}),
    ("perceiver_io_micro", {"num_latents": 1, "num_layers": 1, "num_output_modules": 1}),
]


@pytest.mark.parametrize("preset, overrides", GOOD_EDGES)
def test_good_edge_values_still_build(preset, overrides):
    cfg = get_config(preset, **overrides)
    model = modwire.create_model(preset, **overrides)
    assert model.config == cfg


@pytest.mark.parametrize("field, value, expected", [
    ("num_layers", True, "int"), ("num_layers", 2.0, "int"), ("num_layers", "2", "int"), ("num_layers", None, "int"),
    ("alpha_init", "0.1", "float"), ("alpha_init", False, "float"),
])
def test_wrong_type_is_a_type_error_naming_field_value_and_type(field, value, expected):
    with pytest.raises(TypeError) as e:
        get_config("nac_micro", **{field: value})
    msg = str(e.value)
    assert f"'{field}'" in msg and repr(value) in msg and f"({type(value).__name__})" in msg \
        and f"expected {expected}" in msg, msg


def test_kernel_fields_are_typed_with_their_path():
    with pytest.raises(TypeError, match=r"'kernel.tau': got True \(bool\), expected float"):
        get_config("nac_micro", kernel={"tau": True})


# ----------------------------------------------------------------------------- config.json, create_model

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    modwire.create_model("nac_micro").save_pretrained(d)
    return d


BAD_JSON = [
    ("[1, 2]", "got an array"), ("null", "got null"), ('"nac"', "got a string"), ("{", "is not valid JSON (line 1"),
    ('{"d_model": 32}', "got no 'model_type' key"), ('{"model_type": 3}', "got model_type 3"),
    ('{"model_type": "nacc"}', "unknown model_type 'nacc'. Did you mean ['nac']"),
    ('{"model_type": "nac", "num_layers": -2}', "config field 'num_layers': got -2, expected an integer >= 1"),
    ('{"model_type": "nac", "kernel": {"tau": NaN}}', "config field 'kernel.tau': got nan"),
]


@pytest.mark.parametrize("loader", [modwire.from_pretrained, NAC.from_pretrained], ids=["any", "NAC"])
@pytest.mark.parametrize("text, want", BAD_JSON)
def test_bad_config_json_is_one_line_naming_the_file(saved, loader, text, want):
    original = (saved / "config.json").read_text()
    (saved / "config.json").write_text(text)
    try:
        with pytest.raises((ValueError, KeyError)) as e:
            loader(saved)
    finally:
        (saved / "config.json").write_text(original)
    msg = e.value.args[0]
    if loader == NAC.from_pretrained and want == "got no 'model_type' key":
        # a class reads a config.json without model_type as its own (PyTorchModelHubMixin writes it so,
        # tests/models/test_hub.py): here a default NAC with d_model 32, which nac_micro's weights do not fit
        assert "\n" not in msg and "do not match the config" in msg, msg
        return
    assert "\n" not in msg and str(saved / "config.json") in msg and want in msg, msg
    if "model_type" not in want and "config field" not in want:
        assert "expected a JSON object with a 'model_type' key" in msg


def test_non_utf8_config_json_names_the_file(saved):
    original = (saved / "config.json").read_bytes()
    (saved / "config.json").write_bytes(b"\xff\xfe{}")
    try:
        with pytest.raises(ValueError, match=re.escape(str(saved / "config.json")) + " is not UTF-8"):
            modwire.from_pretrained(saved)
    finally:
        (saved / "config.json").write_bytes(original)
    assert json.loads(original)["model_type"] == "nac"


@pytest.mark.parametrize("name, got", [(None, "NoneType None"), (3, "int 3"), (["nac_micro"], "list ['nac_micro']"),
                                       (NACConfig(), "a NACConfig; to build a model from a config, call NAC(config)")])
def test_create_model_with_a_non_string_name_is_a_type_error(name, got):
    with pytest.raises(TypeError) as e:
        modwire.create_model(name)
    msg = str(e.value)
    assert "expected a model preset name (str)" in msg and f"got {got}" in msg, msg


def test_unknown_name_still_suggests_close_matches():
    with pytest.raises(KeyError, match=r"Did you mean \['perceiver_io_micro'"):
        modwire.create_model("perceiver_io_mciro")
    assert isinstance(modwire.create_model("perceiver_io_micro"), PerceiverIO)
