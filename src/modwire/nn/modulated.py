"""Code-modulated linear layers shared by every modwire system.

One layer covers both papers' variants:

* NAC's ModFC (NAC Eq. 1):  ``y = W (x ⊙ (1 + α·LN(W_c c))) + b``, α learnable, init 0.1;
* NI's ModLin (NI Eq. 4):   ``y = W (x ⊙ LN(W_c c)) + b``.

``W`` and ``b`` are shared by all modules; only the code ``c`` is per module, so
``U`` modules cost ``U·d_code`` extra parameters, not ``U`` weight matrices. The
modulation ``m(c)`` depends on the code alone, so it is computed once per call
for all modules and broadcast over the batch: no Python loop over modules.
LayerNorm inside the modulation has no affine parameters and ``W_c`` no bias
(as in the authors' code).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .init import init_linear_
from ..errors import UserError
from ..fields import check_argument

Modulation = Literal["nac", "ni", "none"]
MODULATIONS = ("nac", "ni", "none")
FFN_ACTIVATIONS = ("geglu", "gelu")


class ModulatedLinear(nn.Module):
    """ModFC (NAC Eq. 1) / ModLin (NI Eq. 4) / plain linear (``modulation="none"``).

    Args:
        in_features, out_features: ``d_in`` and ``d_out``.
        code_dim: ``d_code``; ignored when ``modulation="none"``.
        modulation: ``"nac"`` → ``1 + α·LN(W_c c)``; ``"ni"`` → ``LN(W_c c)``;
            ``"none"`` → no code conditioning (an ``nn.Linear``, same parameter names).
        alpha_init: initial α for ``"nac"`` (NAC Table 4: 0.1).

    Shapes:
        x: ``[..., U, d_in]``; code: ``[U, d_code]`` (shared by the batch) or
        ``[B, U, d_code]`` (per-sample codes, e.g. a conditional circuit generator).
        Returns ``[..., U, d_out]``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        code_dim: int = 0,
        modulation: Modulation = "nac",
        alpha_init: float = 0.1,
        bias: bool = True,
        fold: bool = False,
    ) -> None:
        super().__init__()
        check_argument("modulation", modulation, MODULATIONS)
        if modulation != "none" and code_dim <= 0:
            raise UserError(f"code_dim must be positive for modulation={modulation!r}, got {code_dim}")
        self.in_features, self.out_features = in_features, out_features
        self.modulation, self.fold = modulation, fold
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        init_linear_(self.weight, self.bias)
        if modulation != "none":
            self.code_proj = nn.Parameter(torch.empty(in_features, code_dim))  # W_c
            init_linear_(self.code_proj, std=1.0 / math.sqrt(code_dim))
        if modulation == "nac":
            self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))

    def modulation_factor(self, code: Tensor) -> Tensor | None:
        """``m(c)``: ``[..., U, d_in]`` from codes ``[..., U, d_code]``; None if unmodulated.

        Computed at every call (``U·d_code·d_in`` multiply-adds, against ``B·U·d_in·d_out`` for
        the layer's own product): no cache across forwards, so nothing keys on parameter
        identity or version and ``torch.compile`` traces one graph (issue 25)."""
        if self.modulation == "none":
            return None
        h = F.layer_norm(F.linear(code, self.code_proj), (self.in_features,))
        return 1.0 + self.alpha * h if self.modulation == "nac" else h

    def folded_weight(self, code: Tensor) -> Tensor:
        """``W diag m(c_u)``, one weight per code: ``[U, d_out, d_in]`` from codes ``[U, d_code]``.
        For a caller that modulates many calls with the same codes (NI: every function iteration
        of a forward) and passes it to :meth:`forward` as ``folded``."""
        return self.weight.unsqueeze(0) * self.modulation_factor(code).unsqueeze(1)

    def forward(self, x: Tensor, code: Tensor | None = None, m: Tensor | None = None,
                inplace: bool = False, folded: Tensor | None = None) -> Tensor:
        """``W (x ⊙ m(c)) + b``. Pass a precomputed ``m``, or a :meth:`folded_weight` as ``folded``
        (``x [..., U|1, N, d_in]``), to reuse it across calls.

        ``inplace=True`` lets the layer overwrite ``x`` with ``x ⊙ m``: for callers that
        own a temporary ``x`` (the FFN hidden layer). On CPU this avoids allocating,
        and page-faulting, a fresh ``[B, U, d_in]`` tensor per call."""
        if folded is not None:
            return self._folded(x, folded)
        if m is None and self.modulation != "none":
            if code is None:
                raise UserError("a modulated layer needs a code tensor [U, d_code] or [B, U, d_code]")
            m = self.modulation_factor(code)
        if m is not None and self.fold and _foldable(x, m):
            return self._folded(x, self.weight.unsqueeze(0) * m[:, 0].unsqueeze(1))
        if m is not None:
            x = x.mul_(m) if inplace and x.shape == torch.broadcast_shapes(x.shape, m.shape) else x * m
        return F.linear(x, self.weight, self.bias)

    def _folded(self, x: Tensor, w: Tensor) -> Tensor:
        """``W (x_u ⊙ m_u) = (W diag m_u) x_u`` (``fold=True``): the modulation is folded into one
        weight per code, ``w = W diag m_u`` ``[U, d_out, d_in]``, instead of forming the
        ``[..., U, N, d_in]`` product and its gradient (NI: a few functions, many tokens). ``x``
        ``[..., U|1, N, d_in]``. An ``x`` shared by every code (``U = 1``, NI's first LOC) is one GEMM for all."""
        u = w.shape[0]
        if x.shape[-3] == 1:
            lead, n = x.shape[:-3], x.shape[-2]
            y = x.reshape(-1, self.in_features) @ w.reshape(-1, self.in_features).t()   # [..·N, U·d_out]
            y = y.view(*lead, n, u, self.out_features).transpose(-3, -2)              # [..., U, N, d_out]
        else:
            y = torch.einsum("...uni,uoi->...uno", x, w)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, modulation={self.modulation}"


