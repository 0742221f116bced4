"""Residual blocks shared by NAC and Perceiver IO (NAC §2.1; App. B.2: a NAC module
generalises a Perceiver IO latent, so both are built from the same three blocks); the second,
:class:`TransformerBlock`, is also the ViT's, the AiT's and the language model's block.

* :class:`ReadIn`: cross-attention from module states to input tokens, then a ModFFN.
* :class:`TransformerBlock`: (kernel-modulated) self-attention, then a ModFFN: NAC's propagator, Perceiver
  IO's latent layer, and, configured otherwise, the ViT's, the AiT's and the LM's blocks.
* :class:`ReadOut`: cross-attention from output modules to the final states (no
  residual), a ModFFN, then a confidence-weighted pooling over output modules and a
  shared linear head.

Every block takes its conditioning as one :class:`~modwire.nn.modulated.ModulationSpec`
(``PLAIN``: exactly Perceiver IO's encoder, latent transformer and decoder) and wraps
each sub-layer in the one :class:`~modwire.nn.modulated.PreNorm`. Every attention has
``num_heads`` heads of ``head_dim`` features (None: the heads split ``dim``), optional
query/value biases (``qv_bias``) and a kernel (``attention_backend``: ``"sdpa"`` or ``"flex"``),
as :class:`~modwire.nn.attention.ModulatedAttention`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import AttentionPattern, ModulatedAttention, ReadInMethod
from .modulated import PLAIN, ModulatedFFN, ModulationSpec, PreNorm

Bias = Tensor | AttentionPattern | None


def linear_head(in_features: int, num_classes: int, **factory: Any) -> nn.Module:
    """A classifier's last layer: ``Linear(in_features, num_classes, **factory)`` (``device``, ``dtype``), or
    with ``num_classes = 0`` (timm's convention: no classifier) the identity: the model returns what it reads."""
    return nn.Linear(in_features, num_classes, **factory) if num_classes else nn.Identity()


def run_block(checkpointed: bool, block: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``block(*args, **kwargs)``, or with ``checkpointed`` (while gradients are recorded) through
    ``torch.utils.checkpoint`` (non-reentrant; dropout's random state restored): the block keeps only its
    inputs and runs again in the backward (timm's ``set_grad_checkpointing``)."""
    if checkpointed and torch.is_grad_enabled():
        return checkpoint(block, *args, use_reentrant=False, **kwargs)
    return block(*args, **kwargs)


class ReadIn(nn.Module):
    """NAC Eq. 4-5: ``θ' = θ⁰ + Attn(LN(θ⁰), LN(X))``, ``θ¹ = θ' + ModFFN(LN(θ'))``.

    Keys and values are conditioned on the receiving module's code, computed in the
    factorized form (:mod:`modwire.nn.attention`). Shapes: states ``[(B,) U, dim]``, tokens
    ``[B, N, token_dim]``, codes ``[(B,) U, d_code]``; ``key_mask`` ``[B, 1, 1, N]`` hides
    padded tokens.
    """

    def __init__(self, dim: int, token_dim: int, num_heads: int, ffn_hidden: int, *,
                 mod: ModulationSpec = PLAIN, activation: str = "geglu", head_dim: int | None = None,
                 qv_bias: bool = True, attention_backend: str = "sdpa") -> None:
        super().__init__()
        attn = ModulatedAttention(dim, num_heads, head_dim=head_dim, qv_bias=qv_bias, mod=mod, kv_dim=token_dim,
                                  kv_code="receiver", attention_backend=attention_backend)
        self.attn = PreNorm(dim, attn, context_dim=token_dim)
        self.ffn = PreNorm(dim, ModulatedFFN(dim, ffn_hidden, mod=mod, activation=activation))

    def forward(self, states: Tensor, tokens: Tensor, *, codes: Tensor | None = None,
                key_mask: Tensor | None = None, return_weights: bool = False,
                method: ReadInMethod = "factorized") -> tuple[Tensor, Tensor | None]:
        x, w = self.attn(states, context=tokens, code_q=codes, key_mask=key_mask,
                         return_weights=return_weights, method=method)
        return self.ffn(x, codes), w


class SelfAttention(ModulatedAttention):
    """``Attn(x, x)`` with sender codes = receiver codes (for :class:`PreNorm`)."""

    def forward(self, x: Tensor, code: Tensor | None = None, **kwargs) -> tuple[Tensor, Tensor | None]:
        return super().forward(x, x, code_q=code, code_kv=code, **kwargs)


class TransformerBlock(nn.Module):
    """The one pre-LN transformer block of modwire::

        x ← x + Drop(Attn(LN x))     self-attention; ``bias`` on its logits (NAC Eq. 3's ``log K̂``), causal or not
        x ← x + Drop(FFN(LN x))      a (Mod)FFN, GEGLU or GELU

    parameterised by its linear layers (``mod``: a :class:`~modwire.nn.modulated.ModulationSpec`, ``PLAIN``
    for plain linears), its attention (``num_heads`` × ``head_dim``, ``qv_bias``, ``causal``), ``dropout``
    and which sub-layers it has (``attention``, ``ffn``: AiT Table 2's ablations). Its configurations:

    * NAC's propagator (§2.1): ``mod=ModulationSpec("nac", d_code)``, GEGLU, SKMDPA with ``bias = log K̂``;
    * Perceiver IO's latent self-attention layer: ``PLAIN``, GEGLU;
    * the ViT's block: ``PLAIN``, ``activation="gelu"`` (NI App. C.2.3's relative positions as ``bias``);
    * AiT Figure 1b: the ViT's block plus the global workspace (:class:`modwire.models.ait.AiTBlock`);
    * the LM's block: ``PLAIN``, GELU, ``causal=True``, ``dropout`` (:class:`modwire.models.lm.CausalBlock`).

    Norm placement: pre-LN in every configuration (the papers' blocks and their authors' code); a
    post-LN option would be a setting no model uses, so there is none. AiT Figure 1b's one other
    placement (the FFN's output feeds the workspace instead of the residual) is ``AiTBlock``'s.
    Both sub-layers are one :class:`~modwire.nn.modulated.PreNorm` (state-dict names ``attn.norm``,
    ``attn.fn.{q,k,v,o}``, ``ffn.norm``, ``ffn.fn.{fc1,fc2}``). ``causal``: position ``t`` attends to
    positions ``≤ t``; the mask ``[max_len, max_len]`` is built once (a non-persistent buffer) and sliced
    per forward. Shapes: x ``[B, N, dim]``, codes ``[(B,) N, d_code]``; bias / key_mask as in
    :func:`~modwire.nn.attention.attend` over ``[B, H, N, N]``.
    """

    def __init__(self, dim: int, num_heads: int, ffn_hidden: int, *, mod: ModulationSpec = PLAIN,
                 activation: str = "geglu", head_dim: int | None = None, qv_bias: bool = True,
                 dropout: float = 0.0, causal: bool = False, max_len: int = 0, attention: bool = True,
                 ffn: bool = True, attention_backend: str = "sdpa") -> None:
        super().__init__()
        attn = SelfAttention(dim, num_heads, head_dim=head_dim, qv_bias=qv_bias, mod=mod,
                             attention_backend=attention_backend)
        self.attn = PreNorm(dim, attn, dropout=dropout) if attention else None
        self.ffn = PreNorm(dim, ModulatedFFN(dim, ffn_hidden, mod=mod, activation=activation),
                           dropout=dropout) if ffn else None
        self.causal = causal
        if causal:
            self.register_buffer("causal_mask", torch.ones(max_len, max_len, dtype=torch.bool).tril(),
                                 persistent=False)

    def forward(self, x: Tensor, codes: Tensor | None = None, *, bias: Bias = None,
                key_mask: Tensor | None = None, return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``x [B, N, dim]`` → ``(x, attention weights [B, H, N, N] or None)``."""
        x, w = self.self_attend(x, codes, bias=bias, key_mask=key_mask, return_weights=return_weights)
        return (x if self.ffn is None else self.ffn(x, codes)), w

    def self_attend(self, x: Tensor, codes: Tensor | None = None, *, bias: Bias = None,
                    key_mask: Tensor | None = None, return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """The attention sub-layer alone: ``(x + Drop(Attn(LN x)), weights or None)``; ``(x, None)`` without one."""
        if self.attn is None:
            return x, None
        if self.causal:
            t = x.shape[1]                                                  # [T, T]: key ≤ query
            mask = self.causal_mask[:t, :t] if t <= self.causal_mask.shape[0] else \
                torch.ones(t, t, dtype=torch.bool, device=x.device).tril()  # a block built without max_len
            key_mask = mask if key_mask is None else key_mask & mask
        return self.attn(x, codes, bias=bias, key_mask=key_mask, return_weights=return_weights)


class ReadOut(nn.Module):
    """Read-out (NAC §2.1): output modules attend to the final states (SKMDPA, no residual as
    in the authors' code), ModFFN, then ``logits = head(Σ_o softmax_o(conf(y_o)) · y_o)``
    (equal to a confidence-weighted sum of per-module logits: the head is linear and shared;
    the plain softmax of the authors' released configs, ``OutputLatentPooling`` with
    ``softmax_type: vanilla`` in ``tokenizers.py``). ``norm=True`` puts a LayerNorm between the
    ModFFN and the pooling (the paper has none; the authors' final configs none either).

    Shapes: queries ``[(B,) Uo, dim]``, states ``[B, U, dim]``; returns logits ``[B, C]``, the
    attention weights (or None) and the confidences ``[B, Uo]``.
    """

    def __init__(self, dim: int, num_outputs: int, num_heads: int, ffn_hidden: int, num_classes: int, *,
                 mod: ModulationSpec = PLAIN, activation: str = "geglu", head_dim: int | None = None,
                 qv_bias: bool = True, norm: bool = False, attention_backend: str = "sdpa") -> None:
        super().__init__()
        attn = ModulatedAttention(dim, num_heads, head_dim=head_dim, qv_bias=qv_bias, mod=mod,
                                  attention_backend=attention_backend)
        self.attn = PreNorm(dim, attn, context_dim=dim, residual=False)
        self.ffn = PreNorm(dim, ModulatedFFN(dim, ffn_hidden, mod=mod, activation=activation))
        self.norm = nn.LayerNorm(dim) if norm else None
        # One output slot needs no confidence: softmax over a single module is 1. No bias: a shift
        # shared by every output module cancels in the softmax over them.
        self.confidence = nn.Linear(dim, 1, bias=False) if num_outputs > 1 else None
        self.head = linear_head(dim, num_classes)

    def forward(self, queries: Tensor, states: Tensor, *, out_codes: Tensor | None = None,
                state_codes: Tensor | None = None, bias: Bias = None, key_mask: Tensor | None = None,
                return_weights: bool = False, pre_logits: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """``pre_logits``: the pooled ``Σ_o conf_o · y_o [B, dim]`` in place of the logits (what ``head`` reads)."""
        y, w = self.attn(queries, context=states, code_q=out_codes, code_kv=state_codes, bias=bias,
                         key_mask=key_mask, return_weights=return_weights)
        y = self.ffn(y, out_codes)
        if self.norm is not None:
            y = self.norm(y)
        if self.confidence is None:
            conf = y.new_ones(y.shape[:-1])
        else:
            conf = self.confidence(y).squeeze(-1).softmax(dim=-1)  # [B, Uo]
        pooled = (conf.unsqueeze(-1) * y).sum(dim=-2)                   # [B, dim]
        return (pooled if pre_logits else self.head(pooled)), w, conf
