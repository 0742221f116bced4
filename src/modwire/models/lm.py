"""A causal transformer language model, with Neural Function Modules over its layers (NFM §4.6,
Table 8: WikiText-2 perplexity with and without NFM).

``model(ids [B, T]) → logits [B, T, V]``: token embedding plus learned absolute positions, dropout,
``num_layers`` pre-LN causal blocks (:class:`CausalBlock`: ``x + Drop(Attn(LN₁ x))``, then
``x + Drop(FFN(LN₂ x))``; the one :class:`~modwire.nn.blocks.TransformerBlock` of modwire, whose
attention is the one kernel :func:`~modwire.nn.attention.attend` with a causal key mask), a final LayerNorm and
the output layer, by default tied to the token embedding (``tie_embeddings``; Press & Wolf 2017).

**NFM** (``nfm.enabled``): the blocks run inside :class:`~modwire.nn.nfm.NFM` (Algorithm 1,
``layout="tokens"``): before block ``i``, the state ``h^(i-1)`` attends, at each position, over
the states every earlier block (and every block of an earlier pass) wrote at that same position,
top-``k`` with a null slot, and ``h^(i-1) + γ·read`` enters block ``i``. Attention runs over
layers, never over positions, so the model stays causal (position ``t``'s logits depend on tokens
``≤ t`` only; tested with NFM on). Table 8's note: "in the transformer integration, NFM does not add
any additional parameters and only a trivial amount of additional computation". So each NFM
module (:class:`SharedProjectionLayer`, an :class:`~modwire.nn.nfm.NFMLayer`) has no projections of
its own: module ``(k, i)`` queries with block ``i``'s ``W_q LN₁(h^(i-1))``, projects the state
``h^(i)`` that block ``i`` writes ONCE, with that same block's ``LN₁``, ``W_k``, ``W_v`` (the writer's
projections: "linear operations (separate per module) to compute the key, value, and query for
each module", §3.2.1, as the core does for every integration), and outputs ``h + γ·W_o A`` with
the block's ``W_o`` (in place of the classifiers' ``σ(BN(A W_o1)) W_o2``): heads and head width are
the block's, scores scaled as in the block (``nfm.score_scale="sqrt_d_k"`` in the presets), and one
scalar ``γ`` (initialised to 0, §3.2.1) per module is the only new parameter. Hence ``nfm.d_k``,
``d_v``, ``num_heads``, ``ffn_hidden``, ``norm`` and ``activation`` have no meaning here: values other than
their defaults are refused.

Cost per token and pass, ``L`` layers of width ``d`` (FFN ``4d``): a query ``W_q``, a key and a
value projection of the written state, and ``W_o``: ``4d²`` per layer (the first module of the
first pass has no query, the last module of the last pass writes nothing) against the block's
``12d²``, so about +29 % of the body's matrix FLOPs for the 6-layer one-pass preset; the attention
over at most ``L·passes`` memory entries per position is small. Measured speed:
``benchmarks/bench_nfm.py --presets '*transformer_lm*'``.

Our choices (the appendix that describes Table 8's model is not in our copy of the paper):

* one pass (``nfm.passes = 1``): a second pass would double the computation, which is not "a
  trivial amount"; ``nfm.passes=2, nfm.share_blocks=true`` (no new parameter either) and
  ``share_blocks=false`` (a second copy of the blocks, Alg. 1's ``f_{θ_2}``) are options;
* Table 8's "Mechanisms" column (2 or 4) refers to a transformer whose state is split into
  independent mechanisms; this is a standard transformer (one mechanism);
* the sizes of ``transformer_lm_wikitext2`` (module bottom).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn import TransformerBlock
from ..nn.init import trunc_normal_
from ..nn.nfm import NFMLayer
from ..nn.checks import min_max, values_checkable
from .base import PretrainedModel
from .config import COUNT, Bounds, ModelConfig, example_generator, heads_of
from .inputs import Inputs, named_inputs
from .nfm import NFMConfig, NFMModelRecord, build_body
from .registry import register_model_type, register_preset
from ..errors import UserError

__all__ = ["CausalBlock", "SharedProjectionLayer", "TransformerLM", "TransformerLMConfig"]


@dataclass
class TransformerLMConfig(ModelConfig):
    """Hyperparameters of :class:`TransformerLM`. ``vocab_size``: ids and output classes (fitted
    to the task); ``max_len``: the longest context (learned positions); ``dropout``: on the
    embedding and on each residual branch; ``nfm``: the shared NFM sub-config (module docstring)."""

    model_type = "transformer_lm"

    vocab_size: int = 33278
    max_len: int = 128
    d_model: int = 512
    num_layers: int = 6
    num_heads: int = 8
    ffn_hidden: int = 2048
    dropout: float = 0.1
    tie_embeddings: bool = True
    nfm: NFMConfig = field(default_factory=NFMConfig)

    bounds = {"vocab_size": Bounds(lo=2), "max_len": COUNT, "d_model": COUNT, "num_layers": COUNT,
              "num_heads": heads_of("d_model"), "ffn_hidden": COUNT, "dropout": Bounds(lo=0, hi=1, hi_open=True)}

    @property
    def num_classes(self) -> int:
        """Output classes per position: the vocabulary."""
        return self.vocab_size

    def example_inputs(self, batch: int = 2, *, device: Any = "cpu", seed: int = 0) -> dict[str, Any]:
        """Token ids ``[B, T]``, ``T = min(5, max_len)``."""
        return {"x": torch.randint(0, self.vocab_size, (batch, min(5, self.max_len)),
                                   generator=example_generator(device, seed), device=device)}

    def output_shape(self, inputs: dict[str, Any]) -> tuple[int, ...]:
        """Next-token logits at every position: ``[B, T, vocab_size]``."""
        return (*inputs["x"].shape, self.vocab_size)

    def input_overrides(self, inputs: Inputs, num_classes: int, heads: int = 1) -> dict[str, Any]:
        """A task of token ids ``x [T]`` whose targets are ids of the same vocabulary: ``vocab_size``
        and ``max_len`` (the task's sequence length) follow it."""
        named = named_inputs(inputs)
        spec = named.get("x")
        if set(named) != {"x"} or spec.kind != "tokens" or heads != 1:
            raise UserError(f"a 'transformer_lm' model reads one sequence of token ids 'x' and predicts the next "
                            f"token at every position; the task gives {sorted(named)} ({spec!r}, heads {heads})")
        if num_classes != spec.vocab_size:
            raise UserError(f"a 'transformer_lm' model predicts ids of its input vocabulary ({spec.vocab_size}), "
                            f"but the task has {num_classes} classes")
        return {"vocab_size": spec.vocab_size, "max_len": spec.length}

    def validate(self) -> None:
        """The reader reuses each block's projections (module docstring): the NFM options that size or
        shape the classifiers' reader have no meaning here, and a value other than the default is refused."""
        if not self.nfm.enabled:
            return
        default = NFMConfig()
        unused = [n for n in _READER_OPTIONS if getattr(self.nfm, n) != getattr(default, n)]
        if unused:
            raise UserError(f"config field 'nfm.{unused[0]}': got {getattr(self.nfm, unused[0])!r}, but the "
                            f"transformer LM's NFM reader reuses each block's LN and attention projections "
                            f"(heads = num_heads = {self.num_heads}, d_k = d_v = d_model / num_heads = "
                            f"{self.d_model // self.num_heads}, output W_o): leave {list(_READER_OPTIONS)} at "
                            f"their defaults")


_READER_OPTIONS = ("d_k", "d_v", "num_heads", "ffn_hidden", "norm", "activation")   # NFMLayer's own sizes: unused here


class CausalBlock(TransformerBlock):
    """The LM's configuration of the one :class:`~modwire.nn.blocks.TransformerBlock`: pre-LN, causal,
    plain linears, GELU FFN, dropout on each residual branch: ``x + Drop(Attn(LN₁ x))``,
    ``x + Drop(FFN(LN₂ x))``; ``x [B, T, d] → [B, T, d]`` (a Tensor, as the NFM body expects). ``LN₁``
    is ``attn.norm``, the projections ``attn.fn.{q,k,v,o}``, ``LN₂`` ``ffn.norm``. Checkpoints written
    before these names (``norm1``, ``attn.q``, ``norm2``, ``ffn.fc1``, …) load: :func:`rename_old_keys`."""

    def __init__(self, dim: int, num_heads: int, ffn_hidden: int, dropout: float, max_len: int = 0) -> None:
        super().__init__(dim, num_heads, ffn_hidden, activation="gelu", dropout=dropout, causal=True, max_len=max_len)
        self.register_load_state_dict_pre_hook(_rename_old_keys_hook)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x)[0]