def _foldable(x: Tensor, m: Tensor) -> bool:
    """``m`` is one factor per code broadcast over a token axis (``[U, 1, d_in]``) and ``x`` a grid
    ``[..., U|1, N, d_in]`` over the same codes: the case :meth:`ModulatedLinear._folded` handles."""
    return m.dim() == 3 and m.shape[1] == 1 and x.dim() >= 3 and x.shape[-3] in (1, m.shape[0])


@dataclass(frozen=True)
class ModulationSpec:
    """How a block's linear layers are conditioned on module codes: one object handed to
    every block instead of ``code_dim, modulation, alpha_init`` threaded through each
    constructor (a layer factory, as timm passes ``norm_layer``).

    kind: ``"nac"`` (ModFC, NAC Eq. 1), ``"ni"`` (ModLin, NI Eq. 4) or ``"none"`` (plain linear).
    code_dim: ``d_code``. alpha_init: initial α of ModFC. fold: fold each code's modulation
    into a per-code weight when the input is a grid over codes (:meth:`ModulatedLinear._folded`).
    """

    kind: Modulation = "none"
    code_dim: int = 0
    alpha_init: float = 0.1
    fold: bool = False

    def __post_init__(self) -> None:
        check_argument("modulation", self.kind, MODULATIONS)
        if self.kind != "none" and self.code_dim <= 0:
            raise UserError(f"code_dim must be positive for modulation={self.kind!r}, got {self.code_dim}")

    def linear(self, in_features: int, out_features: int, *, bias: bool = True) -> ModulatedLinear:
        """A :class:`ModulatedLinear` with this conditioning."""
        return ModulatedLinear(in_features, out_features, self.code_dim, self.kind, self.alpha_init, bias,
                               fold=self.fold)


PLAIN = ModulationSpec("none")


class ModulatedFFN(nn.Module):
    """ModFFN: two modulated linears that share one code, with GEGLU or GELU between
    (NAC §2.1; NI Eq. 5's ModMLP with GELU).

    GEGLU (NAC Table 4): the first layer emits ``2·ffn_hidden`` features split into a
    value and a gate, ``h = a ⊙ GELU(g)``. Shapes as in :class:`ModulatedLinear`.
    """

    def __init__(self, dim: int, ffn_hidden: int, *, mod: ModulationSpec = PLAIN,
                 activation: str = "geglu") -> None:
        super().__init__()
        check_argument("activation", activation, FFN_ACTIVATIONS)
        self.activation = activation
        self.fc1 = mod.linear(dim, 2 * ffn_hidden if activation == "geglu" else ffn_hidden)
        self.fc2 = mod.linear(ffn_hidden, dim)

    def forward(self, x: Tensor, code: Tensor | None = None,
                folded: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``folded``: both layers' :meth:`ModulatedLinear.folded_weight`, in place of ``code``."""
        f1, f2 = (None, None) if folded is None else folded
        h = self.fc1(x, code, folded=f1)
        if self.activation == "geglu":
            a, gate = h.chunk(2, dim=-1)
            h = F.gelu(gate).mul_(a)  # a ⊙ GELU(g), written into GELU's fresh output
        elif torch.is_grad_enabled() and h.requires_grad:
            h = F.gelu(h)               # GELU's backward reads its input: keep it
        else:                           # no graph: overwrite fc1's output (no fresh [.., hidden] tensor)
            h = torch.ops.aten.gelu_(h)
        return self.fc2(h, code, inplace=True, folded=f2)  # h is ours: modulate it in place


class PreNorm(nn.Module):
    """The one pre-LN wrapper of every block: ``x + Drop(fn(LN(x), …))`` (perceiver-pytorch's
    ``PreNorm``). ``context_dim``: ``fn`` also reads a normalised ``context`` (cross-attention).
    ``residual=False`` returns ``fn``'s output alone (NAC read-out, authors' code). ``dropout``: on
    ``fn``'s output, before the residual (the LM's blocks; 0: no Dropout module at all).
    ``fn`` may return ``(y, extra)``; the residual is added to ``y`` and ``extra`` passed on."""

    def __init__(self, dim: int, fn: nn.Module, *, context_dim: int | None = None,
                 residual: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.norm_context = nn.LayerNorm(context_dim) if context_dim is not None else None
        self.fn, self.residual = fn, residual
        self.drop = nn.Dropout(dropout) if dropout else None   # (no parameters: the state dict is unchanged)

    def forward(self, x: Tensor, *args, context: Tensor | None = None, **kwargs):
        if self.norm_context is not None:
            args = (self.norm_context(context), *args)
        out = self.fn(self.norm(x), *args, **kwargs)
        y, extra = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
        y = y if self.drop is None else self.drop(y)
        y = x + y if self.residual else y
        return y if extra is None else (y, *extra)


def mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    """Two-layer GELU MLP (NAC §2.2: initial states from codes; App. G: the conditional
    generator's signature and code heads)."""
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out))
