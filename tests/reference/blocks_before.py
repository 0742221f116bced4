"""The three transformer blocks modwire had before issue 37 (item 3) made them configurations of the one
:class:`modwire.nn.blocks.TransformerBlock`, kept here with their literal forwards (and state-dict layouts)
so that tests/nn/test_transformer_block.py can copy their weights into the new block and compare outputs
in float64:

* :class:`ProcessorLayer`: NAC's propagator / Perceiver IO's latent self-attention layer / the ViT's block
  (``x + Attn(LN x; bias = log K̂)``, then ``x + ModFFN(LN x)``, ``PreNorm`` names);
* :class:`AiTBlock`: AiT Figure 1b as the authors' code wires it (with the optional global workspace);
* :class:`CausalBlock`: the LM's pre-LN causal block with dropout (names ``norm1``/``attn``/``norm2``/``ffn``).

They are built from the library's primitives (``PreNorm``, ``SelfAttention``, ``ModulatedFFN``,
``GlobalWorkspace``), which the item did not change in what they compute: what is pinned is the wiring.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from modwire.nn.blocks import SelfAttention
from modwire.nn.modulated import PLAIN, ModulatedFFN, ModulationSpec, PreNorm
from modwire.nn.workspace import GlobalWorkspace


class ProcessorLayer(nn.Module):
    def __init__(self, dim: int, num_heads: int, hidden_dim: int, *, mod: ModulationSpec = PLAIN,
                 activation: str = "geglu", head_dim: int | None = None, qv_bias: bool = True) -> None:
        super().__init__()
        self.attn = PreNorm(dim, SelfAttention(dim, num_heads, head_dim=head_dim, qv_bias=qv_bias, mod=mod))
        self.ffn = PreNorm(dim, ModulatedFFN(dim, hidden_dim, mod=mod, activation=activation))

    def forward(self, x: Tensor, codes: Tensor | None = None, *, bias=None, key_mask: Tensor | None = None,
                return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        x, w = self.attn(x, codes, bias=bias, key_mask=key_mask, return_weights=return_weights)
        return self.ffn(x, codes), w


class AiTBlock(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        d = c.d_model
        self.attn = PreNorm(d, SelfAttention(d, c.num_heads, qv_bias=c.qv_bias)) if c.self_attention else None
        self.ffn = PreNorm(d, ModulatedFFN(d, c.ffn_hidden, activation="gelu"), residual=not c.workspace) \
            if c.ffn else None
        self.workspace = GlobalWorkspace(
            d, num_slots=c.num_slots, slot_dim=c.slot_dim, num_heads=c.workspace_heads,
            bottleneck_size=c.bottleneck_size, alpha=c.memory_alpha, beta=c.hopfield_beta, steps=c.hopfield_steps,
            pool=c.pool, memory_init=c.memory_init, retrieval=c.retrieval, retrieval_heads=c.num_heads,
            qv_bias=c.qv_bias, write_grad=c.write_grad, eps=c.balance_eps, bottleneck_softmax=c.bottleneck_softmax,
            normalize_update=c.normalize_update, bias=c.bottleneck_bias, head_split=c.bottleneck_head_split,
            write_residual=c.write_residual, write_dropout=c.write_dropout) if c.workspace else None
        if self.workspace is not None:
            self.workspace.memory_forward = c.eval_memory_forward

    def forward(self, x: Tensor, *, bias: Tensor | None = None, record: bool = False):
        w = rec = None
        if self.attn is not None:
            x, w = self.attn(x, None, bias=bias, return_weights=record)
        if self.workspace is None:
            return (x if self.ffn is None else self.ffn(x, None)), w, None
        h = x if self.ffn is None else self.ffn(x, None)
        out, rec = self.workspace(h, record=record)
        return x + out, w, rec


class CausalBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, hidden: int, dropout: float, max_len: int = 0) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), SelfAttention(dim, num_heads)
        self.norm2, self.ffn = nn.LayerNorm(dim), ModulatedFFN(dim, hidden, activation="gelu")
        self.drop = nn.Dropout(dropout)
        self.register_buffer("causal", torch.ones(max_len, max_len, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        causal = self.causal[:t, :t] if t <= self.causal.shape[0] else \
            torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        a, _ = self.attn(self.norm1(x), key_mask=causal)
        x = x + self.drop(a)
        return x + self.drop(self.ffn(self.norm2(x)))