# The LM's blocks before issue 37 held their sub-layers as norm1 / attn / norm2 / ffn; the one block
# wraps each sub-layer in a PreNorm. Old key (under a block's prefix) → new key.
_OLD_BLOCK_KEYS = {"norm1.": "attn.norm.", "norm2.": "ffn.norm.", **{f"attn.{p}.": f"attn.fn.{p}." for p in "qkvo"},
                   "ffn.fc1.": "ffn.fn.fc1.", "ffn.fc2.": "ffn.fn.fc2."}


def rename_old_keys(state: dict[str, Tensor], prefix: str = "") -> None:
    """In place: the keys of a :class:`CausalBlock` saved before issue 37 under ``prefix`` (e.g.
    ``body.blocks.0.``) get the block's current names; current keys are left alone."""
    for key in [k for k in state if k.startswith(prefix)]:
        rest = key[len(prefix):]
        for old, new in _OLD_BLOCK_KEYS.items():
            if rest.startswith(old):
                state[prefix + new + rest[len(old):]] = state.pop(key)
                break


def _rename_old_keys_hook(module: CausalBlock, state: dict[str, Tensor], prefix: str, *args) -> None:
    """A load-state-dict pre-hook: ``load_state_dict`` of an old checkpoint (:func:`rename_old_keys`)."""
    rename_old_keys(state, prefix)


