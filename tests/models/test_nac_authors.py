"""Whole models against the authors' (issue 35, item 6): the literal float64 re-statements of the
NAC authors' final NAC and of their Perceiver IO (``tests/reference/authors_nac.py``) with their
weights copied into modwire, name by name. Equal to ≤ 1e-10 in evaluation (kernel "expected", their
``no_sample``) and in a training forward whose Concrete noise is the same draw on both sides.

The options that make modwire's NAC their model: ``initial_state="code"`` (their LatentSeeder with
``use_code_as_mean_state``), ``read_in_codes="separate"`` (their "input latents"), ``qv_bias=False``
(``qkv_bias: false``), ``head_dim`` and one read-in and one read-out head (their defaults), no
read-out LayerNorm (the default). Their parameters that modwire does not have are exactly the ones
that change no output: the key biases and the confidence bias (a softmax cancels each) and the
input latents' signatures (never read)."""
from __future__ import annotations

import pytest
import torch

import modwire
from modwire.models import NACConfig, PerceiverIOConfig
from modwire.models.tokenizer_config import TokenizerConfig
from modwire.models.tokenizer_config import build_tokenizer
from modwire.nn.init import single_thread
from modwire.models.nac import NAC, KernelConfig
from modwire.models.perceiver_io import PerceiverIO
from reference.authors_nac import (NACDims, PIODims, TokenizerDims, is_buffer, nac_forward, nac_parameters,
                                   pio_forward, pio_parameters, tokenizer_forward, tokenizer_parameters)

TOL = dict(atol=1e-10, rtol=1e-10)
DIMS = NACDims(state=8, code=8, sig=5, token=6, hidden=10, processors=6, outputs=3, layers=2, heads=3,
               read_in_heads=1, read_out_heads=1, head_dim=4, classes=5)   # inner widths 12, 4, 4 ≠ d 8
EPSILON, TAU, IN_DIM, BATCH = 0.7, 0.5, 7, 2


def nac_config(**overrides) -> NACConfig:
    d = DIMS
    return NACConfig(**{**dict(
        num_classes=d.classes, tokenizer=TokenizerConfig(kind="linear", input_dim=IN_DIM, token_dim=d.token),
        d_model=d.state, num_layers=d.layers, num_processor_modules=d.processors, num_output_modules=d.outputs,
        num_heads=d.heads, read_in_heads=d.read_in_heads, read_out_heads=d.read_out_heads, head_dim=d.head_dim,
        ffn_hidden=d.hidden, d_sig=d.sig, d_code=d.code, initial_state="code", read_in_codes="separate",
        qv_bias=False, kernel=KernelConfig(epsilon=EPSILON, tau=TAU)), **overrides})


def _modfc(ours: str, theirs: str) -> dict[str, str]:
    return {ours + ".weight": theirs + ".native_weight", ours + ".bias": theirs + ".native_bias",
            ours + ".code_proj": theirs + ".scale.weight", ours + ".alpha": theirs + ".scale_gain"}


def _ln(ours: str, theirs: str) -> dict[str, str]:
    return {ours + ".weight": theirs + ".weight", ours + ".bias": theirs + ".bias"}


def _block(ours: str, theirs: str, attention: str, sender_ln: str | None) -> dict[str, str]:
    """A modwire ReadIn / TransformerBlock / ReadOut from their read-in / propagator / read-out."""
    a = f"{theirs}.{attention}"
    names = {**_ln(ours + ".attn.norm", a + ".receiver_layernorm"),
             **_ln(ours + ".ffn.norm", theirs + ".ffn.layernorm"),
             **_modfc(ours + ".ffn.fn.fc1", theirs + ".ffn.ffn.0"),
             **_modfc(ours + ".ffn.fn.fc2", theirs + ".ffn.ffn.2")}
    if sender_ln is not None:
        names.update(_ln(ours + ".attn.norm_context", f"{a}.{sender_ln}"))
    for ours_proj, theirs_proj in (("q", "query"), ("k", "key"), ("v", "value")):
        names.update(_modfc(f"{ours}.attn.fn.{ours_proj}", f"{a}.{theirs_proj}_compiler"))
    names.update(_modfc(ours + ".attn.fn.o", a + ".exit_layer"))
    return names


