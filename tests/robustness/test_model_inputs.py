"""Probe (issue 9, item 5): bad model inputs are clear errors at the forward entry (the
tokenizers' ``check_input``, ``modwire.nn.tokenizers``), naming what was expected and
what was given, for an image NAC, a token NAC, a Perceiver IO and a conditional NAC."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import modwire

IMAGE = dict(num_classes=3, tokenizer={"image_size": 16, "in_channels": 3, "stem_channels": 8, "conv_channels": 8,
                                       "pos_dim": 8},
             d_model=16, num_heads=2, read_out_heads=2, num_layers=1, num_processor_modules=4,
             num_output_modules=2, ffn_hidden=16, d_sig=4, d_code=16)
TOKENS = dict(tokenizer={"kind": "embedding", "vocab_size": 10, "max_len": 6, "token_dim": 16, "pad_id": 0})


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {"image_nac": modwire.create_model("nac_small", **IMAGE).eval(),
            "token_nac": modwire.create_model("nac_micro", **TOKENS).eval(),
            "pio": modwire.create_model("perceiver_io_micro").eval(),
            "cond_nac": modwire.create_model("nac_conditional_micro").eval()}


def good(kind: str):
    """A valid input for each model (condition: ids [B, M] < 7, M ≤ 4)."""
    g = torch.Generator().manual_seed(0)
    return {"image_nac": torch.rand(2, 3, 16, 16, generator=g), "token_nac": torch.randint(1, 10, (2, 5), generator=g),
            "pio": torch.randn(2, 4, 8, generator=g), "cond_nac": torch.randn(2, 4, 8, generator=g)}[kind]


def with_value(x: torch.Tensor, value) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[3] = value
    return x


# (model, case id, input builder, exception type, fragments the message must contain)
CASES = [
    # image NAC: [B, 3, 16, 16] float
    ("image_nac", "rank", lambda: torch.rand(3, 16, 16), ValueError, ["[B, 3, 16, 16]", "[3, 16, 16]"]),
    ("image_nac", "channels", lambda: torch.rand(2, 1, 16, 16), ValueError, ["[B, 3, 16, 16]", "[2, 1, 16, 16]"]),
    ("image_nac", "image_size", lambda: torch.rand(2, 3, 32, 32), ValueError, ["[B, 3, 16, 16]", "[2, 3, 32, 32]"]),
    ("image_nac", "channels_last", lambda: torch.rand(2, 16, 16, 3), ValueError, ["[B, 3, 16, 16]", "[2, 16, 16, 3]"]),
    ("image_nac", "uint8", lambda: (good("image_nac") * 255).to(torch.uint8), TypeError,
     ["float images", "torch.uint8", "x.float() / 255"]),
    ("image_nac", "int64", lambda: torch.zeros(2, 3, 16, 16, dtype=torch.long), TypeError, ["float images", "int64"]),
    ("image_nac", "float64", lambda: good("image_nac").double(), TypeError, ["torch.float32", "torch.float64"]),
    ("image_nac", "empty_batch", lambda: torch.rand(0, 3, 16, 16), ValueError, ["B, N >= 1", "B=0", "[0, 3, 16, 16]"]),
    ("image_nac", "nan", lambda: with_value(good("image_nac"), math.nan), ValueError, ["finite", "NaN"]),
    ("image_nac", "inf", lambda: with_value(good("image_nac"), -math.inf), ValueError, ["finite", "inf"]),
    ("image_nac", "numpy", lambda: good("image_nac").numpy(), TypeError, ["torch.Tensor", "numpy.ndarray",
                                                                         "torch.as_tensor"]),
    ("image_nac", "list", lambda: good("image_nac").tolist(), TypeError, ["torch.Tensor", "builtins.list"]),
    # token NAC: ids [B, N] in [0, 10), N ≤ 6
    ("token_nac", "float_ids", lambda: good("token_nac").float(), TypeError, ["integer token ids", "float32"]),
    ("token_nac", "bool_ids", lambda: good("token_nac") > 3, TypeError, ["integer token ids", "torch.bool"]),
    ("token_nac", "rank", lambda: good("token_nac")[..., None], ValueError, ["[B, N]", "[2, 5, 1]"]),
    ("token_nac", "id_too_large", lambda: with_value(good("token_nac"), 10), ValueError,
     ["token id 10", "vocab_size=10"]),
    ("token_nac", "id_negative", lambda: with_value(good("token_nac"), -3), ValueError,
     ["token id -3", "vocab_size=10"]),
    ("token_nac", "too_long", lambda: torch.randint(1, 10, (2, 7)), ValueError,
     ["sequence length 7 exceeds max_len 6", "[2, 7]"]),
    ("token_nac", "empty_tokens", lambda: torch.zeros(2, 0, dtype=torch.long), ValueError, ["N=0", "[2, 0]"]),
    ("token_nac", "empty_batch", lambda: torch.zeros(0, 5, dtype=torch.long), ValueError, ["B=0", "[0, 5]"]),
    ("token_nac", "numpy", lambda: good("token_nac").numpy(), TypeError, ["torch.Tensor", "numpy.ndarray"]),
    # Perceiver IO: features [B, N, 8]
    ("pio", "feature_dim", lambda: torch.randn(2, 4, 9), ValueError, ["[B, N, 8]", "[2, 4, 9]"]),
    ("pio", "rank", lambda: torch.randn(2, 8), ValueError, ["[B, N, 8]", "[2, 8]"]),
    ("pio", "int_features", lambda: torch.ones(2, 4, 8, dtype=torch.long), TypeError, ["float features", "int64"]),
    ("pio", "half", lambda: good("pio").half(), TypeError, ["torch.float32", "torch.float16", "autocast"]),
    ("pio", "empty_tokens", lambda: torch.randn(2, 0, 8), ValueError, ["N=0", "[2, 0, 8]"]),
    ("pio", "empty_batch", lambda: torch.randn(0, 4, 8), ValueError, ["B=0"]),
    ("pio", "nan", lambda: with_value(good("pio"), math.nan), ValueError, ["finite", "NaN"]),
    ("pio", "inf", lambda: with_value(good("pio"), math.inf), ValueError, ["finite", "inf"]),
    ("pio", "list", lambda: good("pio").tolist(), TypeError, ["torch.Tensor", "list"]),
    ("pio", "numpy", lambda: good("pio").numpy(), TypeError, ["torch.Tensor", "numpy.ndarray"]),
]


@pytest.mark.parametrize("kind, case, make, exc, fragments", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_input_is_a_clear_error(models, kind, case, make, exc, fragments):
    model = models[kind]
    kw = {"condition": torch.randint(0, 7, (2, 3))} if kind == "cond_nac" else {}
    with pytest.raises(exc) as e:
        model(make(), **kw)
    msg = str(e.value)
    assert msg.startswith("x: ") and all(f in msg for f in fragments), msg
    assert torch.isfinite(model(good(kind), **kw)).all()   # the model itself is fine


COND_CASES = [
    ("missing", None, ValueError, ["conditional circuit generator", "condition=c"]),
    ("id_too_large", torch.tensor([[1, 2, 7], [0, 1, 2]]), ValueError, ["condition: token id 7", "vocab_size=7"]),
    ("id_negative", torch.tensor([[1, -1, 2], [0, 1, 2]]), ValueError, ["condition: token id -1"]),
    ("float_ids", torch.rand(2, 3), TypeError, ["condition: ", "integer token ids", "float32"]),
    ("too_long", torch.randint(0, 7, (2, 5)), ValueError, ["condition: sequence length 5 exceeds max_len 4"]),
    ("batch_mismatch", torch.randint(0, 7, (3, 3)), ValueError, ["same samples", "3 conditions for 2 inputs"]),
    ("empty", torch.zeros(2, 0, dtype=torch.long), ValueError, ["condition: ", "N=0"]),
    ("numpy", np.zeros((2, 3), dtype=np.int64), TypeError, ["condition: ", "torch.Tensor", "numpy.ndarray"]),
]


@pytest.mark.parametrize("case, condition, exc, fragments", COND_CASES, ids=[c[0] for c in COND_CASES])
def test_bad_condition_is_a_clear_error(models, case, condition, exc, fragments):
    with pytest.raises(exc) as e:
        models["cond_nac"](good("cond_nac"), condition=condition)
    assert all(f in str(e.value) for f in fragments), str(e.value)


def test_unexpected_condition_is_refused(models):
    with pytest.raises(ValueError, match="unconditional circuit generator: it takes no condition"):
        models["token_nac"](good("token_nac"), condition=torch.zeros(2, 3, dtype=torch.long))


def test_narrow_integer_ids_are_read_as_int64(models):
    ids = good("token_nac")
    model = models["token_nac"]
    torch.testing.assert_close(model(ids.to(torch.uint8)), model(ids))
    torch.testing.assert_close(model(ids.int()), model(ids))


def test_half_input_is_accepted_under_autocast(models):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = models["pio"](good("pio").bfloat16())
    assert torch.isfinite(out).all()


def test_value_checks_are_skipped_while_compiling(monkeypatch, models):
    # Under torch.compile the data-dependent checks are skipped (is_compiling() is True while
    # tracing); here we stand in for the tracer, so a NaN input passes the entry check.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    out = models["pio"](with_value(good("pio"), math.nan))
    assert torch.isnan(out).any()
    with pytest.raises(ValueError, match=r"\[B, N, 8\]"):       # shape checks stay
        models["pio"](torch.randn(2, 4, 9))


def test_a_dict_batch_passed_whole_says_to_pass_it_as_keywords():
    # the batches of a multi-input task are dicts; model(batch) used to say only "got builtins.dict"
    import modwire

    model = modwire.create_model("nac_conditional_micro").eval()
    batch = {"x": torch.randn(2, 5, 8), "condition": torch.randint(0, 4, (2, 3))}
    with pytest.raises(TypeError, match=r"got a dict with keys \['condition', 'x'\]; .* model\(\*\*batch\)"):
        model(batch)
    assert model(**batch).shape == (2, 5)


@pytest.mark.parametrize("preset", ["nac_micro", "perceiver_io_micro"])
def test_a_sample_of_padding_only_is_an_empty_token_set(preset):
    # it used to give finite logits: a prediction read from no tokens at all
    model = modwire.create_model(preset, tokenizer={"kind": "embedding", "vocab_size": 16, "max_len": 10,
                                                    "pad_id": 0}).eval()
    with pytest.raises(ValueError, match=r"x: sample\(s\) \[1\] hold only padding \(pad_id=0\)"):
        model(torch.tensor([[1, 2, 3], [0, 0, 0]]))
    assert torch.isfinite(model(torch.tensor([[1, 2, 3], [4, 0, 0]]))).all()
