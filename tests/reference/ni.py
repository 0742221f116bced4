"""Literal, loop-by-loop re-statements of Neural Interpreters (NI §2), written from the paper's
equations only, independently of the library's vectorised code; float64 in the tests.

* Eq. 2-3 (type inference, type matching): :func:`types_literal` and
  ``reference.kernel.ni_compatibility_literal`` (kept ``d ≤ τ``, see its docstring);
* Eq. 4 ModLin: ``reference.nac.modlin``; Eq. 5 ModMLP: :func:`modmlp_literal`;
* Eq. 6-8 ModAttn, one function ``u``, head ``h``, query ``i`` and key ``j`` at a time:
  :func:`ni_attention_weights_literal`, :func:`modattn_literal`;
* Eq. 9-10 LOC: :func:`loc_literal`; Eq. 11 interpreter: :func:`interpreter_literal`, by default
  as printed (``residual="identity"``: ``y_i = x_i + Σ_u C_ui LOCs(x)_ui``); ``"update"`` is
  modwire's reading without the doubling of ``x_i`` (``y_i = x_i + Σ_u C_ui (LOCs(x)_ui - x_i)``),
  ``"none"`` the authors' code (``y_i = Σ_u C_ui LOCs(x)_ui``);
* Eq. 12-13 one function iteration: :func:`fn_iter_literal`.

Eq. 7 as printed divides ``W̃_ij`` by ``ε + W̃_ij``; the sum over ``j`` is meant (authors'
code; implementation notes §2), which is what is written here.
"""
from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from .kernel import ni_compatibility_literal
from .nac import layer_norm, modlin


def ni_attention_weights_literal(s: Tensor, c: Tensor, r: Tensor | None, eps: float) -> Tensor:
    """NI Eq. 7 given the softmax ``s [..., Nq, Nk]``: ``W_ij = W̃_ij / (ε + Σ_j W̃_ij)``,
    ``W̃_ij = r_i c_j s_ij``; ``c`` broadcastable to ``[..., Nk]``, ``r`` to ``[..., Nq]`` (None: 1).
    A row whose denominator is exactly 0 is all zeros."""
    lead, (n_q, n_k) = tuple(s.shape[:-2]), s.shape[-2:]
    c = c.broadcast_to(lead + (n_k,))
    r = torch.ones(lead + (n_q,), dtype=s.dtype) if r is None else r.broadcast_to(lead + (n_q,))
    zero = s.new_zeros(())
    out = []
    for idx in itertools.product(*(range(n) for n in lead)):
        for i in range(n_q):
            w_tilde = [r[idx + (i,)] * c[idx + (j,)] * s[idx + (i, j)] for j in range(n_k)]
            total = zero
            for w in w_tilde:
                total = total + w
            den = eps + total
            out.extend(w / den if float(den.detach()) != 0 else zero for w in w_tilde)
    return torch.stack(out).reshape(lead + (n_q, n_k))


def softmax_literal(q: Tensor, k: Tensor, bias: Tensor | None, scale: float) -> Tensor:
    """``softmax_j(scale·q_i·k_j + bias_ij)`` for one head: q ``[Nq, d]``, k ``[Nk, d]``."""
    rows = []
    for i in range(q.shape[0]):
        logits = torch.stack([scale * (q[i] @ k[j]) + (0 if bias is None else bias[i, j])
                              for j in range(k.shape[0])])
        m = logits.detach().max()
        e = torch.exp(logits - m)
        rows.append(e / e.sum())
    return torch.stack(rows)


def _ml(layer, x: Tensor, code: Tensor) -> Tensor:
    """NI Eq. 4 with the weights of a library ``ModulatedLinear`` (bias may be None)."""
    b = 0.0 if layer.bias is None else layer.bias
    return modlin(x, code, layer.weight, b, layer.code_proj)


def modmlp_literal(ffn, x: Tensor, code: Tensor) -> Tensor:
    """NI Eq. 5 with L = 2: ``ModLin_2(GELU(ModLin_1(x; c)); c)``."""
    return _ml(ffn.fc2, torch.nn.functional.gelu(_ml(ffn.fc1, x, code)), code)


