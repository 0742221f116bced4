"""Literal float64 re-statements of the NAC authors' whole released models, one module, head and
pair at a time, written from reading their code (``mweiss17/NeuralAttentiveCircuits``:
``model/nc/{core,block,attention,kernels,seeding,tokenizers,utils}.py``, ``utils.py``,
``model/external/perceiver_io.py``), never copied from it and importing nothing from modwire.

**NAC** (:func:`nac_forward`) in the configuration of their final templates
(``templates/INET-110E-NC-*-BARAL-X/Configurations/train_config.yml``: ImageNet, 110 epochs, the
scale-free prior; no released Tiny-ImageNet config has Table 4's 320 + 64 modules: ``TINY-INET-NC-X``
and ``nc_full_tiny_imnet.yml`` are an earlier design with 64 input and 256 mediator latents, layer
scale and code noise), at any sizes:

* ``LatentGraph`` with ``use_input_states_as_mediator_states``: the processor modules are their
  "mediator latents" (signature, code); a second group, the "input latents", has its own codes,
  which are the read-in's codes and, through ``LatentSeeder(use_code_as_mean_state=True,
  use_state_noise=False)``, the initial states (state = code); the input latents' signatures are
  never read (``disable_input_mediator_communication``, ``enable_input_output_communication:
  false``). Output latents: their own signatures and codes, initial state = code.
* ``ModFC`` (``utils.py``, ``add_one_to_scale``, ``learnable_scale_gain``, ``scale_gain`` 0.1):
  ``W (x ⊙ (1 + g·LN(W_c c))) + b``, LN without affine parameters (eps 1e-5), ``W_c`` without
  bias, a bias ``b`` unless the layer is a query/key/value projection (``qkv_bias: false``).
* ``AttentiveReadIn``: ``ReadInAttention`` (one head of ``head_dim`` 64; keys and values of every
  token conditioned on the *receiving* module's code; affine LayerNorms on both sides;
  ``include_residual_in_read_in_attention: true``; no layer scale) then ``ModFFN`` (GEGLU,
  pre-LN, residual).
* ``Propagator`` × L (no shared weights): ``KernelModulatedLatentAttention`` (``num_heads`` heads
  of ``head_dim``; one LayerNorm for receivers and senders, ``share_layernorm``; queries and the
  exit layer on the receiver's code, keys and values on the sender's; scores
  ``q·k/√head_dim + log K̂``) then ``ModFFN``; residuals, no layer scale, no drop-path.
* ``DotProductKernel`` (``stochastic_kernel``, temperature 0.5, fixed bandwidth, no truncation):
  ``d = 1 - n_i·n_j`` (``F.normalize``), ``log P = -d/ε``; in training ``K ~ RelaxedBernoulli(
  clamp(P, 0, 1), τ)`` drawn per example, ``log K``; in evaluation ``log K = log P``
  (``stochastic_eval_behaviour: no_sample``); then ``log K̂ = log K - logsumexp_j log K`` (no δ).
  torch's ``RelaxedBernoulli`` clamps ``P`` and ``u`` to ``[eps, 1-eps]`` and ``K`` to
  ``[tiny, 1-eps]`` (``torch.distributions.utils.clamp_probs``, ``SigmoidTransform``): written here.
* ``ReadOut``: a ``Propagator`` whose attention has no residual
  (``include_residual_in_latent_attention: false``), separate receiver/sender LayerNorms, one head
  of 64; ``use_head: false`` (no per-module head, so ``pre_output_layernorm`` has nothing to act on).
* ``OutputLatentPooling`` (``softmax_type: vanilla``, temperature 1): confidence ``w·y_o + b``
  (``nn.Linear(state_dim, 1)``), softmax over output modules, ``Σ_o conf_o y_o``, ``to_logits``.
* The tokenizer is bypassed through their ``tokenized_inputs`` path (``core.py``): the forward
  takes tokens ``[B, N, input_dim]``.

**Tokenizer** (:func:`tokenizer_forward`): their ``ConvNeXtImageTokenizer`` (``model/nc/tokenizers.py``,
``model/external/convnext.py``, ``model/nc/utils.py``'s ``PositionalGrid``) as App. C describes it and
their templates build it for 8×8 tokens (``capacity_preset: femto``, ``num_stages: 2``:
``templates/INET-110E-*``, ``TINET-PIOLIKE-X``, ``macros/models/backbones/nc_convnext2s_tiny_imnet.yml``):
widths ``repr_dim // 4`` then ``repr_dim // 2`` (``repr_dim``: their state width); stem conv 4×4/4 then
LayerNorm; one ConvNeXt ``Block`` (7×7 depthwise conv, LayerNorm, ``pwconv1`` to 4×, GELU (erf),
``pwconv2``, layer scale ``gamma``, residual; drop-path 0); the downsampling layer LayerNorm *then*
conv 2×2/2; no block after it (``femto``: depths ``[1, 0]``), no final norm or head (``num_classes=None``);
every LayerNorm with eps 1e-6 over the channels; a learned grid ``[pos_dim, g, g]`` concatenated on the
channels, then ``b c h w → b (h w) c``.

**Perceiver IO** (:func:`pio_forward`): their ``external/perceiver_io.py`` with
``perceiver_io_tiny_imnet.yml``'s options (``decoder_ff``, ``as_classifier``, ``weight_tie_layers:
false``, tokens given directly).

The parameters are dicts keyed by the names their modules' ``state_dict`` gives them
(:func:`nac_parameters`, :func:`pio_parameters`), so tests copy weights across by name and the
count of their parameters per component reads off these dicts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .nac import depthwise7

EPS64 = torch.finfo(torch.float64).eps
TINY64 = torch.finfo(torch.float64).tiny


# ----------------------------------------------------------------------------- small pieces

def _randn(*shape, generator: torch.Generator | None, dtype=torch.float64) -> Tensor:
    """Random values; without a generator (``seed=None``), an empty tensor on the meta device
    (shapes only: parameter counts at the paper's sizes)."""
    if generator is None:
        return torch.empty(*shape, dtype=dtype, device="meta")
    return torch.randn(*shape, generator=generator, dtype=dtype)


def _rand(*shape, generator: torch.Generator | None, dtype=torch.float64) -> Tensor:
    if generator is None:
        return torch.empty(*shape, dtype=dtype, device="meta")
    return torch.rand(*shape, generator=generator, dtype=dtype)


def layer_norm(v: Tensor, eps: float = 1e-5) -> Tensor:
    mean = v.mean(-1, keepdim=True)
    var = ((v - mean) ** 2).mean(-1, keepdim=True)
    return (v - mean) / torch.sqrt(var + eps)


def affine_ln(v: Tensor, p: dict, name: str) -> Tensor:
    """``nn.LayerNorm`` (eps 1e-5) with the parameters ``name.weight``, ``name.bias``."""
    return layer_norm(v) * p[name + ".weight"] + p[name + ".bias"]


def linear(v: Tensor, p: dict, name: str) -> Tensor:
    """``nn.Linear``: ``name.weight`` and, if present, ``name.bias``."""
    out = v @ p[name + ".weight"].T
    return out + p[name + ".bias"] if name + ".bias" in p else out


def modfc(v: Tensor, code: Tensor, p: dict, name: str) -> Tensor:
    """Their ``ModFC`` for one module's code ``[d_code]``: ``W (v ⊙ (1 + g·LN(W_c c))) + b``."""
    scale = 1.0 + p[name + ".scale_gain"] * layer_norm(p[name + ".scale.weight"] @ code)
    out = (v * scale) @ p[name + ".native_weight"].T
    return out + p[name + ".native_bias"] if name + ".native_bias" in p else out


def geglu(h: Tensor) -> Tensor:
    a, gates = h.chunk(2, dim=-1)
    return a * torch.nn.functional.gelu(gates)


def softmax(v: Tensor) -> Tensor:
    e = torch.exp(v - v.max())
    return e / e.sum()


def mod_ffn(states: Tensor, codes: Tensor, p: dict, name: str) -> Tensor:
    """``ModFFN``: per module ``u``, ``θ + fc2(GEGLU(fc1(LN θ, c_u)), c_u)``; ``states [B, U, d]``."""
    out = torch.empty_like(states)
    for u in range(states.shape[1]):
        h = modfc(affine_ln(states[:, u], p, name + ".layernorm"), codes[u], p, name + ".ffn.0")
        out[:, u] = states[:, u] + modfc(geglu(h), codes[u], p, name + ".ffn.2")
    return out


# ----------------------------------------------------------------------------- NAC

@dataclass
class NACDims:
    """Sizes of their ``LatentGraph``; ``hidden`` is ``round(ffn_capacity_factor · state_dim)``."""

    state: int
    code: int
    sig: int
    token: int
    hidden: int
    processors: int
    outputs: int
    layers: int
    heads: int
    read_in_heads: int = 1
    read_out_heads: int = 1
    head_dim: int = 64
    classes: int = 10


def _modfc_params(out: dict, name: str, d_in: int, d_out: int, d_code: int, bias: bool, g: torch.Generator) -> None:
    out[name + ".native_weight"] = _randn(d_out, d_in, generator=g, dtype=torch.float64) / math.sqrt(d_in)
    if bias:
        out[name + ".native_bias"] = 0.1 * _randn(d_out, generator=g, dtype=torch.float64)
    out[name + ".scale.weight"] = _randn(d_in, d_code, generator=g, dtype=torch.float64) / math.sqrt(d_code)
    out[name + ".scale_gain"] = 0.1 + 0.5 * _rand((), generator=g, dtype=torch.float64)


def _ln_params(out: dict, name: str, d: int, g: torch.Generator) -> None:
    out[name + ".weight"] = 1 + 0.2 * _randn(d, generator=g, dtype=torch.float64)
    out[name + ".bias"] = 0.1 * _randn(d, generator=g, dtype=torch.float64)


def _attention_params(out: dict, name: str, d_state: int, d_kv: int, inner: int, d_code: int, qkv_bias: bool,
                      layernorms: tuple[str, ...], g: torch.Generator) -> None:
    for ln, d in zip(layernorms, (d_state, d_kv)):
        _ln_params(out, f"{name}.{ln}", d, g)
    _modfc_params(out, name + ".query_compiler", d_state, inner, d_code, qkv_bias, g)
    _modfc_params(out, name + ".key_compiler", d_kv, inner, d_code, qkv_bias, g)
    _modfc_params(out, name + ".value_compiler", d_kv, inner, d_code, qkv_bias, g)
    _modfc_params(out, name + ".exit_layer", inner, d_state, d_code, True, g)


def _ffn_params(out: dict, name: str, dims: NACDims, g: torch.Generator) -> None:
    _ln_params(out, name + ".layernorm", dims.state, g)
    _modfc_params(out, name + ".ffn.0", dims.state, 2 * dims.hidden, dims.code, True, g)
    _modfc_params(out, name + ".ffn.2", dims.hidden, dims.state, dims.code, True, g)


def is_buffer(name: str) -> bool:
    """Their state_dict's buffers among :func:`nac_parameters`' entries: each kernel's fixed
    bandwidth ε (``learnable_bandwidth: false``)."""
    return name.endswith(".kernel.bandwidth")


def nac_parameters(dims: NACDims, *, seed: int | None = 0, qkv_bias: bool = False, bandwidth: float = 1.0
                   ) -> dict[str, Tensor]:
    """Their final NAC's state_dict by name (random values, float64; ``seed=None``: meta tensors),
    the kernels' ``bandwidth`` buffers included (:func:`is_buffer`). ``qkv_bias``: their class
    default ``True`` instead of the final configs' ``False`` (query, key and value projections with
    a bias)."""
    g = None if seed is None else torch.Generator().manual_seed(seed)
    p: dict[str, Tensor] = {}
    lg = "latent_graphs.0"
    for group, n in (("input_latents", dims.processors), ("mediator_latents", dims.processors),
                     ("output_latents", dims.outputs)):
        p[f"{lg}.{group}.signatures_"] = _randn(n, dims.sig, generator=g, dtype=torch.float64)
        p[f"{lg}.{group}.codes_"] = _randn(n, dims.code, generator=g, dtype=torch.float64)
    ri = f"{lg}.read_in"
    _attention_params(p, ri + ".read_in_attention", dims.state, dims.token, dims.read_in_heads * dims.head_dim,
                      dims.code, qkv_bias, ("receiver_layernorm", "sender_layernorm"), g)
    _ffn_params(p, ri + ".ffn", dims, g)
    for layer in range(dims.layers):
        name = f"{lg}.propagators.{layer}"
        _attention_params(p, name + ".latent_attention", dims.state, dims.state, dims.heads * dims.head_dim,
                          dims.code, qkv_bias, ("receiver_layernorm",), g)
        p[name + ".latent_attention.kernel.bandwidth"] = torch.tensor(bandwidth, dtype=torch.float64)
        _ffn_params(p, name + ".ffn", dims, g)
    ro = f"{lg}.read_out"
    _attention_params(p, ro + ".latent_attention", dims.state, dims.state, dims.read_out_heads * dims.head_dim,
                      dims.code, qkv_bias, ("receiver_layernorm", "sender_layernorm"), g)
    p[ro + ".latent_attention.kernel.bandwidth"] = torch.tensor(bandwidth, dtype=torch.float64)
    _ffn_params(p, ro + ".ffn", dims, g)
    p["output_tokenizer.confidence_scorer.weight"] = _randn(1, dims.state, generator=g, dtype=torch.float64)
    p["output_tokenizer.confidence_scorer.bias"] = _randn(1, generator=g, dtype=torch.float64)
    p["output_tokenizer.to_logits.weight"] = _randn(dims.classes, dims.state, generator=g, dtype=torch.float64)
    p["output_tokenizer.to_logits.bias"] = _randn(dims.classes, generator=g, dtype=torch.float64)
    return p


def unit(v: Tensor) -> Tensor:
    """``F.normalize`` (eps 1e-12)."""
    return v / torch.clamp(torch.sqrt((v * v).sum()), min=1e-12)


def log_kernel_hat(s_recv: Tensor, s_send: Tensor, bandwidth: Tensor, tau: float, uniforms: Tensor | None,
                   batch: int) -> Tensor:
    """``log K̂ [B, U, V]`` of their ``DotProductKernel`` in ``return_log_kernel`` mode, normalised
    along senders. ``uniforms [B, U, V]``: the ``u`` of ``RelaxedBernoulli.rsample`` (training);
    None: evaluation (``no_sample``: ``log K = log P``)."""
    n_u, n_v = s_recv.shape[0], s_send.shape[0]
    out = torch.empty(batch, n_u, n_v, dtype=torch.float64)
    for b in range(batch):
        for i in range(n_u):
            row = torch.empty(n_v, dtype=torch.float64)
            for j in range(n_v):
                log_p = -(1.0 - unit(s_recv[i]) @ unit(s_send[j])) / bandwidth
                if uniforms is None:
                    row[j] = log_p
                    continue
                prob = torch.clamp(torch.exp(log_p), 0.0, 1.0)              # straight_through_clamp
                prob = torch.clamp(prob, EPS64, 1 - EPS64)                  # clamp_probs (probs_to_logits)
                u = torch.clamp(uniforms[b, i, j], EPS64, 1 - EPS64)        # clamp_probs (rsample)
                z = (torch.log(prob) - torch.log1p(-prob) + torch.log(u) - torch.log1p(-u)) / tau
                row[j] = torch.log(torch.clamp(torch.sigmoid(z), TINY64, 1 - EPS64))   # SigmoidTransform
            out[b, i] = row - torch.logsumexp(row, dim=0)
    return out


def latent_attention(recv: Tensor, recv_codes: Tensor, send: Tensor, send_codes: Tensor, p: dict, name: str,
                     heads: int, head_dim: int, log_k_hat: Tensor, shared_ln: bool, residual: bool
                     ) -> tuple[Tensor, Tensor]:
    """``KernelModulatedLatentAttention``: ``recv [B, U, d]``, ``send [B, V, d]``, ``log_k_hat [B, U, V]``.
    Returns the new receiver states and the weights ``[B, H, U, V]``."""
    b_n, n_u, n_v = recv.shape[0], recv.shape[1], send.shape[1]
    out, weights = torch.empty_like(recv), torch.empty(b_n, heads, n_u, n_v, dtype=torch.float64)
    for b in range(b_n):
        xr = affine_ln(recv[b], p, name + ".receiver_layernorm")
        xs = affine_ln(send[b], p, name + (".receiver_layernorm" if shared_ln else ".sender_layernorm"))
        keys = torch.stack([modfc(xs[j], send_codes[j], p, name + ".key_compiler") for j in range(n_v)])
        values = torch.stack([modfc(xs[j], send_codes[j], p, name + ".value_compiler") for j in range(n_v)])
        for i in range(n_u):
            q = modfc(xr[i], recv_codes[i], p, name + ".query_compiler")
            message = []
            for h in range(heads):
                cols = slice(h * head_dim, (h + 1) * head_dim)
                scores = torch.stack([q[cols] @ keys[j, cols] / math.sqrt(head_dim) + log_k_hat[b, i, j]
                                      for j in range(n_v)])
                a = softmax(scores)
                weights[b, h, i] = a
                message.append(sum(a[j] * values[j, cols] for j in range(n_v)))
            y = modfc(torch.cat(message), recv_codes[i], p, name + ".exit_layer")
            out[b, i] = recv[b, i] + y if residual else y
    return out, weights


def read_in_attention(states: Tensor, codes: Tensor, tokens: Tensor, p: dict, name: str, heads: int,
                      head_dim: int) -> tuple[Tensor, Tensor]:
    """``ReadInAttention``: every module ``u`` makes its own keys and values of every token with its
    code ``c_u``; residual. ``states [B, U, d]``, ``tokens [B, N, d_in]`` → states, weights ``[B, H, U, N]``."""
    b_n, n_u, n_tok = states.shape[0], states.shape[1], tokens.shape[1]
    out, weights = torch.empty_like(states), torch.empty(b_n, heads, n_u, n_tok, dtype=torch.float64)
    for b in range(b_n):
        xs = affine_ln(tokens[b], p, name + ".sender_layernorm")
        for u in range(n_u):
            q = modfc(affine_ln(states[b, u], p, name + ".receiver_layernorm"), codes[u], p, name + ".query_compiler")
            keys = torch.stack([modfc(xs[j], codes[u], p, name + ".key_compiler") for j in range(n_tok)])
            values = torch.stack([modfc(xs[j], codes[u], p, name + ".value_compiler") for j in range(n_tok)])
            message = []
            for h in range(heads):
                cols = slice(h * head_dim, (h + 1) * head_dim)
                a = softmax(torch.stack([q[cols] @ keys[j, cols] / math.sqrt(head_dim) for j in range(n_tok)]))
                weights[b, h, u] = a
                message.append(sum(a[j] * values[j, cols] for j in range(n_tok)))
            out[b, u] = states[b, u] + modfc(torch.cat(message), codes[u], p, name + ".exit_layer")
    return out, weights


def nac_forward(p: dict, tokens: Tensor, dims: NACDims, *, tau: float = 0.5,
                uniforms: list[Tensor] | None = None) -> dict[str, Tensor | list[Tensor]]:
    """Their ``NeuralCompiler`` forward on ``tokens [B, N, d_in]``. ``uniforms``: training mode, the
    Concrete noise of each kernel draw in order (one ``[B, U_p, U_p]`` per propagator, then
    ``[B, U_o, U_p]`` for the read-out); None: evaluation mode."""
    lg, b_n = "latent_graphs.0", tokens.shape[0]
    in_codes, med_codes = p[f"{lg}.input_latents.codes_"], p[f"{lg}.mediator_latents.codes_"]
    med_sig = p[f"{lg}.mediator_latents.signatures_"]
    out_sig, out_codes = p[f"{lg}.output_latents.signatures_"], p[f"{lg}.output_latents.codes_"]
    draws = iter(uniforms) if uniforms is not None else None
    # read-in: initial states = the input latents' codes (LatentSeeder, use_code_as_mean_state)
    states = in_codes.expand(b_n, *in_codes.shape).clone()
    states, w_in = read_in_attention(states, in_codes, tokens, p, f"{lg}.read_in.read_in_attention",
                                     dims.read_in_heads, dims.head_dim)
    states = mod_ffn(states, in_codes, p, f"{lg}.read_in.ffn")
    read_in_states = states
    w_prop = []
    for layer in range(dims.layers):      # the mediators start from the input latents' states
        name = f"{lg}.propagators.{layer}"
        k_hat = log_kernel_hat(med_sig, med_sig, p[name + ".latent_attention.kernel.bandwidth"], tau,
                               None if draws is None else next(draws), b_n)
        states, w = latent_attention(states, med_codes, states, med_codes, p, name + ".latent_attention",
                                     dims.heads, dims.head_dim, k_hat, shared_ln=True, residual=True)
        states = mod_ffn(states, med_codes, p, name + ".ffn")
        w_prop.append(w)
    name = f"{lg}.read_out"
    k_hat = log_kernel_hat(out_sig, med_sig, p[name + ".latent_attention.kernel.bandwidth"], tau,
                           None if draws is None else next(draws), b_n)
    y = out_codes.expand(b_n, *out_codes.shape).clone()
    y, w_out = latent_attention(y, out_codes, states, med_codes, p, name + ".latent_attention",
                                dims.read_out_heads, dims.head_dim, k_hat, shared_ln=False, residual=False)
    y = mod_ffn(y, out_codes, p, name + ".ffn")                       # use_head: false → no head
    logits = torch.empty(b_n, dims.classes, dtype=torch.float64)
    confidences = torch.empty(b_n, dims.outputs, dtype=torch.float64)
    for b in range(b_n):                                             # OutputLatentPooling, vanilla softmax
        conf = softmax(torch.stack([linear(y[b, o], p, "output_tokenizer.confidence_scorer")[0]
                                    for o in range(dims.outputs)]))
        confidences[b] = conf
        pooled = sum(conf[o] * y[b, o] for o in range(dims.outputs))
        logits[b] = linear(pooled, p, "output_tokenizer.to_logits")
    return {"logits": logits, "read_in_states": read_in_states, "states": states, "output_states": y,
            "confidences": confidences, "read_in_attention": w_in, "propagator_attention": w_prop,
            "read_out_attention": w_out}


# ----------------------------------------------------------------------------- Perceiver IO

@dataclass
class PIODims:
    """Sizes of their ``PerceiverIO``: ``latent_dim``, ``dim`` (token width), ``ffn_mult``, heads."""

    latent: int
    token: int
    latents: int
    depth: int
    latent_heads: int
    cross_heads: int = 1
    dim_head: int = 64                  # cross_dim_head = latent_dim_head
    ffn_mult: int = 4
    classes: int = 10


def pio_parameters(dims: PIODims, *, seed: int | None = 0) -> dict[str, Tensor]:
    """Their Perceiver IO's parameters by state_dict name (random values, float64; ``seed=None``:
    meta tensors)."""
    g = None if seed is None else torch.Generator().manual_seed(seed)
    p: dict[str, Tensor] = {}

    def lin(name, d_in, d_out, bias=True):
        p[name + ".weight"] = _randn(d_out, d_in, generator=g, dtype=torch.float64) / math.sqrt(d_in)
        if bias:
            p[name + ".bias"] = 0.1 * _randn(d_out, generator=g, dtype=torch.float64)

    def ln(name, d):
        _ln_params(p, name, d, g)

    def attention(name, d_q, d_ctx, heads, context):
        inner = heads * dims.dim_head
        ln(name + ".norm", d_q)
        if context:
            ln(name + ".norm_context", d_ctx)
        lin(name + ".fn.to_q", d_q, inner, bias=False)
        lin(name + ".fn.to_kv", d_ctx, 2 * inner, bias=False)
        lin(name + ".fn.to_out", inner, d_q)

    def feed_forward(name, d):
        ln(name + ".norm", d)
        lin(name + ".fn.net.0", d, d * dims.ffn_mult * 2)
        lin(name + ".fn.net.2", d * dims.ffn_mult, d)

    p["latents"] = _randn(dims.latents, dims.latent, generator=g, dtype=torch.float64)
    attention("cross_attend_blocks.0", dims.latent, dims.token, dims.cross_heads, context=True)
    feed_forward("cross_attend_blocks.1", dims.latent)
    for i in range(dims.depth):
        attention(f"layers.{i}.0", dims.latent, dims.latent, dims.latent_heads, context=False)
        feed_forward(f"layers.{i}.1", dims.latent)
    attention("decoder_cross_attn", dims.latent, dims.latent, dims.cross_heads, context=True)
    feed_forward("decoder_ff", dims.latent)
    lin("to_logits", dims.latent, dims.classes)
    p["classification_query"] = _randn(1, dims.latent, generator=g, dtype=torch.float64)
    return p


def pio_attention(x: Tensor, ctx: Tensor, p: dict, name: str, heads: int, dim_head: int) -> Tensor:
    """Their ``PreNorm(Attention)`` without the residual: ``x [M, d]``, ``ctx [N, d_ctx]`` (one sample)."""
    xq = affine_ln(x, p, name + ".norm")
    xc = affine_ln(ctx, p, name + ".norm_context") if name + ".norm_context.weight" in p else xq
    inner = heads * dim_head
    q = xq @ p[name + ".fn.to_q.weight"].T
    kv = xc @ p[name + ".fn.to_kv.weight"].T
    k, v = kv[:, :inner], kv[:, inner:]
    rows = []
    for i in range(x.shape[0]):
        parts = []
        for h in range(heads):
            cols = slice(h * dim_head, (h + 1) * dim_head)
            a = softmax(torch.stack([q[i, cols] @ k[j, cols] * dim_head ** -0.5 for j in range(k.shape[0])]))
            parts.append(sum(a[j] * v[j, cols] for j in range(k.shape[0])))
        rows.append(torch.cat(parts))
    return linear(torch.stack(rows), p, name + ".fn.to_out")


def pio_feed_forward(x: Tensor, p: dict, name: str) -> Tensor:
    """Their ``PreNorm(FeedForward)`` without the residual."""
    return linear(geglu(linear(affine_ln(x, p, name + ".norm"), p, name + ".fn.net.0")), p, name + ".fn.net.2")


def pio_forward(p: dict, tokens: Tensor, dims: PIODims) -> dict[str, Tensor]:
    """Their ``PerceiverIO.forward`` (``as_classifier``, ``decoder_ff``) on ``tokens [B, N, d_in]``."""
    logits, states = [], []
    for b in range(tokens.shape[0]):
        x = p["latents"].clone()
        x = pio_attention(x, tokens[b], p, "cross_attend_blocks.0", dims.cross_heads, dims.dim_head) + x
        x = pio_feed_forward(x, p, "cross_attend_blocks.1") + x
        for i in range(dims.depth):
            x = pio_attention(x, x, p, f"layers.{i}.0", dims.latent_heads, dims.dim_head) + x
            x = pio_feed_forward(x, p, f"layers.{i}.1") + x
        y = pio_attention(p["classification_query"], x, p, "decoder_cross_attn", dims.cross_heads, dims.dim_head)
        y = y + pio_feed_forward(y, p, "decoder_ff")                  # the decoder attention: no residual
        logits.append(linear(y, p, "to_logits")[0])
        states.append(x)
    return {"logits": torch.stack(logits), "states": torch.stack(states)}


# ----------------------------------------------------------------------------- tokenizer

@dataclass
class TokenizerDims:
    """Their ``ConvNeXtImageTokenizer(repr_dim, capacity_preset="femto", num_stages=2)``: widths
    ``repr_dim // 4``, ``repr_dim // 2``; a ``[pos_dim, grid, grid]`` positional grid."""

    repr_dim: int
    in_channels: int = 3
    pos_dim: int = 64
    grid: int = 8


def tokenizer_parameters(dims: TokenizerDims, *, seed: int | None = 0) -> dict[str, Tensor]:
    """Their tokenizer's state_dict by name (random values, float64, the layer scale far from its
    1e-6 so that the block counts; ``seed=None``: meta tensors)."""
    g = None if seed is None else torch.Generator().manual_seed(seed)
    d1, d2, c = dims.repr_dim // 4, dims.repr_dim // 2, dims.in_channels
    p: dict[str, Tensor] = {}

    def weights(name, *shape, fan_in):
        p[name + ".weight"] = _randn(*shape, generator=g) / math.sqrt(fan_in)
        p[name + ".bias"] = 0.1 * _randn(shape[0], generator=g)

    bb, blk = "backbone.downsample_layers", "backbone.stages.0.0"
    weights(bb + ".0.0", d1, c, 4, 4, fan_in=16 * c)
    _ln_params(p, bb + ".0.1", d1, g)
    weights(blk + ".dwconv", d1, 1, 7, 7, fan_in=49)
    _ln_params(p, blk + ".norm", d1, g)
    weights(blk + ".pwconv1", 4 * d1, d1, fan_in=d1)
    weights(blk + ".pwconv2", d1, 4 * d1, fan_in=4 * d1)
    p[blk + ".gamma"] = 0.5 * _randn(d1, generator=g)
    _ln_params(p, bb + ".1.0", d1, g)
    weights(bb + ".1.1", d2, d1, 2, 2, fan_in=4 * d1)
    p["positional_grid.grid"] = _randn(dims.pos_dim, dims.grid, dims.grid, generator=g)
    return p


def _channels_first_ln(x: Tensor, p: dict, name: str) -> Tensor:
    """Their ``LayerNorm(data_format="channels_first")`` on ``[C, H, W]``: over ``C`` at each pixel, eps 1e-6."""
    u = x.mean(0, keepdim=True)
    s = ((x - u) ** 2).mean(0, keepdim=True)
    return p[name + ".weight"][:, None, None] * (x - u) / torch.sqrt(s + 1e-6) + p[name + ".bias"][:, None, None]


def _strided_conv(x: Tensor, p: dict, name: str, k: int) -> Tensor:
    """``nn.Conv2d(kernel_size=k, stride=k)`` on ``[C, H, W]``, one output pixel at a time."""
    w, b = p[name + ".weight"], p[name + ".bias"]
    out = torch.empty(w.shape[0], x.shape[1] // k, x.shape[2] // k, dtype=x.dtype)
    for i in range(out.shape[1]):
        for j in range(out.shape[2]):
            out[:, i, j] = (w * x[None, :, i * k:(i + 1) * k, j * k:(j + 1) * k]).sum((1, 2, 3)) + b
    return out


def _convnext_block(x: Tensor, p: dict, name: str) -> Tensor:
    """Their ``Block`` on ``[C, H, W]``: 7×7 depthwise conv (zero padding 3), then per pixel LN (eps
    1e-6), ``pwconv1``, GELU, ``pwconv2``, ``gamma``; plus the input."""
    dw, out = depthwise7(x, p[name + ".dwconv.weight"], p[name + ".dwconv.bias"]), torch.empty_like(x)
    for i in range(x.shape[1]):
        for j in range(x.shape[2]):
            v = layer_norm(dw[:, i, j], eps=1e-6) * p[name + ".norm.weight"] + p[name + ".norm.bias"]
            v = linear(v, p, name + ".pwconv1")
            v = 0.5 * v * (1 + torch.erf(v / math.sqrt(2.0)))
            v = linear(v, p, name + ".pwconv2")
            out[:, i, j] = x[:, i, j] + p[name + ".gamma"] * v
    return out


def tokenizer_forward(p: dict, images: Tensor) -> Tensor:
    """Their ``ConvNeXtImageTokenizer.forward``: ``images [B, C, S, S] → tokens [B, (S/8)², repr_dim/2 + pos_dim]``
    (the grid's size must be ``S/8``: their ``PositionalGrid`` never resizes it)."""
    bb = "backbone.downsample_layers"
    tokens = []
    for x in images:
        h = _channels_first_ln(_strided_conv(x, p, bb + ".0.0", 4), p, bb + ".0.1")
        h = _convnext_block(h, p, "backbone.stages.0.0")
        h = _strided_conv(_channels_first_ln(h, p, bb + ".1.0"), p, bb + ".1.1", 2)
        h = torch.cat([h, p["positional_grid.grid"]], dim=0)                      # [C + pos_dim, g, g]
        tokens.append(torch.stack([h[:, i, j] for i in range(h.shape[1]) for j in range(h.shape[2])]))
    return torch.stack(tokens)
