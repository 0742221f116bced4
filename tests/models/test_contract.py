"""The contract every registered preset keeps (in the style of timm's ``test_models.py``):
it builds; the example input its config declares (``ModelConfig.example_inputs``; no branching on
the model type here) gives finite logits of the shape it declares (``output_shape``); backward gives
finite gradients to every trainable parameter (all of them are used); save_pretrained /
from_pretrained gives identical eval outputs; two eval forwards are equal; every name in
``no_weight_decay()`` is a parameter's full name; the config survives JSON; ``forward_record`` on the
same inputs gives the model's declared record type, with the forward's logits and only its family's fields.

The paper-sized presets (``BIG``) are checked on the ``meta`` device in the default run
(construction, shapes, gradient flow; no arithmetic); their real CPU forward, backward and
round trip are marked slow."""
import copy
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

import modwire
from modwire.models.base import MODEL_TYPES
from modwire.models.capabilities import Records

PRESETS = modwire.list_models()
BIG = {"nac_tiny_imagenet", "nac_imagenet", "perceiver_io_tiny_imagenet", "nac_conditional_nlvr2",
       "ait_small", "ait_medium", "ait_base",  # aliases of ait_*_cifar10
       "transformer_lm_wikitext2", "nfm_transformer_lm_wikitext2",
       *[n for n in PRESETS if n.startswith(("vit_medium_", "vit_base_", "ait_medium_", "ait_base_", "ni_pgm_"))
         or n.endswith("_pet")
         or (n.startswith(("preact_resnet", "nfm_preact_resnet")) and not n.endswith("_micro"))]}
REAL = [pytest.param(name, marks=pytest.mark.slow) if name in BIG else name for name in PRESETS]
BATCH = 2


def expected_shape(config, batch=BATCH):
    """The shape the preset declares for its example input (``ModelConfig.output_shape``)."""
    return config.output_shape(config.example_inputs(batch, device="meta"))


def make_inputs(config, batch=BATCH, *, device="cpu", seed=0):
    """``(x, kwargs)`` for ``model(x, **kwargs)``: the example input the preset declares
    (``ModelConfig.example_inputs``), its first input apart."""
    inputs = config.example_inputs(batch, device=device, seed=seed)
    return inputs.pop(config.input_names()[0]), inputs


@pytest.fixture(scope="module")
def build():
    """``build(name)``: a fresh copy of the preset (each built once per module, seed 0)."""
    cache = {}

    def get(name):
        if name not in cache:
            torch.manual_seed(0)
            cache[name] = modwire.create_model(name)
        return copy.deepcopy(cache[name])

    yield get
    cache.clear()


def test_big_presets_are_registered():
    assert BIG <= set(PRESETS)  # a renamed preset would otherwise silently lose its checks


# ----------------------------------------------------------------------------- every preset, no arithmetic

@pytest.mark.parametrize("name", PRESETS)
def test_config_json_round_trip(name):
    cfg = modwire.get_config(name)
    again = type(cfg).from_json(cfg.to_json())
    assert again == cfg
    assert json.loads(cfg.to_json())["model_type"] == cfg.model_type


@pytest.mark.parametrize("name", PRESETS)
def test_builds_on_meta_with_output_shape_and_gradient_flow(name):
    with torch.device("meta"):
        model = modwire.create_model(name).train()
        x, kwargs = make_inputs(model.config, device="meta")
        logits = model(x, **kwargs)
        assert logits.shape == expected_shape(model.config)
        (logits.sum() + sum(model.auxiliary_losses().values())).backward()
    assert model.num_parameters() > 0
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert no_grad == []


@pytest.mark.parametrize("name", PRESETS)
def test_no_weight_decay_names_existing_parameters(name):
    with torch.device("meta"):
        model = modwire.create_model(name)
    names = {n for n, _ in model.named_parameters()}
    assert [n for n in model.no_weight_decay() if n not in names] == []     # full names (timm's convention)


# ----------------------------------------------------------------------------- real forward and backward (CPU)

@pytest.mark.parametrize("name", REAL)
def test_forward_gives_finite_logits_and_eval_is_deterministic(name, build):
    model = build(name).eval()
    x, kwargs = make_inputs(model.config)
    with torch.no_grad():
        logits = model(x, **kwargs)
        again = model(x, **kwargs)
    assert logits.shape == expected_shape(model.config)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    torch.testing.assert_close(again, logits, atol=0, rtol=0)   # two eval forwards are equal