class SharedProjectionLayer(NFMLayer):
    """The NFM module ``(k, i)`` of a :class:`CausalBlock` stack that owns no projection (NFM Table 8:
    "NFM does not add any additional parameters"): an :class:`~modwire.nn.nfm.NFMLayer` whose hooks
    use block ``i``'s own ``LN₁`` and attention projections (its heads and head width); only ``γ``
    (init 0, §3.2.1) is new. Memory, top-``k`` with the null slot and the attention itself are
    :meth:`NFMLayer.read <modwire.nn.nfm.NFMLayer.read>`'s, unchanged.

    * query (:meth:`project_query`): ``W_q LN₁(h^(i-1))`` of the block the module precedes;
    * memory (:meth:`project_memory`): the state ``h^(i)`` this block wrote, projected once by its
      writer ("linear operations (separate per module)", §3.2.1, as the core): ``W_k LN₁(h^(i))``,
      ``W_v LN₁(h^(i))`` with the same block's ``LN₁``, ``W_k``, ``W_v``;
    * output (:meth:`output`): ``h + γ·W_o A`` (the block's ``W_o`` in place of ``σ(BN(A W_o1)) W_o2``).

    States are channels-first ``[B, d, T]`` (NFM's ``tokens`` layout). :meth:`bind` gives the layer
    its block, which stays a submodule of the NFM body only (one copy of each weight in the state
    dict); deep copies follow it. ``reads`` / ``writes`` / ``residual`` as in :class:`~modwire.nn.nfm.NFMLayer`
    (``writes=False``: :meth:`write` refuses)."""

    def __init__(self, dim: int, num_heads: int, *, reads: bool = True, writes: bool = True, residual: bool = True,
                 k: int = 5, rescale: str = "space_to_depth", score_scale: str = "sqrt_d_k",
                 topk_softmax: str = "kept") -> None:
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 or dim % num_heads:
            raise UserError(f"SharedProjectionLayer: num_heads must be a positive int dividing dim={dim}, "
                            f"got {num_heads!r}")
        # NFMLayer's own W_q / W_k / W_v are not built (reads=writes=False); its W_o1, W_o2 are
        # dropped: the output is the block's W_o. The checks, k, heads, d_k, d_v, the score scale,
        # rescale, γ and random_attention are NFMLayer's.
        super().__init__(dim, dim, reads=False, writes=False, residual=residual, k=k, d_k=dim // num_heads,
                         d_v=dim // num_heads,
                         num_heads=num_heads, ffn_hidden=1, norm="none", rescale=rescale, score_scale=score_scale,
                         topk_softmax=topk_softmax)
        self.w_o1 = self.w_o2 = None
        self.reads, self.writes = reads, writes
        self._bound: tuple[CausalBlock, ...] = ()       # a reference, not a submodule (class docstring)

    def bind(self, block: CausalBlock) -> None:
        """Use ``block``'s ``LN₁``, ``W_q``, ``W_k``, ``W_v``, ``W_o`` (its heads must be this layer's)."""
        attn = block.attn.fn
        if (attn.num_heads, attn.head_dim) != (self.heads, self.d_k):
            raise UserError(f"SharedProjectionLayer: expected a block with {self.heads} heads of width {self.d_k}, "
                            f"got {attn.num_heads} of width {attn.head_dim}")
        self._bound = (block,)

    @property
    def block(self) -> CausalBlock:
        """The bound block."""
        if not self._bound:
            raise RuntimeError("SharedProjectionLayer: call bind(block) before using the layer")
        return self._bound[0]

    def project_query(self, h: Tensor) -> Tensor:
        """``h [B, d, T]`` → ``W_q LN₁(h)`` ``[B, H, d_k, T]``."""
        norm, attn = self.block.attn.norm, self.block.attn.fn                     # LN₁, W_q
        return self._heads(attn.q(norm(h.transpose(1, 2))))

    def project_memory(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """This block's output ``h [B, d, T]`` → ``(W_k LN₁(h), W_v LN₁(h))``, each ``[B, H, d_k, T]``."""
        norm, attn = self.block.attn.norm, self.block.attn.fn                     # LN₁, W_k, W_v
        z = norm(h.transpose(1, 2))
        return self._heads(attn.k(z)), self._heads(attn.v(z))

    def _heads(self, x: Tensor) -> Tensor:
        """``[B, T, H·d]`` → ``[B, H, d, T]`` (a view: the read's products follow its strides)."""
        return x.transpose(1, 2).unflatten(1, (self.heads, x.shape[-1] // self.heads))

    def output(self, a: Tensor, h: Tensor) -> Tensor:
        """``A [B, H·d_v, T]`` → ``h + γ·W_o A``, shaped like ``h [B, d, T]``."""
        return h + self.gamma * self.block.attn.fn.o(a.transpose(1, 2)).transpose(1, 2)


class TransformerLM(PretrainedModel):
    """``model(ids [B, T]) → logits [B, T, vocab_size]`` (module docstring); ``forward_record``
    adds the final states ``[B, T, d]`` and, with NFM, one :class:`~modwire.nn.nfm.NFMRecord` per reader
    (:class:`~modwire.models.nfm.NFMModelRecord`)."""

    config_class = TransformerLMConfig
    record_type = NFMModelRecord
    eval_options = ("random_attention",)   # `modwire eval RUN --set model.overrides.random_attention=true`
    grad_checkpointing_refusal = None      # its causal blocks recompute exactly (the body's run_block)

    def __init__(self, config: TransformerLMConfig) -> None:
        super().__init__()
        self.config = c = config
        self._build_embedding()
        self.positions = nn.Parameter(torch.zeros(c.max_len, c.d_model))
        trunc_normal_(self.positions, std=0.02)
        self.drop = nn.Dropout(c.dropout)
        blocks = [CausalBlock(c.d_model, c.num_heads, c.ffn_hidden, c.dropout, c.max_len) for _ in range(c.num_layers)]
        factory = lambda p, i, cq, co, *, reads, writes, **o: SharedProjectionLayer(  # noqa: E731
            cq, c.num_heads, reads=reads, writes=writes, residual=o["residual"], k=o["k"], rescale=o["rescale"],
            score_scale=o["score_scale"], topk_softmax=o["topk_softmax"])
        self.body = build_body(c.nfm, blocks, [c.d_model] * (c.num_layers + 1), layout="tokens",
                               layer_factory=factory)
        for p in range(self.body.passes if c.nfm.enabled else 0):
            for i in range(c.num_layers):
                self.body.readers[p * c.num_layers + i].bind(self.body.block(p, i))
        self.norm = nn.LayerNorm(c.d_model)
        self._build_output()

    def _build_embedding(self) -> None:
        c = self.config
        self.embed = nn.Embedding(c.vocab_size, c.d_model, _weight=torch.empty(c.vocab_size, c.d_model))
        trunc_normal_(self.embed.weight, std=0.02)                 # (no second init by nn.Embedding)

    def _build_output(self) -> None:
        """The output layer (tied: the embedding and a bias)."""
        c = self.config
        self.head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size)
        self.head_bias = nn.Parameter(torch.zeros(c.vocab_size)) if c.tie_embeddings else None

    def prepare_state_dict(self, state: dict[str, Tensor]) -> None:
        """Weights saved before the blocks' current names load (:func:`rename_old_keys`)."""
        for name, module in self.named_modules():
            if isinstance(module, CausalBlock):
                rename_old_keys(state, f"{name}.")

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's ``set_grad_checkpointing`` (:class:`~modwire.models.base.PretrainedModel`): the body runs
        each causal block through it (with NFM, not the reads and writes between blocks)."""
        super().set_grad_checkpointing(enable)
        self.body.grad_checkpointing = enable

    def parameter_sets(self) -> dict[str, tuple[str, ...]]:
        """Named parameter subsets for ``modwire finetune``: ``vocabulary`` (embedding, positions,
        output layer), ``body`` (the blocks, and the NFM γ), ``nfm`` (the γ of every reader; with
        NFM only) and ``all``."""
        sets = {"vocabulary": ("embed.", "positions", "head"), "body": ("body.",), "all": ("",)}
        return {**sets, "nfm": ("body.readers.",)} if self.config.nfm.enabled else sets

    def new_task(self, num_classes: int, heads: int = 1) -> None:
        """A new vocabulary of ``num_classes`` ids: fresh embedding and output layer (the blocks and
        positions are kept), on the model's device and dtype; the config follows."""
        if heads != 1:
            raise UserError(f"a 'transformer_lm' model predicts one token per position (heads=1), got heads={heads}")
        self.config = self.config.replace(vocab_size=num_classes)
        like = self.norm.weight
        self._build_embedding()
        self._build_output()
        for m in (self.embed, self.head):
            if m is not None:
                m.to(like)
        if self.head_bias is not None:
            self.head_bias.data = self.head_bias.data.to(like)

    @property
    def num_classes(self) -> int:
        return self.config.vocab_size

    decay_exempt = ("positions",)    # the learned positional embedding

    def set_eval_options(self, *, random_attention: bool) -> None:
        """NFM §4.4's ablation: every reader's scores drawn from N(0, 1) (evaluation only)."""
        self.config = self.config.replace(nfm={"random_attention": random_attention})   # type-checked field
        self.body.random_attention = self.config.nfm.random_attention

    def forward(self, x: Tensor) -> Tensor:
        return self._run(x, record=False).logits

    def forward_record(self, x: Tensor) -> NFMModelRecord:
        return self._run(x, record=True)

    def _run(self, x: Tensor, *, record: bool) -> NFMModelRecord:
        self._check(x)
        t = x.shape[1]
        h = self.drop(self.embed(x) + self.positions[:t])                                 # [B, T, d]
        h = self.norm(self.body(h, record=record))
        logits = F.linear(h, self.embed.weight, self.head_bias) if self.head is None else self.head(h)
        return NFMModelRecord(logits=logits, states=h, nfm=list(self.body.records) if record else [])

    def _check(self, x: Tensor) -> None:
        if not isinstance(x, Tensor) or x.dim() != 2 or x.dtype.is_floating_point or x.dtype == torch.bool:
            got = f"{x.dtype} {list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise UserError(f"TransformerLM expects integer token ids [B, T], got {got}")
        if 0 in x.shape:
            raise UserError(f"TransformerLM expects token ids [B, T] with B, T >= 1, got an empty batch {list(x.shape)}")
        if x.shape[1] > self.config.max_len:
            raise UserError(f"TransformerLM: a context of {x.shape[1]} tokens exceeds max_len={self.config.max_len}")
        if values_checkable(x):            # one host sync, skipped while torch.compile traces (nn/checks.py)
            lo, hi = min_max(x)
            if lo < 0 or hi >= self.config.vocab_size:
                raise UserError(f"TransformerLM: token ids must lie in [0, {self.config.vocab_size}), got [{lo}, {hi}]")


register_model_type(TransformerLM)

# NFM §4.6 / Table 8 (WikiText-2, 15 epochs). The paper's text gives no architecture (its appendix is
# not in our copy): a 6-layer, 512-wide, 8-head pre-LN GPT-style model with tied embeddings and
# 128-token contexts is our choice (36.05e6 parameters, 17.0e6 of them the 33,278-word embedding).
_NFM_LM = {"enabled": True, "passes": 1, "k": 5, "score_scale": "sqrt_d_k"}


def _wikitext2(nfm: bool) -> TransformerLMConfig:
    return TransformerLMConfig(vocab_size=33278, max_len=128, d_model=512, num_layers=6, num_heads=8,
                               ffn_hidden=2048, dropout=0.2, nfm=_NFM_LM if nfm else {})


register_preset("transformer_lm_wikitext2", TransformerLM, lambda: _wikitext2(False),
                "NFM §4.6, Table 8 baseline (No-NFM; sizes our choice: the paper's appendix is not available)")
register_preset("nfm_transformer_lm_wikitext2", TransformerLM, lambda: _wikitext2(True),
                "NFM §4.6, Table 8 (NFM reusing each block's attention projections: + one γ per layer)")


def _micro(nfm: bool) -> TransformerLMConfig:
    return TransformerLMConfig(vocab_size=50, max_len=16, d_model=32, num_layers=3, num_heads=2, ffn_hidden=64,
                               dropout=0.0, nfm={**_NFM_LM, "passes": 2, "share_blocks": True} if nfm else {})


register_preset("transformer_lm_micro", TransformerLM, lambda: _micro(False), "test-sized causal transformer LM")
register_preset("nfm_transformer_lm_micro", TransformerLM, lambda: _micro(True),
                "test-sized causal transformer LM with NFM (two passes over shared blocks)")
