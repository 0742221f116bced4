"""Parameter counts of NAC and Perceiver IO, component by component (issue 35, item 5): modwire's
counts against formulas written here from the papers' layer definitions (never read from the
model), the NAC authors' counts against their parameter layout (``tests/reference/authors_nac.py``)
at NAC Table 4's sizes, and the table in docs/nac.md against both."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import modwire
from reference.authors_nac import (NACDims, PIODims, TokenizerDims, is_buffer, nac_parameters, pio_parameters,
                                   tokenizer_parameters)

DOC = Path(__file__).resolve().parents[2] / "docs" / "nac.md"


# ----------------------------------------------------------------------------- formulas

def linear(d_in: int, d_out: int, bias: bool = True) -> int:
    return d_out * d_in + (d_out if bias else 0)


def modfc(d_in: int, d_out: int, d_code: int, bias: bool = True) -> int:
    """NAC Eq. 1: W, b (if any), W_c ``[d_in, d_code]``, α."""
    return linear(d_in, d_out, bias) + d_in * d_code + 1


def layer_norm(d: int) -> int:
    return 2 * d


def conv_tokenizer(c) -> int:
    """modwire's App. C preprocessor: conv 4/4 to C₁ + LN, ConvNeXt block at C₁ (7×7 depthwise, LN,
    C₁→4C₁, GELU, LN unless ``conv_block_norms`` is 1, 4C₁→C₁, a layer scale unless 0), conv 2/2 to
    C₂ with a LN after it (at C₂) or before it (at C₁), learned positions."""
    t = c.tokenizer
    c1, c2 = t.stem_channels, t.conv_channels
    block = (49 * c1 + c1 + layer_norm(c1) + linear(c1, 4 * c1) + linear(4 * c1, c1)
             + (layer_norm(4 * c1) if t.conv_block_norms == 2 else 0) + (c1 if t.conv_layer_scale > 0 else 0))
    down = 4 * c1 * c2 + c2 + layer_norm(c2 if t.conv_down_norm == "after" else c1)
    return 16 * t.in_channels * c1 + c1 + layer_norm(c1) + block + down + (t.image_size // 8) ** 2 * t.pos_dim


def authors_tokenizer(d: int, in_channels: int = 3, pos_dim: int = 64, grid: int = 8) -> int:
    """Their ``ConvNeXtImageTokenizer`` (``capacity_preset: femto``, ``num_stages: 2``; widths
    ``d/4``, ``d/2``): conv 4/4 + LN, one ConvNeXt block (depthwise 7×7, LN, d1→4d1, GELU, 4d1→d1,
    layer-scale γ), LN + conv 2/2, a positional grid ``[pos_dim, grid, grid]``."""
    d1, d2 = d // 4, d // 2
    block = 49 * d1 + d1 + layer_norm(d1) + linear(d1, 4 * d1) + linear(4 * d1, d1) + d1
    stem, down = 16 * in_channels * d1 + d1 + layer_norm(d1), layer_norm(d1) + 4 * d1 * d2 + d2
    return stem + block + down + pos_dim * grid * grid


def modwire_counts(c) -> dict[str, int]:
    """modwire's components for a NAC or Perceiver IO config (read from the config only)."""
    nac = c.model_type == "nac"
    d, code = c.d_model, (c.d_code if nac else 0)
    modulated = nac and c.modulation == "nac"

    def proj(d_in, d_out, bias):
        return modfc(d_in, d_out, code, bias) if modulated else linear(d_in, d_out, bias)

    def attention(kv: int, heads: int, context: bool) -> int:
        inner = heads * (c.head_dim or d // heads)
        return (layer_norm(d) + (layer_norm(kv) if context else 0) + proj(d, inner, c.qv_bias)
                + proj(kv, inner, False) + proj(kv, inner, c.qv_bias) + proj(inner, d, True))

    h = c.ffn_hidden
    ffn = layer_norm(d) + proj(d, 2 * h if c.activation == "geglu" else h, True) + proj(h, d, True)
    t = c.tokenizer
    tok = conv_tokenizer(c) if t.kind == "conv" else linear(t.input_dim, t.token_dim) + t.max_len * t.token_dim
    token_dim = t.conv_channels + t.pos_dim if t.kind == "conv" else t.token_dim
    outputs = c.num_output_modules
    counts = {"tokenizer": tok,
              "read-in": attention(token_dim, c.read_in_heads, True) + ffn,
              "propagator (each)": attention(d, c.num_heads, False) + ffn,
              "read-out": attention(d, c.read_out_heads, True) + ffn + (layer_norm(d) if c.read_out_norm else 0),
              "pooling and head": (d if outputs > 1 else 0) + linear(d, c.num_classes)}
    if not nac:
        return {**counts, "latents": c.num_latents * d, "output queries": outputs * d}
    mlp = linear(code, d) + linear(d, d) if c.initial_state == "mlp" else 0       # §2.2: a two-layer MLP
    for group, n in (("processor", c.num_processor_modules), ("output", outputs)):
        counts.update({f"{group} signatures": n * c.d_sig if c.kernel.enabled else 0, f"{group} codes": n * code,
                       f"{group} initial-state MLP": mlp})
    counts["processor read-in codes"] = c.num_processor_modules * code if c.read_in_codes == "separate" else 0
    return counts


MODWIRE_PREFIXES = {  # component → parameter-name prefixes
    "tokenizer": ("tokenizer.",), "read-in": ("read_in.",), "propagator (each)": ("propagators.0.",),
    "read-out": ("read_out.attn.", "read_out.ffn.", "read_out.norm."),
    "pooling and head": ("read_out.confidence.", "read_out.head."),
    "processor signatures": ("generator.processors.signatures",), "processor codes": ("generator.processors.codes",),
    "processor read-in codes": ("generator.processors.read_in_codes",),
    "processor initial-state MLP": ("generator.processors.state_mlp.",),
    "output signatures": ("generator.outputs.signatures",), "output codes": ("generator.outputs.codes",),
    "output initial-state MLP": ("generator.outputs.state_mlp.",),
    "latents": ("latents",), "output queries": ("output_queries",)}


def grouped(named: dict[str, int], prefixes: dict[str, tuple[str, ...]]) -> dict[str, int]:
    """``{component: count}`` of ``named`` (name → numel); every name in exactly one component."""
    out = {k: 0 for k in prefixes}
    for name, n in named.items():
        hits = [k for k, pre in prefixes.items() if name.startswith(pre)]
        assert len(hits) <= 1, (name, hits)
        if hits:
            out[hits[0]] += n
    return out


def model_counts(name: str, **overrides) -> tuple[dict[str, int], int, object]:
    with torch.device("meta"):
        model = modwire.create_model(name, **overrides)
    named = {n: p.numel() for n, p in model.named_parameters()}
    layers = [sum(v for n, v in named.items() if n.startswith(f"propagators.{i}."))
              for i in range(model.config.num_layers)]
    assert len(set(layers)) == 1                            # every propagator the same size
    return grouped(named, MODWIRE_PREFIXES), sum(named.values()), model.config


# ----------------------------------------------------------------------------- the authors' layout

TABLE4_NAC = NACDims(state=384, code=384, sig=64, token=256, hidden=1536, processors=320, outputs=64, layers=8,
                     heads=6, read_in_heads=1, read_out_heads=1, head_dim=64, classes=200)
TABLE4_PIO = PIODims(latent=384, token=256, latents=320, depth=8, latent_heads=6, cross_heads=1, dim_head=64,
                     ffn_mult=4, classes=200)
AUTHORS_NAC_PREFIXES = {
    "tokenizer": ("input_tokenizer.",),
    "read-in": ("latent_graphs.0.read_in.",), "propagator (each)": ("latent_graphs.0.propagators.0.",),
    "read-out": ("latent_graphs.0.read_out.",), "pooling and head": ("output_tokenizer.",),
    "processor signatures": ("latent_graphs.0.mediator_latents.signatures_",),
    "processor codes": ("latent_graphs.0.mediator_latents.codes_",),
    "processor read-in codes": ("latent_graphs.0.input_latents.codes_",),
    "input latents' signatures": ("latent_graphs.0.input_latents.signatures_",),
    "output signatures": ("latent_graphs.0.output_latents.signatures_",),
    "output codes": ("latent_graphs.0.output_latents.codes_",)}
AUTHORS_PIO_PREFIXES = {
    "tokenizer": ("tokenizer.",),
    "latents": ("latents",), "read-in": ("cross_attend_blocks.",), "propagator (each)": ("layers.0.",),
    "read-out": ("decoder_cross_attn.", "decoder_ff."), "pooling and head": ("to_logits.",),
    "output queries": ("classification_query",)}


def authors_nac_formula(d: NACDims) -> dict[str, int]:
    """Their final NAC (``tests/reference/authors_nac.py``'s docstring), by formula."""
    s, c = d.state, d.code

    def attention(kv, heads, norms):   # q, k, v without bias, exit layer with bias; affine LayerNorms
        inner = heads * d.head_dim
        return norms + 2 * modfc(kv, inner, c, False) + modfc(s, inner, c, False) + modfc(inner, s, c)

    ffn = layer_norm(s) + modfc(s, 2 * d.hidden, c) + modfc(d.hidden, s, c)
    return {"tokenizer": authors_tokenizer(s),
            "read-in": attention(d.token, 1, layer_norm(s) + layer_norm(d.token)) + ffn,
            "propagator (each)": attention(s, d.heads, layer_norm(s)) + ffn,
            "read-out": attention(s, 1, 2 * layer_norm(s)) + ffn,
            "pooling and head": linear(s, 1) + linear(s, d.classes),
            "processor signatures": d.processors * d.sig, "processor codes": d.processors * c,
            "processor read-in codes": d.processors * c, "input latents' signatures": d.processors * d.sig,
            "output signatures": d.outputs * d.sig, "output codes": d.outputs * c}


def authors_pio_formula(d: PIODims) -> dict[str, int]:
    """Their Perceiver IO (``external/perceiver_io.py``), by formula."""
    s = d.latent

    def attention(kv, heads, context):     # to_q, to_kv without bias, to_out with bias
        inner = heads * d.dim_head
        norms = layer_norm(s) + (layer_norm(kv) if context else 0)
        return norms + linear(s, inner, False) + linear(kv, 2 * inner, False) + linear(inner, s)

    ffn = layer_norm(s) + linear(s, 2 * d.ffn_mult * s) + linear(d.ffn_mult * s, s)
    return {"tokenizer": authors_tokenizer(s), "latents": d.latents * s, "read-in": attention(d.token, 1, True) + ffn,
            "propagator (each)": attention(s, d.latent_heads, False) + ffn, "read-out": attention(s, 1, True) + ffn,
            "pooling and head": linear(s, d.classes), "output queries": s}


def authors_counts(params: dict, prefixes: dict) -> dict[str, int]:
    return grouped({n: v.numel() for n, v in params.items() if not is_buffer(n)}, prefixes)


def with_tokenizer(params: dict, prefix: str, state: int) -> dict:
    """Their model's parameters and their ``ConvNeXtImageTokenizer``'s at ``repr_dim = state``, 8×8."""
    return {**params, **{prefix + n: v for n, v in tokenizer_parameters(TokenizerDims(state), seed=None).items()}}


# ----------------------------------------------------------------------------- tests

AUTHORS_LAYER_NORMS = {"tokenizer": {"conv_down_norm": "before", "conv_block_norms": 1}}


@pytest.mark.parametrize("name, overrides", [
    ("nac_tiny_imagenet", {}), ("nac_imagenet", {}), ("perceiver_io_tiny_imagenet", {}),
    ("nac_tiny_imagenet", AUTHORS_LAYER_NORMS), ("perceiver_io_tiny_imagenet", {"tokenizer": {"conv_layer_scale": 0}}),
    ("nac_micro", {}), ("nac_small", {}), ("perceiver_io_micro", {}), ("perceiver_io_small", {}),
    ("nac_micro", {"initial_state": "code", "d_code": 32, "read_in_codes": "separate", "qv_bias": False,
                   "read_out_norm": True, "head_dim": None, "read_out_heads": 2}),
    ("perceiver_io_micro", {"qv_bias": True, "read_out_norm": True, "num_output_modules": 3})])
def test_modwire_counts_per_component_match_the_formulas(name, overrides):
    counts, total, config = model_counts(name, **overrides)
    formula = modwire_counts(config)
    assert counts == {k: formula.get(k, 0) for k in counts}
    per_layer = formula["propagator (each)"] * (config.num_layers - 1)       # the other propagators
    assert total == sum(formula.values()) + per_layer


def test_authors_counts_per_component_match_their_layout():
    nac = with_tokenizer(nac_parameters(TABLE4_NAC, seed=None), "input_tokenizer.", TABLE4_NAC.state)
    assert authors_counts(nac, AUTHORS_NAC_PREFIXES) == authors_nac_formula(TABLE4_NAC)
    pio = with_tokenizer(pio_parameters(TABLE4_PIO, seed=None), "tokenizer.", TABLE4_PIO.latent)
    assert authors_counts(pio, AUTHORS_PIO_PREFIXES) == authors_pio_formula(TABLE4_PIO)


@pytest.mark.parametrize("name", ["nac_tiny_imagenet", "perceiver_io_tiny_imagenet", "nac_imagenet"])
def test_tokenizer_with_their_layer_norms_has_their_count(name):
    """The presets' tokenizers are the authors' widths and details: with their LayerNorm placement
    (``conv_down_norm: before``, ``conv_block_norms: 1``) the count is theirs at ``repr_dim = d_model``
    and the tokens are as wide as theirs (``repr_dim / 2 + 64``)."""
    counts, _, config = model_counts(name, **AUTHORS_LAYER_NORMS)
    grid = config.tokenizer.image_size // 8
    assert counts["tokenizer"] == authors_tokenizer(config.d_model, grid=grid)
    assert config.tokenizer.conv_channels + config.tokenizer.pos_dim == config.d_model // 2 + 64


ROWS = ["tokenizer", "processor signatures", "processor codes", "processor read-in codes",
        "input latents' signatures", "processor initial-state MLP", "output signatures", "output codes",
        "output initial-state MLP", "read-in", "propagator (each)", "read-out", "pooling and head"]
PIO_ROWS = ["tokenizer", "latents", "read-in", "propagator (each)", "read-out", "output queries", "pooling and head"]


def table_rows() -> dict[str, list[tuple[str, int, int]]]:
    """The rows of docs/nac.md's parameter tables: (component, modwire, authors') and the totals."""
    nac_counts, _, nac_cfg = model_counts("nac_tiny_imagenet")
    pio_counts, _, pio_cfg = model_counts("perceiver_io_tiny_imagenet")
    out = {}
    for key, ours, theirs, rows, layers in (
            ("nac", nac_counts, authors_nac_formula(TABLE4_NAC), ROWS, nac_cfg.num_layers),
            ("pio", pio_counts, authors_pio_formula(TABLE4_PIO), PIO_ROWS, pio_cfg.num_layers)):
        table = [(r, ours.get(r, 0), theirs.get(r, 0)) for r in rows]
        def total(counts): return sum(counts.values()) + (layers - 1) * counts["propagator (each)"]
        out[key] = table + [("total", total(ours), total(theirs))]
    return out


def _doc_table(heading: str) -> list[tuple[str, int, int]]:
    text = DOC.read_text()
    block = text[text.index(heading):]
    rows = []
    for line in block.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        if re.fullmatch(r"[\d,]+", cells[1]):
            rows.append((cells[0], int(cells[1].replace(",", "")), int(cells[2].replace(",", ""))))
    return rows


@pytest.mark.parametrize("key, heading", [("nac", "Parameters of `nac_tiny_imagenet`"),
                                          ("pio", "Parameters of `perceiver_io_tiny_imagenet`")])
def test_docs_parameter_table_matches(key, heading):
    assert _doc_table(heading) == table_rows()[key]
