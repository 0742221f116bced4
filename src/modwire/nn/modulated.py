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
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Modulation = Literal["nac", "ni", "none"]
MODULATIONS = ("nac", "ni", "none")
ACTIVATIONS = ("geglu", "gelu")


def init_linear_(weight: Tensor, bias: Tensor | None = None, std: float = 0.02) -> None:
    """Truncated-normal weights and zero bias (the ViT/Perceiver convention)."""
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
    if bias is not None:
        nn.init.zeros_(bias)


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
    ) -> None:
        super().__init__()
        if modulation not in MODULATIONS:
            raise ValueError(f"modulation must be one of {MODULATIONS}, got {modulation!r}")
        if modulation != "none" and code_dim <= 0:
            raise ValueError(f"code_dim must be positive for modulation={modulation!r}, got {code_dim}")
        self.in_features, self.out_features = in_features, out_features
        self.modulation = modulation
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

        ``m`` depends on parameters only. Without autograd (inference), the factor of a
        code that is itself a parameter is cached until the code, ``W_c`` or ``α``
        change (tracked by their version counters, which every in-place update, optimizer
        step and ``load_state_dict`` bumps): at batch 1 it would otherwise cost a third
        of NAC's FLOPs."""
        if self.modulation == "none":
            return None
        key = None
        if not torch.is_grad_enabled() and isinstance(code, nn.Parameter):
            params = (code, self.code_proj) + ((self.alpha,) if self.modulation == "nac" else ())
            key = tuple((p.data_ptr(), p._version) for p in params) + (code.dtype, code.device)
            cached = self.__dict__.get("_m_cache")
            if cached is not None and cached[0] == key:
                return cached[1]
        h = F.layer_norm(F.linear(code, self.code_proj), (self.in_features,))
        m = 1.0 + self.alpha * h if self.modulation == "nac" else h
        if key is not None:
            self.__dict__["_m_cache"] = (key, m)
        return m

    def forward(self, x: Tensor, code: Tensor | None = None, m: Tensor | None = None,
                inplace: bool = False) -> Tensor:
        """``W (x ⊙ m(c)) + b``. Pass a precomputed ``m`` to reuse it across calls.

        ``inplace=True`` lets the layer overwrite ``x`` with ``x ⊙ m``: for callers that
        own a temporary ``x`` (the FFN hidden layer). On CPU this avoids allocating,
        and page-faulting, a fresh ``[B, U, d_in]`` tensor per call."""
        if m is None and self.modulation != "none":
            if code is None:
                raise ValueError("a modulated layer needs a code tensor [U, d_code] or [B, U, d_code]")
            m = self.modulation_factor(code)
        if m is not None:
            x = x.mul_(m) if inplace and x.shape == torch.broadcast_shapes(x.shape, m.shape) else x * m
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, modulation={self.modulation}"


class ModulatedFFN(nn.Module):
    """ModFFN: two modulated linears that share one code, with GEGLU or GELU between.

    GEGLU (NAC Table 4): the first layer emits ``2·d_hidden`` features split into a
    value and a gate, ``h = a ⊙ GELU(g)``. Shapes as in :class:`ModulatedLinear`.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        code_dim: int = 0,
        activation: str = "geglu",
        modulation: Modulation = "nac",
        alpha_init: float = 0.1,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        width = 2 * hidden_dim if activation == "geglu" else hidden_dim
        self.fc1 = ModulatedLinear(dim, width, code_dim, modulation, alpha_init)
        self.fc2 = ModulatedLinear(hidden_dim, dim, code_dim, modulation, alpha_init)

    def forward(self, x: Tensor, code: Tensor | None = None) -> Tensor:
        h = self.fc1(x, code)
        if self.activation == "geglu":
            a, gate = h.chunk(2, dim=-1)
            h = F.gelu(gate).mul_(a)  # a ⊙ GELU(g), written into GELU's fresh output
        else:
            h = F.gelu(h)
        return self.fc2(h, code, inplace=True)  # h is ours: modulate it in place


class FFNBlock(nn.Module):
    """Pre-LN residual ModFFN: ``x + ModFFN(LN(x), c)``."""

    def __init__(self, dim: int, hidden_dim: int, code_dim: int = 0, activation: str = "geglu",
                 modulation: Modulation = "nac", alpha_init: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ffn = ModulatedFFN(dim, hidden_dim, code_dim, activation, modulation, alpha_init)

    def forward(self, x: Tensor, code: Tensor | None = None) -> Tensor:
        return x + self.ffn(self.norm(x), code)
