"""A literal re-statement of the NI authors' whole forward pass (their ``neural-interpreter``
repository: ``interface.py``, ``base_model.py``, ``nfc.py``, ``modfc.py``, ``kernels.py``,
``type_inference.py``, ``utils.py``), in the configuration of their released digits preset
(``presets/digits.yml``), written from reading that code (none of it copied), one sample, function
and head at a time; float64 in the tests.

Parameters live in a flat dict named like the authors' ``state_dict`` (``transformer.scripts.0.
function_pod.loc_pods.0.query_compiler.native_weight`` …, :func:`parameter_shapes`), so the mapping
onto modwire (``tests/models/test_ni_authors.py``) is written against their layout.

What their code does in this preset, in order (:func:`authors_forward`):

1. **Patches** ``b c (h p1) (w p2) -> b (h w) (p1 p2 c)`` and ``patch_to_embedding`` (a Linear).
   No absolute positions are added (``pre_positional_encoding`` and ``layerwise_positional_encoding``
   are false), no input LayerNorm, no dropout.
2. **CLS tokens first**: one per dataset (``use_shared_cls_tokens``: the same vector for every
   dataset), then the patches.
3. **Program** = ``num_scripts`` scripts; a **Script** runs its function pod ``num_iterations`` times
   with no residual around the script (``no_residual: true``).
4. **FunctionPod**: types ``t = body(LN(x))`` (Linear, GELU, Linear; ``quantize_variable_types``
   false), kernel ``K_ui = exp(-d_ui/σ)`` with ``d = 1 - ŝ_u·t̂_i`` (both normalised), 0 where
   ``d > τ`` (``σ`` is the kernel's ``bandwidth`` parameter itself); ``C = K / (Σ_u K + ε)``
   (``normalize_function_variable_affinities``); every LOC pod on ``x`` copied per function;
   output ``Σ_u C_ui x_ui`` (``no_residual: true``: no ``x_i`` added; the ``vanilla`` residual mode
   would add it, Eq. 11 as printed).
5. **LOCPod** (``residual_mode: modulated_attn``, ``use_fc_after_attention``, ``scale_attention_weights``,
   ``trailing_activation: false``): ``n = LN(x)``; ``q, k`` ModFCs without bias, ``v`` with; heads
   are contiguous blocks of features (``(h c)``); logits ``(q·k + P) / √d_head`` with ``P`` the
   relative positional term below; ``W = C_i C_j softmax_j / (Σ_j C_i C_j softmax_j + ε)``;
   ``o = post_attention_fc(Σ_j W v_j)`` (ModFC, bias, no activation); ``a = x + C_i o``;
   ``y = a + C_i · fc2(GELU(fc1(LN(a))))`` (ModFCs with bias).
6. **ModFC** (``_naive_implementation``): ``W (x ⊙ LN(W_c c)) + b``, the LayerNorm without affine
   parameters over ``in_features``.
7. **RelativePositionalEncoder** (``function_head_mixing_mode: sep_sum``, not shared between
   functions): for query patch ``(i1, j1)`` and key patch ``(i2, j2)``,
   ``P_uh = w^h_row·E_row[j2 - j1] + (F_row c_u)_h + w^h_col·E_col[i2 - i1] + (F_col c_u)_h``;
   their "row" embedding is indexed by the column offset and their "col" embedding by the row
   offset. ``P`` is 0 for every pair that involves a CLS token.
8. **Heads**: the token of each dataset through ``LayerNorm`` and ``Linear`` (one shared head,
   ``use_shared_prediction_head``).

Tensors their forward computes but never reads (the absolute ``pos_embedding``, the type
``quantizer.codebook``, ``function_output_signatures``, the output types, the unused
``post_*_gain`` buffers) are not part of :func:`parameter_shapes`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class AuthorsConfig:
    """The fields of ``presets/digits.yml`` this re-statement reads (tiny values in the tests).
    ``heads_per_loc``/``features_per_head``: their ``num_heads_in_loc`` / ``num_features_per_loc_head``
    (each query/key head then has ``heads_per_loc · features_per_head`` features, their convention)."""

    datasets: tuple[str, ...] = ("mnist", "mnistm", "svhn")
    num_classes: int = 10
    image_size: int = 32
    channels: int = 3
    patch_size: int = 4
    dim: int = 192                     # variable_features
    code_features: int = 192
    type_features: int = 24
    num_scripts: int = 1
    num_iterations: int = 8
    num_functions: int = 5
    num_loc_pods: int = 1
    heads_per_loc: int = 4
    features_per_head: int = 32
    truncation: float = 1.4202567871309753
    shared_cls_token: bool = True      # use_shared_cls_tokens
    epsilon: float = 1e-6              # FunctionPod's and LOCPod's default

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def key_features(self) -> int:
        """Features per query/key head (their ``key_query_features``)."""
        return self.heads_per_loc * self.features_per_head


def parameter_shapes(c: AuthorsConfig) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor their digits forward reads, named as in their ``state_dict``."""
    d, k, h = c.dim, c.key_features, c.heads_per_loc
    shapes: dict[str, tuple[int, ...]] = {
        "patch_to_embedding.weight": (d, c.channels * c.patch_size ** 2), "patch_to_embedding.bias": (d,),
        "shared_prediction_head.0.weight": (d,), "shared_prediction_head.0.bias": (d,),
        "shared_prediction_head.1.weight": (c.num_classes, d), "shared_prediction_head.1.bias": (c.num_classes,)}
    if c.shared_cls_token:
        shapes["shared_cls_token"] = (1, 1, d)
    else:
        shapes.update({f"cls_token.{name}": (1, 1, d) for name in c.datasets})
    for s in range(c.num_scripts):
        p = f"transformer.scripts.{s}."
        shapes.update({p + "type_inference.layernorm.weight": (d,), p + "type_inference.layernorm.bias": (d,),
                       p + "type_inference.body.0.weight": (d, d), p + "type_inference.body.0.bias": (d,),
                       p + "type_inference.body.2.weight": (c.type_features, d),
                       p + "type_inference.body.2.bias": (c.type_features,)})
        f = p + "function_pod."
        shapes.update({f + "function_signatures": (c.num_functions, c.type_features),
                       f + "function_codes": (c.num_functions, c.code_features), f + "kernel.bandwidth": ()})
        for l in range(c.num_loc_pods):
            q = f + f"loc_pods.{l}."
            for norm in ("pre_attention_layernorm", "pre_mlp_layernorm"):
                shapes.update({q + norm + ".weight": (d,), q + norm + ".bias": (d,)})
            for name, (n_out, n_in, bias) in {"query_compiler": (h * k, d, False), "key_compiler": (h * k, d, False),
                                              "value_compiler": (d, d, True), "post_attention_fc": (d, d, True),
                                              "pointwise_mlp.0": (d, d, True), "pointwise_mlp.1": (d, d, True)}.items():
                shapes.update({q + name + ".native_weight": (n_out, n_in), q + name + ".scale.weight": (n_in, c.code_features)})
                if bias:
                    shapes[q + name + ".native_bias"] = (n_out,)
            r = q + "relative_positional_encoder."
            shapes.update({r + "row_embeddings.weight": (2 * c.grid - 1, k), r + "col_embeddings.weight": (2 * c.grid - 1, k),
                           r + "head_keys_row.weight": (h, k), r + "head_keys_col.weight": (h, k),
                           r + "function_keys_row.weight": (h, c.code_features),
                           r + "function_keys_col.weight": (h, c.code_features)})
    return shapes


