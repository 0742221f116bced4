"""Associative Transformer (AiT; "Associative Transformer is a sparse representation learner").

A ViT (:mod:`modwire.models.vit`: the AiT authors' patch embedding, no CLS token, the ViT's
classifier) whose blocks are AiT Figure 1b, wired as the authors' code wires them (``vit_hn.py``,
``ait.py``; the paper does not say where the block's LayerNorms and residuals sit):

    x ← x + SelfAttn(LN(x))                  (optional: Table 2 "W/O SA")
    Ξ ← LN(FFN(LN(x)))                       (the FFN without a residual, then its own LayerNorm)
    x ← x + Ξ + Ξ̂,  Ξ̂ = Hopfield(Ξ)          (the workspace reads Ξ and writes the memory from it;
                                              Ξ + Ξ̂ is §4.3's skip connection Ξ^{t+1} = Ξ̂^t + Ξ^t)

The workspace layer (squash → bottleneck attention over a low-rank memory → EWMA write →
Hopfield retrieval, AiT §4, Eq. 3-8) lives in :class:`modwire.nn.workspace.GlobalWorkspace`
(it owns the LayerNorm that makes ``Ξ``); its memory is a buffer: saved in checkpoints, updated by
training forwards, frozen in evaluation. The balance loss (Eq. 5-6) of every layer is summed and
reported as the auxiliary loss ``"balance"``; the paper's ``σ = 1e-2`` (§5.1, Eq. 6) is its
default weight (:attr:`AiT.aux_loss_defaults`: ``modwire train`` uses it unless
``aux_loss_weights.balance`` is set).

Table 2's ablations under this wiring (:data:`ABLATIONS`):

* "W/O memory (ViT)" (``workspace=False``): the block is the ViT's, ``x + FFN(LN x)`` (no output
  LayerNorm: that belongs to the workspace), so the model is exactly the AiT paper's ViT with the
  same weights; "Dense networks" (``self_attention=False, workspace=False``): ``x + FFN(LN x)``
  alone in every block.
* "W/O FF" (``ffn=False``): the workspace reads the block's stream, ``Ξ = LN(x)``, and the block
  adds ``Ξ + Ξ̂`` (the FFN removed from the authors' block, its output LayerNorm kept).
* "W/O SA" (``self_attention=False``): the FFN and workspace sub-layer alone.
* "W/O bottleneck" (``bottleneck_size=0``), "W/O Hopfield" (``retrieval="attention"``: ``Ξ̂ =
  MHA(Ξ, f_LT(γ))``, an attention built as the self-attention, so without query/value biases when
  ``qv_bias=False``), "Reset memory" (``memory_reset="epoch"``: every layer's memory redrawn when a
  training epoch starts, :meth:`AiT.start_epoch`): only the workspace changes.

Defaults: the paper where it speaks, the authors' code where it is silent or ambiguous
(docs/ait.md's departures table): Eq. 3's write ``γ̂ = LN(Dropout(Concat(heads) W^O))``
(``write_residual=False``), Eq. 3's top-k of the softmax over the whole pool
(``bottleneck_softmax="all"``), gradient through the written memory (``write_grad=True``: §1 / §4's
end-to-end training of the priors and the down-projections); the authors' Dropout 0.1 on the
write (``write_dropout``), no query/value biases in the self-attention (``qv_bias=False``; Eq. 1
prints none), their patch embedding (LayerNorm → Linear → LayerNorm, no positions). The Table 1 /
Table 6 presets read the final tokens with the authors' classifier (``classifier="flatten"``:
LayerNorm over the flattened ``N·E`` features, then Linear), which gives exactly the parameters the
authors' model trains (tests/models/test_ait.py); ``classifier="mean"`` (§5.1's text: "pooled
representations") is the config's default. :data:`AUTHORS_AIT` turns a preset into the authors'
released model (``create_model("ait_small", **AUTHORS_AIT)``, tested equal to a literal
re-statement of their code in float64: tests/reference/authors_ait.py).

Evaluation and the batch (documented, tested): with the paper's squashed pool (``pool="batch"``)
a sample's prediction depends on the other samples of its evaluation batch, only through the
memory ``γ^{t+1}`` written from the whole batch's patches before retrieval (§4.2, Figure 8 (1)).
``pool="sample"`` or ``eval_memory_forward=False`` (Figure 8 (2)) make every prediction a
function of its own sample only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..nn.blocks import TransformerBlock
from ..nn.workspace import BOTTLENECK_SOFTMAX, MEMORY_INITS, POOLS, RETRIEVALS, GlobalWorkspace, WorkspaceRecord
from .config import COUNT, POSITIVE, Bounds
from .registry import register_model_type, register_preset
from .set_model import SetModelRecord
from .tokenizer_config import TokenizerConfig
from .vit import ViT, ViTConfig, ait_patches
from ..errors import UserError

MEMORY_RESETS = ("never", "epoch")


@dataclass
class AiTConfig(ViTConfig):
    """AiT hyperparameters; defaults are AiT-Small on CIFAR-10 (§5.1, Table 6).

    ``num_slots`` M, ``slot_dim`` D, ``workspace_heads`` bottleneck heads, ``bottleneck_size`` k
    (0: dense attention, Table 2 "W/O bottleneck"), ``memory_alpha`` α of Eq. 4,
    ``hopfield_beta`` β and ``hopfield_steps`` of Eq. 7-8, ``pool`` (``batch``: the paper's
    squash; ``sample``; ``global``: all processes), ``memory_init`` (Table 3), ``retrieval``
    (``hopfield``, or ``attention``: "W/O Hopfield"), ``self_attention``, ``ffn``, ``workspace``
    (Table 2), ``memory_reset`` (``epoch``: Table 2 "Reset memory"), ``eval_memory_forward``
    (False: Figure 8 (2)), ``balance_eps`` ε of Eq. 6, ``write_dropout`` (the Dropout on
    ``Concat(heads) W^O`` in training, the authors' 0.1).

    The authors' code's choices that are options here (:data:`AUTHORS_AIT` sets them):
    ``write_residual`` (``γ̂ = LN(γ + Dropout(Concat(heads) W^O))``; default False: Eq. 3 as
    printed), ``bottleneck_softmax`` (``kept``: renormalised over the k kept patches; default
    ``all``: Eq. 3's top-k of the softmax over the pool), ``write_grad`` (False: the detached
    write; default True: gradient through the memory written in the same step). Options in
    neither: ``normalize_update`` (unit-norm ``γ̂`` before Eq. 4), ``bottleneck_bias`` (biases on
    ``W^Q, W^K, W^V, W^O``), ``bottleneck_head_split`` (heads of width ``D / workspace_heads`` with
    scale ``1/√(D/A)`` instead of Eq. 3's width ``D`` and ``1/√D``). ``qv_bias`` and
    ``classifier``: the ViT's (:class:`~modwire.models.vit.ViTConfig`; ``qv_bias`` False by
    default here, the authors'; ``flatten`` on the Table 1 presets). docs/ait.md lists each with
    what is measured of it."""

    model_type = "ait"

    d_model: int = 768
    num_layers: int = 2
    num_heads: int = 12
    ffn_hidden: int = 3072
    num_cls_tokens: int = 0
    qv_bias: bool = False
    num_slots: int = 32
    slot_dim: int = 32
    workspace_heads: int = 8
    bottleneck_size: int = 512
    memory_alpha: float = 0.9
    hopfield_beta: float = 1.0
    hopfield_steps: int = 1
    pool: str = "batch"
    memory_init: str = "gaussian"
    retrieval: str = "hopfield"
    write_grad: bool = True
    self_attention: bool = True
    ffn: bool = True
    workspace: bool = True
    memory_reset: str = "never"
    eval_memory_forward: bool = True
    balance_eps: float = 1e-10
    write_dropout: float = 0.1
    bottleneck_softmax: str = "all"
    normalize_update: bool = False
    bottleneck_bias: bool = False
    bottleneck_head_split: bool = False
    write_residual: bool = False
    tokenizer: TokenizerConfig = field(default_factory=lambda: ait_patches(32, 3, 4))

    bounds = {**ViTConfig.bounds, "num_slots": COUNT, "slot_dim": COUNT, "workspace_heads": COUNT,
              "bottleneck_size": Bounds(lo=0, note="0: dense attention"),
              "memory_alpha": Bounds(lo=0, hi=1, hi_open=True), "hopfield_beta": POSITIVE,
              "hopfield_steps": COUNT, "balance_eps": Bounds(lo=0), "write_dropout": Bounds(lo=0, hi=1, hi_open=True)}
    choices = {**ViTConfig.choices, "pool": POOLS, "memory_init": MEMORY_INITS, "retrieval": RETRIEVALS,
               "memory_reset": MEMORY_RESETS, "bottleneck_softmax": BOTTLENECK_SOFTMAX}

    def validate(self) -> None:
        super().validate()
        if self.bottleneck_head_split and self.slot_dim % self.workspace_heads:
            raise UserError(f"config field 'workspace_heads': got {self.workspace_heads}, expected a divisor of "
                            f"slot_dim={self.slot_dim} (bottleneck_head_split splits D over the heads)")
        if not (self.self_attention or self.ffn or self.workspace):
            raise UserError("config fields 'self_attention', 'ffn', 'workspace': a block needs at least one of them")

    def unused_fields(self) -> tuple[str, ...]:
        unused = super().unused_fields() + (() if self.self_attention else ("attention_backend",))
        if not self.workspace:
            unused += ("num_slots", "slot_dim", "workspace_heads", "bottleneck_size", "memory_alpha",
                       "hopfield_beta", "hopfield_steps", "pool", "memory_init", "retrieval", "write_grad",
                       "memory_reset", "eval_memory_forward", "balance_eps", "write_dropout", "bottleneck_softmax",
                       "normalize_update", "bottleneck_bias", "bottleneck_head_split", "write_residual")
        return unused


class AiTBlock(TransformerBlock):
    """AiT Figure 1b, wired as the authors' code (module docstring): the ViT's block
    (:class:`~modwire.nn.blocks.TransformerBlock`, GELU, plain linears; its state-dict names, so a
    "W/O memory" AiT loads ViT weights) with the global workspace as its extra sub-layer:

        x ← x + Attn(LN x)                    (:meth:`~modwire.nn.blocks.TransformerBlock.self_attend`)
        Ξ = LN(FFN(LN x)),  x ← x + Ξ + Ξ̂     (the FFN's output is Ξ's input, not added to x)

    each part optional (Table 2). Without the workspace the block is the ViT's (``x + FFN(LN x)``)."""

    def __init__(self, c: AiTConfig) -> None:
        super().__init__(c.d_model, c.num_heads, c.ffn_hidden, activation="gelu", qv_bias=c.qv_bias,
                         attention=c.self_attention, ffn=c.ffn, attention_backend=c.attention_backend)
        self.workspace = GlobalWorkspace(
            c.d_model, num_slots=c.num_slots, slot_dim=c.slot_dim, num_heads=c.workspace_heads,
            bottleneck_size=c.bottleneck_size, alpha=c.memory_alpha, beta=c.hopfield_beta, steps=c.hopfield_steps,
            pool=c.pool, memory_init=c.memory_init, retrieval=c.retrieval, retrieval_heads=c.num_heads,
            qv_bias=c.qv_bias, write_grad=c.write_grad, eps=c.balance_eps, bottleneck_softmax=c.bottleneck_softmax,
            normalize_update=c.normalize_update, bias=c.bottleneck_bias, head_split=c.bottleneck_head_split,
            write_residual=c.write_residual, write_dropout=c.write_dropout) if c.workspace else None
        if self.workspace is not None:
            self.workspace.memory_forward = c.eval_memory_forward
            if self.ffn is not None:
                self.ffn.residual = False                                   # FFN(LN x) is Ξ's input

    def forward(self, x: Tensor, *, bias: Tensor | None = None, record: bool = False):
        """``x [B, N, d]`` → ``(x, self-attention weights or None, WorkspaceRecord or None)``."""
        if self.workspace is None:                                          # the ViT's block
            x, w = super().forward(x, bias=bias, return_weights=record)
            return x, w, None
        x, w = self.self_attend(x, bias=bias, return_weights=record)       # x + Attn(LN x)
        h = x if self.ffn is None else self.ffn(x)                          # FFN(LN x) (W/O FF: x)
        out, rec = self.workspace(h, record=record)                         # Ξ + Ξ̂, Ξ = LN(h)
        return x + out, w, rec


@dataclass
class AiTRecord(SetModelRecord):
    """An AiT forward pass: the ViT's record (``states [B, N, d]``, each layer's self-attention weights
    ``[B, H, N, N]``, None for a layer without self-attention) plus ``workspace``, one
    :class:`~modwire.nn.workspace.WorkspaceRecord` per layer (AiT Eq. 3-8; None for a layer without one)."""

    workspace: list[WorkspaceRecord | None] = field(default_factory=list)


class AiT(ViT):
    """``model(x) → logits [B, C]``; ``forward_record(x)`` adds each layer's self-attention
    weights ``[B, H, N, N]`` and its :class:`~modwire.nn.workspace.WorkspaceRecord` (:class:`AiTRecord`).
    The classifier (``classifier``) is the ViT's."""

    config_class = AiTConfig
    grad_checkpointing_refusal = ("writes each layer's workspace memory in a training forward (AiT Eq. 4): a "
                                  "block run again in the backward would write it twice")
    record_type = AiTRecord
    aux_loss_defaults: ClassVar[dict[str, float]] = {"balance": 1e-2}     # σ of AiT Eq. 6 (§5.1), the trainer's weight unless configured

    def make_block(self) -> nn.Module:
        return AiTBlock(self.config)

    @property
    def workspaces(self) -> list[GlobalWorkspace]:
        return [b.workspace for b in self.blocks if b.workspace is not None]

    def encode(self, x: Tensor, *, record: bool) -> tuple[Tensor, dict[str, Any]]:
        bias = self.position_bias(x.shape[1])                               # [H, N, N] or None
        weights, records = [], []
        for block in self.blocks:
            x, w, rec = block(x, bias=bias, record=record)
            weights.append(w)
            records.append(rec)
        return x, {"propagator_attention": weights if record else [], "workspace": records if record else []}

    def auxiliary_losses(self) -> dict[str, Tensor]:
        """``{"balance": Σ_layers Σ_heads ℓ_bottleneck_i}`` (AiT Eq. 6, without σ) after a training
        forward; ``{}`` in evaluation or without a workspace."""
        spaces = self.workspaces
        if not self.training or not spaces or any(s.balance is None for s in spaces):
            return {}
        return {"balance": torch.stack([s.balance for s in spaces]).sum()}

    eval_options = ("eval_memory_forward",)   # `modwire eval RUN --set model.overrides.eval_memory_forward=false`

    def set_eval_options(self, *, eval_memory_forward: bool) -> None:
        """Type-checked as the config field it is (``eval_memory_forward``; a non-bool is refused)."""
        self.config = self.config.replace(eval_memory_forward=eval_memory_forward)
        self.set_memory_forward(self.config.eval_memory_forward)

    def set_memory_forward(self, enabled: bool) -> None:
        """Evaluation with (True, Figure 8 (1)) or without (False, (2)) the memory forward."""
        self.config = self.config.replace(eval_memory_forward=enabled)
        for s in self.workspaces:
            s.memory_forward = enabled

    def start_epoch(self, epoch: int, generator: torch.Generator) -> None:
        """Called by the trainer when a training epoch starts: Table 2 "Reset memory" redraws
        every layer's memory (``memory_reset="epoch"``); otherwise nothing."""
        if self.config.memory_reset == "epoch":
            for s in self.workspaces:
                s.reset_memory(generator)

    def parameter_sets(self) -> dict[str, tuple[str, ...]]:
        return {**super().parameter_sets(), "workspace": tuple(f"blocks.{i}.workspace." for i in range(len(self.blocks)))}


register_model_type(AiT)

# Table 2's rows as config overrides (on top of a full AiT preset); what each builds: module docstring.
ABLATIONS: dict[str, dict[str, Any]] = {
    "ait": {},
    "reset_memory": {"memory_reset": "epoch"},
    "without_hopfield": {"retrieval": "attention"},
    "without_memory": {"workspace": False},
    "dense_networks": {"self_attention": False, "workspace": False},
    "without_bottleneck": {"bottleneck_size": 0},
    "without_self_attention": {"self_attention": False},
    "without_ffn": {"ffn": False},
}
# Not in the paper nor the authors' code: the two options modwire offered against the memory collapse
# (modwire.nn.workspace, "Memory collapse"); combine with any Table 2 row.
NO_COLLAPSE: dict[str, Any] = {"bottleneck_softmax": "kept", "normalize_update": True}
# The network the authors released (their vit_hn.py, ait.py, MHA.py; a static Hopfield layer of hflayers),
# as overrides of a preset: create_model("ait_small", **AUTHORS_AIT) (tested equal to their forward, the memory
# written, the balance loss and the gradients in float64: tests/models/test_ait_authors.py). Not copied:
# their memory update during evaluation (the paper freezes it, §4.2), and the in-place memory write that
# makes their W^Q gradient use the updated memory (docs/ait.md).
AUTHORS_AIT: dict[str, Any] = {"write_residual": True, "bottleneck_softmax": "kept", "write_grad": False}


# AiT §5.1 / Table 6: Small / Medium / Base = 2 / 6 / 12 layers; per task (classes, image size,
# channels, patch size, memory slots, bottleneck size). AiT-Small / Medium / Base on CIFAR-10 have
# 15,673,322 / 45,761,770 / 90,894,442 parameters: those the authors' model trains (their printed totals,
# Table 1's 15.8 / 45.9 / 91.0 M, less 109,056 created and never used and the memory, a frozen Parameter
# there; tests/models/test_ait.py).
_SIZES = {"small": 2, "medium": 6, "base": 12}
_TABLE1 = {"small": "15.67 M; Table 1: 15.8 M", "medium": "45.76 M; Table 1: 45.9 M", "base": "90.89 M; Table 1: 91.0 M"}
_TASKS = {"cifar10": (10, 32, 3, 4, 32, 512), "cifar100": (100, 32, 3, 4, 32, 512),
          "triangle": (2, 64, 1, 32, 32, 64), "pet": (37, 224, 3, 16, 128, 512)}


def _ait(layers: int, classes: int, size: int, channels: int, patch: int, slots: int, k: int) -> AiTConfig:
    return AiTConfig(num_classes=classes, num_layers=layers, num_slots=slots, bottleneck_size=k, classifier="flatten",
                     tokenizer=ait_patches(size, channels, patch))


for _size, _layers in _SIZES.items():
    for _task, _shape in _TASKS.items():
        register_preset(f"ait_{_size}_{_task}", AiT, lambda l=_layers, s=_shape: _ait(l, *s),
                        f"AiT §5.1, Table 6 (AiT-{_size.capitalize()}, {_task})")
    register_preset(f"ait_{_size}", AiT, lambda l=_layers: _ait(l, *_TASKS["cifar10"]),
                    f"AiT Table 1 (AiT-{_size.capitalize()}, CIFAR-10; {_TABLE1[_size]})")

register_preset("ait_micro", AiT, lambda: AiTConfig(
    num_classes=5, d_model=32, num_layers=2, num_heads=2, ffn_hidden=48, num_slots=8, slot_dim=8,
    workspace_heads=2, bottleneck_size=6, tokenizer=ait_patches(8, 1, 2)),
    "test-sized AiT (8×8 images)")

# AiT §5.8 / Table 6 "Relational reasoning": Sort-of-CLEVR's 75×75×3 images in 5×5 patches, 32 slots, bottleneck
# size 256, plus the question token (the 11-d question of task sort_of_clevr_image; SetModelConfig.question_dim).
register_preset("ait_small_sort_of_clevr", AiT, lambda: _ait(2, 10, 75, 3, 5, 32, 256).replace(question_dim=11),
                "AiT §5.8, Table 6 (AiT-Small, Sort-of-CLEVR with a question token)")