def nac_names(layers: int) -> dict[str, str]:
    """modwire parameter name → their parameter name."""
    lg = "latent_graphs.0"
    names = {"generator.processors.signatures": f"{lg}.mediator_latents.signatures_",
             "generator.processors.codes": f"{lg}.mediator_latents.codes_",
             "generator.processors.read_in_codes": f"{lg}.input_latents.codes_",
             "generator.outputs.signatures": f"{lg}.output_latents.signatures_",
             "generator.outputs.codes": f"{lg}.output_latents.codes_",
             "read_out.confidence.weight": "output_tokenizer.confidence_scorer.weight",
             "read_out.head.weight": "output_tokenizer.to_logits.weight",
             "read_out.head.bias": "output_tokenizer.to_logits.bias",
             **_block("read_in", f"{lg}.read_in", "read_in_attention", "sender_layernorm"),
             **_block("read_out", f"{lg}.read_out", "latent_attention", "sender_layernorm")}
    for i in range(layers):
        names.update(_block(f"propagators.{i}", f"{lg}.propagators.{i}", "latent_attention", None))
    return names


def copy_across(model: torch.nn.Module, theirs: dict[str, torch.Tensor], names: dict[str, str]) -> set[str]:
    """Load ``theirs`` into ``model`` (float64) by ``names``; a modwire tensor they do not have must be
    a bias (set to 0: their layer has none). Returns their names that were not used."""
    state, used = {}, set()
    bandwidths = {n: v for n, v in theirs.items() if is_buffer(n)}
    for name, ours in model.state_dict().items():
        if name.startswith(("tokenizer.", "read_out.norm.")):   # the test's own tokens; the option's LN as built
            state[name] = ours
            continue
        if name == "kernel.log_epsilon":                   # one ε for every kernel; theirs: one buffer each
            assert len({float(v) for v in bandwidths.values()}) == 1
            state[name], _ = torch.log(next(iter(bandwidths.values()))), used.update(bandwidths)
            continue
        source = names[name]
        if source in theirs:
            state[name], _ = theirs[source].reshape(ours.shape), used.add(source)
        else:
            assert name.endswith(".bias"), f"{name}: nothing of theirs maps to it"
            state[name] = torch.zeros_like(ours)
    model.load_state_dict(state, strict=True)
    return set(theirs) - used