@pytest.mark.parametrize("name", REAL)
def test_output_dtype_is_the_parameters_under_autocast(name, build):
    """Issue 36, item 6: one convention for every family: under bf16 autocast an fp32 model returns fp32
    (a Linear head would return bf16, an einsum head fp32 on the CPU), close to its fp32 output, and so
    do its ``forward_record`` logits; a bf16 model returns bf16."""
    model = build(name).eval()
    x, kwargs = make_inputs(model.config)
    with torch.no_grad():
        full = model(x, **kwargs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = model(x, **kwargs)
            if isinstance(model, Records):                      # its logits too
                assert model.forward_record(x, **kwargs).logits.dtype == torch.float32
        assert mixed.dtype == torch.float32 and mixed.shape == full.shape
        assert (mixed - full).abs().max() <= 0.1 * full.abs().max() + 0.1      # bf16 arithmetic, same model
        half = model.to(torch.bfloat16)
        x16 = x.to(torch.bfloat16) if x.is_floating_point() else x
        kw16 = {k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v
                for k, v in kwargs.items()}
        assert half(x16, **kw16).dtype == torch.bfloat16


@pytest.mark.parametrize("name", REAL)
def test_backward_gives_finite_gradients_to_every_trainable_parameter(name, build):
    model = build(name).train()
    x, kwargs = make_inputs(model.config)
    out = model(x, **kwargs)
    loss = F.cross_entropy(out, torch.arange(BATCH) % out.shape[1]) if out.dim() == 2 and out.shape[1] > 1 \
        else out.square().mean()
    loss = loss + sum(model.auxiliary_losses().values())     # part of the objective (e.g. a GAN's InfoMax term)
    assert torch.isfinite(loss)
    loss.backward()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable
    assert [n for n, p in trainable.items() if p.grad is None] == []
    assert [n for n, p in trainable.items() if not torch.isfinite(p.grad).all()] == []


@pytest.mark.parametrize("name", REAL)
def test_save_load_round_trip_gives_identical_eval_outputs(name, build, tmp_path):
    model = build(name).eval()
    model.save_pretrained(tmp_path)
    loaded = modwire.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model) and loaded.config == model.config
    x, kwargs = make_inputs(model.config)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, **kwargs), model(x, **kwargs), atol=0, rtol=0)


# ----------------------------------------------------------------------------- records (issue 37, item 5)

# Each family's record: its fields, written out (a field of another family must not appear).
_PIO = {"logits", "states", "read_in_attention", "propagator_attention", "read_out_attention", "readout_confidence"}
_SET = {"logits", "states", "propagator_attention"}
_NFM = {"logits", "states", "nfm"}
RECORD_FIELDS = {"perceiver_io": _PIO, "nac": _PIO | {"link_probs", "readout_link_probs", "circuit"},
                 "vit": _SET, "neural_interpreter": _SET | {"compatibility", "types"}, "ait": _SET | {"workspace"},
                 "transformer_lm": _NFM, "preact_resnet": _NFM, "cnn_mlp": _NFM}
ALL_FIELDS = set().union(*RECORD_FIELDS.values())


def test_every_recording_model_type_declares_its_record_type():
    recording = {t for t, cls in MODEL_TYPES.items() if issubclass(cls, Records)}
    assert recording == set(RECORD_FIELDS)                                 # the GAN records nothing
    for t in recording:
        record_type = MODEL_TYPES[t].record_type
        assert {f.name for f in dataclasses.fields(record_type)} == RECORD_FIELDS[t], t
    assert [t for t, cls in MODEL_TYPES.items() if t not in recording and hasattr(cls, "record_type")] == []


@pytest.mark.parametrize("name", REAL)
def test_forward_record_gives_the_declared_record_with_the_forward_logits(name, build):
    """``model.forward_record(**inputs)`` on the preset's example inputs (``x`` and the config's other
    ``input_names()``, nothing else): an instance of ``record_type`` whose logits are ``model(**inputs)``'s
    (eval mode) and whose fields are its family's alone (a ViT's record has no ``workspace``, no
    ``link_probs``)."""
    model = build(name).eval()
    t = model.config.model_type
    if t not in RECORD_FIELDS:
        assert not isinstance(model, Records)
        return
    inputs = model.config.example_inputs(BATCH)
    with torch.no_grad():
        rec = model.forward_record(**inputs)
        logits = model(**inputs)
    assert type(rec) is type(model).record_type
    assert set(vars(rec)) == RECORD_FIELDS[t]
    assert [f for f in ALL_FIELDS - RECORD_FIELDS[t] if hasattr(rec, f)] == []
    # the record's attention weights come from the explicit softmax, the forward's from fused kernels
    torch.testing.assert_close(rec.logits, logits, atol=1e-5, rtol=1e-5)
