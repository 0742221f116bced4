"""The contract every registered preset keeps (in the style of timm's ``test_models.py``):
it builds; a valid input made from its config (and, for a conditional NAC, a condition made
from its generator's tokenizer config) gives finite logits ``[B, num_classes]``; backward gives
finite gradients to every trainable parameter (all of them are used); save_pretrained /
from_pretrained gives identical eval outputs; two eval forwards are equal; every name in
``no_weight_decay()`` is a parameter's full name; the config survives JSON.

The paper-sized presets (``BIG``) are checked on the ``meta`` device in the default run
(construction, shapes, gradient flow; no arithmetic); their real CPU forward, backward and
round trip are marked slow."""
import copy
import json

import pytest
import torch
import torch.nn.functional as F

import modwire

PRESETS = modwire.list_models()
BIG = {"nac_tiny_imagenet", "nac_imagenet", "perceiver_io_tiny_imagenet", "nac_conditional_nlvr2",
       "ait_small", "ait_medium", "ait_base",  # aliases of ait_*_cifar10
       "transformer_lm_wikitext2", "nfm_transformer_lm_wikitext2",
       *[n for n in PRESETS if n.startswith(("vit_medium_", "vit_base_", "ait_medium_", "ait_base_", "ni_pgm_"))
         or n.endswith("_pet")
         or (n.startswith(("preact_resnet", "nfm_preact_resnet")) and not n.endswith("_micro"))]}
REAL = [pytest.param(name, marks=pytest.mark.slow) if name in BIG else name for name in PRESETS]
BATCH = 2


def make_input(tok, batch, *, device="cpu", seed=0):
    """A valid input for a tokenizer config: images ``[B, C, S, S]`` (conv), sets ``[B, N, input_dim]``
    (linear) or ids ``[B, N]`` < vocab_size (embedding); ``N`` within ``max_len`` when positions are learned."""
    g = None if device == "meta" else torch.Generator(device).manual_seed(seed)
    n = min(5, tok.max_len) if tok.max_len > 0 else 5
    if tok.kind == "conv":
        return torch.randn(batch, tok.in_channels, tok.image_size, tok.image_size, generator=g, device=device)
    if tok.kind == "linear":
        return torch.randn(batch, n, tok.input_dim, generator=g, device=device)
    if tok.kind == "embedding":
        return torch.randint(0, tok.vocab_size, (batch, n), generator=g, device=device)
    raise AssertionError(f"no test input for tokenizer kind {tok.kind!r}")


def make_set_input(embed, batch, *, device="cpu", seed=0):
    """A valid ``x`` for a set model's embedding (ViT, NI): images / PGM panels ``[B, C, S, S]`` or
    vectors ``[B, N, input_dim]``."""
    g = None if device == "meta" else torch.Generator(device).manual_seed(seed)
    if embed.kind in ("patches", "panels"):
        return torch.rand(batch, embed.in_channels, embed.image_size, embed.image_size, generator=g, device=device)
    n = min(5, embed.max_len) if embed.max_len > 0 else 5
    return torch.randn(batch, n, embed.input_dim, generator=g, device=device)


def expected_shape(config, batch=BATCH):
    """``[B, num_classes]``; a PGM set model ``[B, candidates]``; several CLS tokens of one output
    each (NI §4.1) ``[B, T]``."""
    if config.model_type == "transformer_lm":                # next-token logits at every position
        return (batch, min(5, config.max_len), config.vocab_size)
    embed = getattr(config, "embed", None)
    if embed is not None and embed.kind == "panels":
        return (batch, embed.in_channels - embed.num_context)
    if embed is not None and config.num_cls_tokens > 1 and not config.task_input:
        return (batch, config.num_cls_tokens) if config.num_classes == 1 else \
            (batch, config.num_cls_tokens, config.num_classes)
    return (batch, config.num_classes)


def make_inputs(config, batch=BATCH, *, device="cpu", seed=0):
    """``(x, kwargs)`` for ``model(x, **kwargs)``."""
    if config.model_type == "cnn_mlp":                       # CNN_MLP (NFM §4.3): an image and a question vector
        g = None if device == "meta" else torch.Generator(device).manual_seed(seed)
        x = torch.rand(batch, config.in_channels, config.image_size, config.image_size, generator=g, device=device)
        q = torch.rand(batch, 1, config.question_dim, generator=g, device=device) if config.question_dim else None
        return x, ({"question": q} if q is not None else {})
    if config.model_type == "transformer_lm":                # token ids [B, T]
        g = None if device == "meta" else torch.Generator(device).manual_seed(seed)
        return torch.randint(0, config.vocab_size, (batch, min(5, config.max_len)), generator=g, device=device), {}
    if config.model_type == "gan":                           # latents z [B, latent_dim] (models/gan.py)
        g = None if device == "meta" else torch.Generator(device).manual_seed(seed)
        return torch.randn(batch, config.latent_dim, generator=g, device=device), {}
    if getattr(config, "embed", None) is not None:          # a set model (ViT, NI, AiT)
        kwargs = {"task": torch.arange(batch, device=device) % config.num_cls_tokens} if config.task_input else {}
        if config.question_dim:                              # AiT §5.8's question token
            g = None if device == "meta" else torch.Generator(device).manual_seed(seed + 1)
            kwargs["question"] = torch.randn(batch, 1, config.question_dim, generator=g, device=device)
        return make_set_input(config.embed, batch, device=device, seed=seed), kwargs
    if getattr(config, "tokenizer", None) is None and hasattr(config, "image_size"):   # a CNN (PreActResNet)
        g = None if device == "meta" else torch.Generator(device).manual_seed(seed)
        size = (batch, config.in_channels, config.image_size, config.image_size)
        return torch.rand(*size, generator=g, device=device), {}
    kwargs = {}
    generator = getattr(config, "generator", None)
    if generator is not None and generator.kind == "conditional":
        kwargs["condition"] = make_input(generator.tokenizer, batch, device=device, seed=seed + 1)
    return make_input(config.tokenizer, batch, device=device, seed=seed), kwargs


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
    (a Linear head would return bf16, an einsum head fp32 on the CPU), close to its fp32 output; a bf16
    model returns bf16."""
    model = build(name).eval()
    x, kwargs = make_inputs(model.config)
    with torch.no_grad():
        full = model(x, **kwargs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = model(x, **kwargs)
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