def tokens_of(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The linear tokenizer, written out (their model takes ``tokenized_inputs``)."""
    return x @ model.tokenizer.proj.weight.T + model.tokenizer.proj.bias


def _nac(qkv_bias: bool, **overrides) -> tuple[NAC, dict, set]:
    torch.manual_seed(0)
    model = NAC(nac_config(**overrides)).double()
    theirs = nac_parameters(DIMS, seed=1, qkv_bias=qkv_bias, bandwidth=EPSILON)
    unused = copy_across(model, theirs, nac_names(DIMS.layers))
    return model, theirs, unused


def _x(seed: int = 2) -> torch.Tensor:
    return torch.randn(BATCH, 5, IN_DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("qkv_bias", [False, True], ids=["final_configs", "with_qkv_biases"])
def test_nac_equals_the_authors_final_nac_in_evaluation(qkv_bias):
    """``qkv_bias=True`` (their class default) maps onto modwire's ``qv_bias=True`` (the default):
    their key biases have nowhere to go and change nothing."""
    model, theirs, unused = _nac(qkv_bias, qv_bias=qkv_bias)
    dead = {"latent_graphs.0.input_latents.signatures_", "output_tokenizer.confidence_scorer.bias"}
    if qkv_bias:
        dead |= {n for n in theirs if n.endswith("key_compiler.native_bias")}
    assert unused == dead
    x = _x()
    ref = nac_forward(theirs, tokens_of(model, x), DIMS, tau=TAU)
    model.eval()
    inter = model.forward_record(x)
    torch.testing.assert_close(inter.logits, ref["logits"], **TOL)
    torch.testing.assert_close(model(x), ref["logits"], **TOL)                 # the fused path
    torch.testing.assert_close(inter.states, ref["states"], **TOL)
    torch.testing.assert_close(inter.readout_confidence, ref["confidences"], **TOL)
    torch.testing.assert_close(inter.read_in_attention, ref["read_in_attention"], **TOL)
    torch.testing.assert_close(inter.read_out_attention, ref["read_out_attention"], **TOL)
    for ours, their in zip(inter.propagator_attention, ref["propagator_attention"], strict=True):
        torch.testing.assert_close(ours, their, **TOL)
    # the copy is not trivially equal: the read-out LayerNorm (an option) changes every logit
    normed, _, _ = _nac(qkv_bias, qv_bias=qkv_bias, read_out_norm=True)
    assert (normed.eval()(x) - ref["logits"]).abs().min() > 1e-3


def test_nac_equals_the_authors_final_nac_in_a_training_forward_with_the_same_concrete_noise():
    """modwire draws one uniform ``[B, U, V]`` per kernel (each propagator, then the read-out) from
    torch's generator; the same draws, re-made from the same seed, are their RelaxedBernoulli's ``u``."""
    model, theirs, _ = _nac(False)
    x = _x()
    model.train()
    torch.manual_seed(5)
    logits = model(x)
    torch.manual_seed(5)
    shapes = [(BATCH, DIMS.processors, DIMS.processors)] * DIMS.layers + [(BATCH, DIMS.outputs, DIMS.processors)]
    uniforms = [torch.empty(s, dtype=torch.float64).uniform_() for s in shapes]
    assert all(((u > 1e-6) & (u < 1 - 1e-6)).all() for u in uniforms)   # neither side's clamp of u acts
    ref = nac_forward(theirs, tokens_of(model, x), DIMS, tau=TAU, uniforms=uniforms)
    torch.testing.assert_close(logits, ref["logits"], **TOL)
    eval_ref = nac_forward(theirs, tokens_of(model, x), DIMS, tau=TAU)
    assert (ref["logits"] - eval_ref["logits"]).abs().max() > 1e-4      # the noise did something


PIO_DIMS = PIODims(latent=8, token=6, latents=6, depth=2, latent_heads=3, cross_heads=1, dim_head=4, ffn_mult=4,
                   classes=5)


def pio_names(depth: int) -> dict[str, str]:
    """modwire parameter name → their name (``to_kv`` is split into k and v below)."""
    def attn(ours, theirs, context):
        names = {**_ln(ours + ".attn.norm", theirs + ".norm"),
                 ours + ".attn.fn.q.weight": theirs + ".fn.to_q.weight",
                 ours + ".attn.fn.o.weight": theirs + ".fn.to_out.weight",
                 ours + ".attn.fn.o.bias": theirs + ".fn.to_out.bias"}
        if context:
            names.update(_ln(ours + ".attn.norm_context", theirs + ".norm_context"))
        return names

    def ffn(ours, theirs):
        return {**_ln(ours + ".ffn.norm", theirs + ".norm"),
                **{f"{ours}.ffn.fn.fc{i}.{w}": f"{theirs}.fn.net.{j}.{w}" for i, j in ((1, 0), (2, 2))
                   for w in ("weight", "bias")}}

    names = {"latents": "latents", "output_queries": "classification_query",
             "read_out.head.weight": "to_logits.weight", "read_out.head.bias": "to_logits.bias",
             **attn("read_in", "cross_attend_blocks.0", True), **ffn("read_in", "cross_attend_blocks.1"),
             **attn("read_out", "decoder_cross_attn", True), **ffn("read_out", "decoder_ff")}
    for i in range(depth):
        names.update({**attn(f"propagators.{i}", f"layers.{i}.0", False), **ffn(f"propagators.{i}", f"layers.{i}.1")})
    return names


def _pio(**overrides) -> tuple[PerceiverIO, dict]:
    d = PIO_DIMS
    torch.manual_seed(0)
    model = PerceiverIO(PerceiverIOConfig(**{**dict(
        num_classes=d.classes, tokenizer=TokenizerConfig(kind="linear", input_dim=IN_DIM, token_dim=d.token),
        d_model=d.latent, num_layers=d.depth, num_latents=d.latents, num_heads=d.latent_heads,
        read_in_heads=d.cross_heads, read_out_heads=d.cross_heads, head_dim=d.dim_head,
        ffn_hidden=d.latent * d.ffn_mult), **overrides})).double()
    theirs = dict(pio_parameters(d, seed=3))
    for name in [n for n in theirs if n.endswith("to_kv.weight")]:   # their fused [k; v] projection
        k, v = theirs.pop(name).chunk(2, dim=0)
        theirs[name.replace("to_kv", "to_k")], theirs[name.replace("to_kv", "to_v")] = k, v
    names = pio_names(d.depth)
    for ours in [n for n in model.state_dict() if n.endswith((".fn.k.weight", ".fn.v.weight"))]:
        names[ours] = names[ours.replace(".fn.k.", ".fn.q.").replace(".fn.v.", ".fn.q.")].replace(
            "to_q", "to_k" if ".fn.k." in ours else "to_v")
    assert copy_across(model, theirs, names) == set()
    return model, theirs


def _pio_reference(theirs: dict) -> dict:
    """Their parameters with ``to_kv`` fused again, as their module holds it."""
    fused = dict(theirs)
    for name in [n for n in theirs if n.endswith("to_k.weight")]:
        fused[name.replace("to_k", "to_kv")] = torch.cat([fused.pop(name), fused.pop(name.replace("to_k", "to_v"))])
    return fused


def test_perceiver_io_equals_the_authors_perceiver_io():
    model, theirs = _pio()
    x = _x(4)
    ref = pio_forward(_pio_reference(theirs), tokens_of(model, x), PIO_DIMS)
    model.eval()
    torch.testing.assert_close(model(x), ref["logits"], **TOL)
    inter = model.forward_record(x)
    torch.testing.assert_close(inter.states, ref["states"], **TOL)
    torch.testing.assert_close(inter.logits, ref["logits"], **TOL)
    normed, _ = _pio(read_out_norm=True)                                # the option changes the logits
    assert (normed.eval()(x) - ref["logits"]).abs().min() > 1e-3


def tokenizer_names(grid: int) -> dict[str, str]:
    """modwire ``ConvTokenizer`` (``conv_down_norm: before``) parameter name → theirs
    (``ConvNeXtImageTokenizer``); the positions ``[g², pos_dim]`` are their grid ``[pos_dim, g, g]``."""
    bb, blk = "backbone.downsample_layers", "backbone.stages.0.0"
    names = {"pos": "positional_grid.grid", "block.layer_scale": blk + ".gamma"}
    for ours, theirs in (("stem.0", bb + ".0.0"), ("stem.1", bb + ".0.1"), ("block.dwconv", blk + ".dwconv"),
                         ("block.norm1", blk + ".norm"), ("block.fc1", blk + ".pwconv1"),
                         ("block.fc2", blk + ".pwconv2"), ("down.0", bb + ".1.0"), ("down.1", bb + ".1.1")):
        names.update({ours + ".weight": theirs + ".weight", ours + ".bias": theirs + ".bias"})
    return names


@pytest.mark.parametrize("preset", ["nac_tiny_imagenet", "perceiver_io_tiny_imagenet", "nac_imagenet"])
def test_conv_tokenizer_equals_the_authors_convnext_tokenizer(preset):
    """The preset's tokenizer (its widths, layer scale, eps) with the authors' LayerNorm placement
    (``conv_down_norm: before``, ``conv_block_norms: 1``) and their weights copied across equals
    their ``ConvNeXtImageTokenizer`` at ``repr_dim = d_model`` (``femto``, 2 stages) to ≤ 1e-10, on
    16×16 images (2×2 tokens; their grid sized to match)."""
    config = modwire.get_config(preset)
    dims = TokenizerDims(repr_dim=config.d_model, in_channels=3, pos_dim=config.tokenizer.pos_dim, grid=2)
    cfg = config.tokenizer.merged({"image_size": 16, "conv_down_norm": "before", "conv_block_norms": 1})
    assert (cfg.stem_channels, cfg.conv_channels) == (dims.repr_dim // 4, dims.repr_dim // 2)  # their widths
    tok = build_tokenizer(cfg).double()
    theirs = tokenizer_parameters(dims, seed=4)
    names = tokenizer_names(dims.grid)
    state = {n: theirs[names[n]].reshape(v.shape) if n != "pos" else
             theirs[names[n]].flatten(1).T for n, v in tok.state_dict().items()}
    tok.load_state_dict(state, strict=True)
    assert set(names.values()) == set(theirs)                      # every parameter of theirs is used
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with single_thread():   # torch's float64 depthwise conv stalls for seconds on busy cores with 2 threads
        ours = tok(x)
    torch.testing.assert_close(ours, tokenizer_forward(theirs, x), **TOL)