def modattn_literal(attn, x: Tensor, code: Tensor, C_u: Tensor, eps: float,
                    bias: Tensor | None = None) -> Tensor:
    """NI Eq. 6-8 for ONE function ``u`` and one sample: x ``[N, d]`` (already layer-normed),
    ``C_u [N]``, ``bias [H, N, N]`` (positional, or None). ``attn`` has ModLin layers q, k, v, o
    and ``num_heads``. Returns ``y_u [N, d]``."""
    H = attn.num_heads
    q, k, v = _ml(attn.q, x, code), _ml(attn.k, x, code), _ml(attn.v, x, code)
    heads = []
    for h, (qh, kh, vh) in enumerate(zip(q.chunk(H, -1), k.chunk(H, -1), v.chunk(H, -1))):
        s = softmax_literal(qh, kh, None if bias is None else bias[h], 1 / math.sqrt(qh.shape[-1]))
        W = ni_attention_weights_literal(s, C_u, C_u, eps)                  # Eq. 7
        heads.append(torch.stack([sum(W[i, j] * vh[j] for j in range(x.shape[0]))
                                  for i in range(x.shape[0])]))             # Eq. 8, ỹ_{ui;h}
    return _ml(attn.o, torch.cat(heads, -1), code)                          # heads folded into channels


def loc_literal(loc, x_u: Tensor, code: Tensor, C_u: Tensor, eps: float, bias: Tensor | None = None) -> Tensor:
    """NI Eq. 9-10 for one function and one sample: ``a = x + C·ModAttn(LN(x))``,
    ``y = a + C·ModMLP(LN(a))``; x_u ``[N, d]``, C_u ``[N]``."""
    ln1, ln2 = loc.attn.norm, loc.ffn.norm
    x_n = torch.nn.functional.layer_norm(x_u, x_u.shape[-1:], ln1.weight, ln1.bias, ln1.eps)
    a = x_u + C_u[:, None] * modattn_literal(loc.attn.fn, x_n, code, C_u, eps, bias)
    a_n = torch.nn.functional.layer_norm(a, a.shape[-1:], ln2.weight, ln2.bias, ln2.eps)
    return a + C_u[:, None] * modmlp_literal(loc.ffn.fn, a_n, code)


def interpreter_literal(locs, x: Tensor, codes: Tensor, C: Tensor, eps: float, *, residual: str = "identity",
                        biases: list | None = None) -> Tensor:
    """NI Eq. 11 for one sample, one function at a time: x ``[N, d]``, codes ``[U, d_code]``,
    C ``[U, N]``; ``biases[l]``: the positional bias of LOC ``l`` per function ``[U, H, N, N]``.
    ``residual="identity"`` (default): ``y_i = x_i + Σ_u C_ui LOCs(x)_ui`` (as printed); ``"update"``:
    ``y_i = x_i + Σ_u C_ui (LOCs(x)_ui - x_i)``; ``"none"``: without ``x_i`` (authors' code)."""
    y = x.clone() if residual in ("identity", "update") else torch.zeros_like(x)
    for u in range(codes.shape[0]):
        x_u = x
        for l, loc in enumerate(locs):
            x_u = loc_literal(loc, x_u, codes[u], C[u], eps, None if biases is None else biases[l][u])
        for i in range(x.shape[0]):
            y[i] = y[i] + C[u, i] * (x_u[i] - x[i] if residual == "update" else x_u[i])
    return y


def types_literal(ti, x: Tensor) -> Tensor:
    """NI Eq. 2: ``t_i = MLP(LN(x_i)) / |MLP(LN(x_i))|`` with the weights of the library's type
    inference (``ti.norm``, ``ti.mlp`` = Linear, GELU, Linear). x ``[N, d]`` → ``[N, d_type]``."""
    out = []
    for i in range(x.shape[0]):
        h = torch.nn.functional.layer_norm(x[i], x.shape[-1:], ti.norm.weight, ti.norm.bias, ti.norm.eps)
        for layer in ti.mlp:
            h = layer(h)
        out.append(h / torch.sqrt((h * h).sum()))
    return torch.stack(out)


def fn_iter_literal(script, x: Tensor, codes: Tensor, signatures: Tensor, sigma, tau, eps: float, *,
                    residual: str = "identity", biases: list | None = None) -> tuple[Tensor, Tensor]:
    """NI Eq. 12-13 for one sample: types (Eq. 2), C (Eq. 3), interpreter (Eq. 11).
    Returns ``(y [N, d], C [U, N])``."""
    t = types_literal(script.type_inference, x)
    C = ni_compatibility_literal(signatures, t, sigma, math.inf if tau is None else tau, eps)
    return interpreter_literal(script.locs, x, codes, C, eps, residual=residual, biases=biases), C


__all__ = ["fn_iter_literal", "interpreter_literal", "layer_norm", "loc_literal", "modattn_literal",
           "modmlp_literal", "ni_attention_weights_literal", "softmax_literal", "types_literal"]
