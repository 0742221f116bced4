"""Residual blocks shared by NAC and Perceiver IO (NAC §2.1; App. B.2: a NAC module
generalises a Perceiver IO latent, so both are built from the same three blocks).

* :class:`ReadIn`: cross-attention from module states to input tokens, then a ModFFN.
* :class:`ProcessorLayer`: (kernel-modulated) self-attention, then a ModFFN.
* :class:`ReadOut`: cross-attention from output modules to the final states (no
  residual), a ModFFN, then a confidence-weighted pooling over output modules and a
  shared linear head.

With ``modulation="none"`` and no kernel bias these are exactly Perceiver IO's
encoder, latent transformer and decoder.
"""
from __future__ import annotations

from torch import Tensor, nn

from .attention import AttentionBlock, ModulatedAttention, ReadInMethod
from .kernel import KernelBias
from .modulated import FFNBlock, Modulation


class ReadIn(nn.Module):
    """NAC Eq. 4-5: ``θ' = θ⁰ + Attn(LN(θ⁰), LN(X))``, ``θ¹ = θ' + ModFFN(LN(θ'))``.

    Keys and values are conditioned on the receiving module's code; the attention
    is computed in the factorized form (see :mod:`modwire.nn.attention`).
    Shapes: states ``[(B,) U, dim]``, tokens ``[B, N, token_dim]``, codes ``[(B,) U, d_code]``.
    """

    def __init__(self, dim: int, token_dim: int, num_heads: int, hidden_dim: int, code_dim: int = 0,
                 activation: str = "geglu", modulation: Modulation = "nac", alpha_init: float = 0.1) -> None:
        super().__init__()
        self.norm_q, self.norm_x = nn.LayerNorm(dim), nn.LayerNorm(token_dim)
        self.attn = ModulatedAttention(dim, num_heads, code_dim, modulation, alpha_init,
                                       kv_dim=token_dim, kv_code="receiver")
        self.ffn = FFNBlock(dim, hidden_dim, code_dim, activation, modulation, alpha_init)

    def forward(self, states: Tensor, tokens: Tensor, codes: Tensor | None = None,
                return_weights: bool = False, method: ReadInMethod = "factorized",
                padding: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``padding``: optional additive bias ``[B, 1, 1, N]`` hiding padded tokens."""
        y, w = self.attn(self.norm_q(states), self.norm_x(tokens), codes, bias=padding,
                         return_weights=return_weights, method=method)
        return self.ffn(states + y, codes), w


class ProcessorLayer(nn.Module):
    """One propagator (NAC §2.1): SKMDPA among modules, then U copies of a ModFFN."""

    def __init__(self, dim: int, num_heads: int, hidden_dim: int, code_dim: int = 0,
                 activation: str = "geglu", modulation: Modulation = "nac", alpha_init: float = 0.1) -> None:
        super().__init__()
        self.attn = AttentionBlock(dim, num_heads, code_dim, modulation, alpha_init)
        self.ffn = FFNBlock(dim, hidden_dim, code_dim, activation, modulation, alpha_init)

    def forward(self, x: Tensor, codes: Tensor | None = None, bias: KernelBias | Tensor | None = None,
                return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        x, w = self.attn(x, codes, bias, return_weights)
        return self.ffn(x, codes), w


class ReadOut(nn.Module):
    """Read-out (NAC §2.1): output modules attend to the final processor states, ModFFN,
    then ``logits = head(Σ_o softmax_o(conf(y_o)) · y_o)`` (equal to a confidence-weighted
    sum of per-module logits, since the head is linear and shared).

    Shapes: queries ``[(B,) Uo, dim]``, states ``[B, U, dim]``; returns logits ``[B, C]``
    and, for analysis, the attention weights and the confidences ``[B, Uo]``.
    """

    def __init__(self, dim: int, num_outputs: int, num_heads: int, hidden_dim: int, num_classes: int,
                 code_dim: int = 0, activation: str = "geglu", modulation: Modulation = "nac",
                 alpha_init: float = 0.1) -> None:
        super().__init__()
        self.norm_q, self.norm_kv = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = ModulatedAttention(dim, num_heads, code_dim, modulation, alpha_init)
        self.ffn = FFNBlock(dim, hidden_dim, code_dim, activation, modulation, alpha_init)
        self.norm = nn.LayerNorm(dim)
        # One output slot needs no confidence: softmax over a single module is 1.
        self.confidence = nn.Linear(dim, 1) if num_outputs > 1 else None
        self.head = nn.Linear(dim, num_classes)

    def forward(self, queries: Tensor, states: Tensor, out_codes: Tensor | None = None,
                state_codes: Tensor | None = None, bias: KernelBias | Tensor | None = None,
                return_weights: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        y, w = self.attn(self.norm_q(queries), self.norm_kv(states), out_codes, state_codes,
                         bias, return_weights)  # no residual (authors' code)
        y = self.norm(self.ffn(y, out_codes))
        if self.confidence is None:
            conf = y.new_ones(y.shape[:-1])
        else:
            conf = self.confidence(y).squeeze(-1).softmax(dim=-1)  # [B, Uo]
        pooled = (conf.unsqueeze(-1) * y).sum(dim=-2)
        return self.head(pooled), w, conf