def random_parameters(c: AuthorsConfig, seed: int = 0, dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """Random values for every tensor of :func:`parameter_shapes` (scaled like a fan-in init; LayerNorm
    gains around 1, the bandwidth around 1): not their initialisation, only values to compare with."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in parameter_shapes(c).items():
        x = torch.randn(shape, generator=g, dtype=dtype)
        if name.endswith("bandwidth"):
            out[name] = 0.7 + 0.6 * torch.rand((), generator=g, dtype=dtype)
        elif "layernorm" in name or name.startswith("shared_prediction_head.0"):
            out[name] = (1.0 + 0.1 * x) if name.endswith("weight") else 0.1 * x
        elif len(shape) == 2 and not name.endswith(("signatures", "codes", "embeddings.weight")):
            out[name] = x / math.sqrt(shape[1])
        else:
            out[name] = x if len(shape) != 1 else 0.1 * x
    return out


# ----------------------------------------------------------------------------- pieces

def _layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """``nn.LayerNorm`` over the last axis, written out (biased variance)."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps)
    return y if weight is None else y * weight + bias


def _linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    y = x @ w.t()
    return y if b is None else y + b


def _modfc(P: dict, name: str, x: Tensor, code: Tensor) -> Tensor:
    """Their ModFC: ``native_weight (x ⊙ LN(scale(code))) + native_bias`` (no activation here);
    ``x [N, in]``, ``code [code_features]``."""
    scale = _layer_norm(_linear(code, P[name + ".scale.weight"]))
    return _linear(x * scale, P[name + ".native_weight"], P.get(name + ".native_bias"))


def _gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def types_of(P: dict, script: str, x: Tensor) -> Tensor:
    """Their TypeInference without quantisation: ``body(LN(x))`` ``[N, type_features]`` (not normalised)."""
    t = script + "type_inference."
    h = _layer_norm(x, P[t + "layernorm.weight"], P[t + "layernorm.bias"])
    return _linear(_gelu(_linear(h, P[t + "body.0.weight"], P[t + "body.0.bias"])),
                   P[t + "body.2.weight"], P[t + "body.2.bias"])


def affinities(P: dict, c: AuthorsConfig, pod: str, types: Tensor) -> Tensor:
    """Their DotProductKernel (``direct`` truncation, forward value) then the normalisation over
    functions: ``C [U, N]``."""
    sig = P[pod + "function_signatures"]
    bw = P[pod + "kernel.bandwidth"]
    K = torch.zeros(sig.shape[0], types.shape[0], dtype=types.dtype)
    for u in range(sig.shape[0]):
        s = sig[u] / torch.sqrt((sig[u] ** 2).sum())
        for i in range(types.shape[0]):
            t = types[i] / torch.sqrt((types[i] ** 2).sum())
            dist = (1.0 - (s * t).sum()) / bw
            K[u, i] = 0.0 if dist > c.truncation / bw else torch.exp(-dist)
    return K / (K.sum(0, keepdim=True) + c.epsilon)


def positional_term(P: dict, c: AuthorsConfig, loc: str, code: Tensor, n_tokens: int) -> Tensor:
    """Their RelativePositionalEncoder (``sep_sum``) for one function: ``[H, N, N]``, 0 for pairs with a
    CLS token (the first ``n_tokens - grid²`` tokens)."""
    r, X = loc + "relative_positional_encoder.", c.grid
    row = _linear(P[r + "row_embeddings.weight"], P[r + "head_keys_row.weight"])      # [2X-1, H]
    col = _linear(P[r + "col_embeddings.weight"], P[r + "head_keys_col.weight"])
    f_row, f_col = _linear(code, P[r + "function_keys_row.weight"]), _linear(code, P[r + "function_keys_col.weight"])
    out = torch.zeros(c.heads_per_loc, n_tokens, n_tokens, dtype=code.dtype)
    first = n_tokens - X * X
    for i1 in range(X):
        for j1 in range(X):
            for i2 in range(X):
                for j2 in range(X):
                    value = row[j2 - j1 + X - 1] + f_row + col[i2 - i1 + X - 1] + f_col     # [H]
                    out[:, first + i1 * X + j1, first + i2 * X + j2] = value
    return out


def loc_pod(P: dict, c: AuthorsConfig, loc: str, x: Tensor, code: Tensor, C: Tensor) -> Tensor:
    """Their LOCPod (``modulated_attn``) for one function: ``x [N, d]``, ``code [code_features]``,
    ``C [N]`` → ``[N, d]``."""
    n = _layer_norm(x, P[loc + "pre_attention_layernorm.weight"], P[loc + "pre_attention_layernorm.bias"])
    q, k = _modfc(P, loc + "query_compiler", n, code), _modfc(P, loc + "key_compiler", n, code)
    v = _modfc(P, loc + "value_compiler", n, code)
    H, N = c.heads_per_loc, x.shape[0]
    dq, dv = q.shape[-1] // H, v.shape[-1] // H
    pe = positional_term(P, c, loc, code, N)
    heads = []
    for h in range(H):
        qh, kh, vh = q[:, h * dq:(h + 1) * dq], k[:, h * dq:(h + 1) * dq], v[:, h * dv:(h + 1) * dv]
        rows = []
        for i in range(N):
            logits = torch.stack([((qh[i] * kh[j]).sum() + pe[h, i, j]) / math.sqrt(dq) for j in range(N)])
            e = torch.exp(logits - logits.max())
            s = e / e.sum()
            w = C[i] * C * s
            w = w / (w.sum() + c.epsilon)
            rows.append((w[:, None] * vh).sum(0))
        heads.append(torch.stack(rows))
    o = _modfc(P, loc + "post_attention_fc", torch.cat(heads, -1), code)
    a = x + C[:, None] * o
    m = _layer_norm(a, P[loc + "pre_mlp_layernorm.weight"], P[loc + "pre_mlp_layernorm.bias"])
    mlp = _modfc(P, loc + "pointwise_mlp.1", _gelu(_modfc(P, loc + "pointwise_mlp.0", m, code)), code)
    return a + C[:, None] * mlp


def function_pod(P: dict, c: AuthorsConfig, script: str, x: Tensor, residual: str = "none"
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """Their FunctionPod: ``x [N, d]`` → ``(y, C [U, N], types)``, ``y = Σ_u C_ui LOCs(x)_ui`` with
    ``no_residual: true`` (``residual="none"``, the preset), ``x + Σ_u C_ui LOCs(x)_ui`` with
    ``no_residual: false, residual_mode: vanilla`` (``residual="vanilla"``)."""
    pod = script + "function_pod."
    t = types_of(P, script, x)
    C = affinities(P, c, pod, t)
    y = torch.zeros_like(x)
    for u in range(c.num_functions):
        x_u = x
        for l in range(c.num_loc_pods):
            x_u = loc_pod(P, c, pod + f"loc_pods.{l}.", x_u, P[pod + "function_codes"][u], C[u])
        y = y + C[u][:, None] * x_u
    return (x + y if residual == "vanilla" else y), C, t


def authors_forward(P: dict, c: AuthorsConfig, images: Tensor, *, residual: str = "none") -> dict:
    """Their ``NeuralInterpreter.forward`` on ``images [B, C, S, S]``: ``{"predictions": {dataset:
    [B, num_classes]}, "affinities": [C [B, U, N] per function iteration], "types": [[B, N, d_type]
    per function iteration]}``, tokens in their order (CLS tokens first). ``residual``: the function
    pod's (:func:`function_pod`; the preset: ``"none"``)."""
    p, X = c.patch_size, c.grid
    preds: dict[str, list[Tensor]] = {name: [] for name in c.datasets}
    affs: list[list[Tensor]] = [[] for _ in range(c.num_scripts * c.num_iterations)]
    types: list[list[Tensor]] = [[] for _ in range(c.num_scripts * c.num_iterations)]
    for img in images:
        patches = [torch.cat([img[ch, a * p + p1, b * p + p2].reshape(1)
                              for p1 in range(p) for p2 in range(p) for ch in range(c.channels)])
                   for a in range(X) for b in range(X)]                             # (p1 p2 c), row-major
        x = _linear(torch.stack(patches), P["patch_to_embedding.weight"], P["patch_to_embedding.bias"])
        cls = [P["shared_cls_token" if c.shared_cls_token else f"cls_token.{n}"].reshape(1, -1) for n in c.datasets]
        x = torch.cat(cls + [x])
        k = 0
        for s in range(c.num_scripts):
            for _ in range(c.num_iterations):
                x, C, t = function_pod(P, c, f"transformer.scripts.{s}.", x, residual)
                affs[k].append(C)
                types[k].append(t)
                k += 1
        for idx, name in enumerate(c.datasets):
            h = _layer_norm(x[idx], P["shared_prediction_head.0.weight"], P["shared_prediction_head.0.bias"])
            preds[name].append(_linear(h, P["shared_prediction_head.1.weight"], P["shared_prediction_head.1.bias"]))
    return {"predictions": {n: torch.stack(v) for n, v in preds.items()},
            "affinities": [torch.stack(a) for a in affs], "types": [torch.stack(t) for t in types]}


__all__ = ["AuthorsConfig", "affinities", "authors_forward", "function_pod", "loc_pod", "parameter_shapes",
           "positional_term", "random_parameters", "types_of"]
