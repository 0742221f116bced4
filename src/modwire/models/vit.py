"""Vision Transformer (Dosovitskiy et al. 2021): the baseline of Neural Interpreters (NI §4.2-4.3,
Table 5) and the backbone of the Associative Transformer (AiT §5.1).

A :class:`~modwire.models.set_model.SetModel` (patch embedding, CLS tokens, heads) whose body is
``num_layers`` pre-LN blocks, each ``x + Attn(LN(x))`` then ``x + MLP(LN(x))`` with a GELU MLP:
the same :class:`~modwire.nn.blocks.TransformerBlock` as NAC's propagators with the modulation off
(plain linear layers), so the ViT, Perceiver IO's latent transformer, NAC, the AiT and the causal LM
share one block and one attention kernel (:func:`~modwire.nn.attention.attend`, fused when exact).

Classifier: the mean of the final tokens after a LayerNorm (or the CLS tokens), then a linear head
(``classifier="mean"``, the ViT's pooled output and AiT §5.1's "pooled representations"), or the AiT
authors' classifier (``classifier="flatten"``: one LayerNorm over the flattened ``N·E`` features of
the final tokens, then one Linear; :class:`FlatClassifier`), which the AiT Table 1 presets of both
the ViT and the AiT use: it is what gives Table 1's parameter counts.

The AiT paper's ViT baselines (``vit_{small,medium,base}_*``) are the AiT authors' ViT (their
``vit_hn.py`` with ``sparse=False``): patches embedded by LayerNorm → Linear → LayerNorm
(``tokenizer.patch_norm``) with no positions (``tokenizer.positions="none"``: their positions and CLS token
are created and never used), no query/value biases in the self-attention (``qv_bias=False``; the
output projection keeps its bias), the flattened classifier. AiT §3 says only that patches are
"mapped to embeddings with the linear projection" and prints no biases (Eq. 1). The NI paper's
ViTs (``vit_digits``, ``vit_pgm``, ``vit_micro``) keep a conv patch embedding, positions and biases.

Positions: learned absolute positions added to the patch tokens (``tokenizer.positions="absolute"``,
ViT), none, or NI App. C.2.3's relative positional bias (Eq. 20-21, without NI's per-function term
Eq. 22-23), one bias per head on the attention logits among patch tokens, 0 for pairs involving
a CLS token (NI §4.2: "applied only to the first 64 input elements"). One bias module serves every
layer, as in NI. Attention runs on SDPA's fused kernels, except a training step with the learned
relative bias on the CPU: the CPU's fused kernel has no gradient for a bias, so that step takes
SDPA's math path (:func:`~modwire.nn.attention.fused_attention`). ``attention_backend="flex"`` runs
the self-attention on FlexAttention instead (:mod:`modwire.nn.flex`: the relative bias as a
``score_mod``, with its gradient), the same maths: a speed option for GPUs (on the CPU, training
still takes SDPA's math path). The AiT's blocks take it too (their self-attention; the workspace's
attention is its own).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..nn import TransformerBlock
from ..nn.blocks import linear_head
from ..nn.attention import ATTENTION_BACKENDS
from ..nn.positions import RelativePositionBias, pad_bias
from .config import COUNT, heads_of
from .registry import register_model_type, register_preset
from .set_model import SetModel, SetModelConfig
from .tokenizer_config import TokenizerConfig
from ..errors import UserError


CLASSIFIERS = ("mean", "flatten")


@dataclass
class ViTConfig(SetModelConfig):
    """ViT hyperparameters; defaults are NI Table 5 (the digits ViT, 1.80 × 10⁶ parameters).
    ``classifier``: ``mean`` (pooled, or the CLS tokens) or ``flatten`` (the AiT authors'; module
    docstring); ``qv_bias``: biases on the self-attention's query and value projections (False:
    the AiT authors'; the key has none in any model, a softmax cancels it)."""

    model_type = "vit"

    num_layers: int = 8
    num_heads: int = 3
    ffn_hidden: int = 192
    pos_dim: int = 32                  # relative positions: width of e_row / e_col (NI App. C.2.3)
    classifier: str = "mean"
    qv_bias: bool = True
    attention_backend: str = "sdpa"    # the self-attention's kernel: "sdpa" or "flex" (FlexAttention); the same maths

    bounds = {**SetModelConfig.bounds, "num_layers": COUNT, "ffn_hidden": COUNT, "pos_dim": COUNT,
              "num_heads": heads_of("d_model")}
    choices = {**SetModelConfig.choices, "classifier": CLASSIFIERS, "attention_backend": ATTENTION_BACKENDS}

    def validate(self) -> None:
        super().validate()
        if self.classifier == "flatten" and (self.tokenizer.kind != "patches" or self.num_cls_tokens or self.task_input):
            raise UserError(f"config field 'classifier': 'flatten' reads a fixed number of patch tokens and one "
                            f"head (tokenizer.kind 'patches', num_cls_tokens 0, task_input False); got tokenizer.kind "
                            f"{self.tokenizer.kind!r}, num_cls_tokens {self.num_cls_tokens}: use classifier='mean'")

    def unused_fields(self) -> tuple[str, ...]:
        return () if self.tokenizer.positions == "relative" else ("pos_dim",)


class FlatClassifier(nn.Module):
    """The AiT authors' classifier (``classifier="flatten"``): LayerNorm over the flattened ``N·E``
    features of the final tokens, then one Linear. ``[..., N, E] → [..., C]``."""

    def __init__(self, num_tokens: int, dim: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(num_tokens * dim)
        self.linear = linear_head(num_tokens * dim, num_classes)

    def forward(self, y: Tensor) -> Tensor:
        return self.linear(self.norm(y.flatten(-2)))                         # [..., N·E] → [..., C]


class ViT(SetModel):
    """``model(x) → logits`` (see :mod:`modwire.models.set_model` for the output shapes);
    ``forward_record(x)`` adds every layer's attention weights ``[B, H, N, N]``
    (:class:`~modwire.models.set_model.SetModelRecord`). With
    ``classifier="flatten"`` the final per-token LayerNorm and the mean are replaced by
    :class:`FlatClassifier` (``heads``)."""

    config_class = ViTConfig
    grad_checkpointing_refusal = None                 # its blocks recompute exactly (run_block)

    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config)
        c = config
        if c.classifier == "flatten":
            self.norm = nn.Identity()                                        # FlatClassifier normalises
        self.blocks = nn.ModuleList(self.make_block() for _ in range(c.num_layers))
        self.relative = None
        if c.tokenizer.positions == "relative" and self.embed.grid is not None:
            self.relative = RelativePositionBias(self.embed.grid, c.num_heads, c.pos_dim)

    def _build_outputs(self) -> None:
        c = self.config
        if c.classifier == "mean":
            super()._build_outputs()
            return
        rows, cols = c.tokenizer.grid                                            # patch tokens, then the question's
        self.cls_tokens = None
        self.heads = FlatClassifier(rows * cols + bool(c.question_dim), c.d_model, c.num_classes)

    def _read(self, y: Tensor) -> Tensor:
        """``classifier="flatten"``: every final token, ``[B, 1, N, d]`` (one head reads them all)."""
        return super()._read(y) if self.config.classifier == "mean" else y.unsqueeze(1)

    def new_task(self, num_classes: int, heads: int = 1) -> None:
        if self.config.classifier == "mean":
            super().new_task(num_classes, heads)
            return
        if heads != 1:
            raise UserError(f"classifier='flatten' has one head; {heads} heads need classifier='mean'")
        like = self.heads.norm.weight
        self.config = self.config.replace(num_classes=num_classes)
        self._build_outputs()
        self.heads.to(like)

    # timm's API (classifier_api): a block is one layer of ``blocks`` (AiT: its Figure 1b block), its
    # output the token set; the flattened classifier pools nothing (its LayerNorm and Linear read every token).

    def intermediate_blocks(self) -> list[tuple[nn.Module, int]]:
        return [(b, 1) for b in self.blocks]

    def _pre_logits(self, read: Tensor) -> Tensor:
        return read if self.config.classifier == "mean" else self.heads.norm(read.flatten(-2))   # [B, 1, N·d]

    @property
    def head_hidden_size(self) -> int:
        return self.heads.norm.normalized_shape[0] if self.config.classifier == "flatten" else self.config.d_model

    def global_pool(self) -> str | None:
        return super().global_pool() if self.config.classifier == "mean" else None

    def classifier_name(self) -> str:
        return "heads" if self.config.classifier == "mean" else "heads.linear"

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if self.config.classifier == "mean":
            super().reset_classifier(num_classes, global_pool)
            return
        self._check_reset(num_classes, global_pool)
        self.replace_classifier(num_classes)                                 # the flattened LayerNorm is kept

    @classmethod
    def timm_overrides(cls, config: ViTConfig, **kw: Any) -> dict[str, Any]:
        """:meth:`SetModel.timm_overrides`; a ``global_pool`` on the flattened classifier switches it to ``mean``."""
        out = super().timm_overrides(config, **kw)
        if kw.get("global_pool") is not None and config.classifier == "flatten":
            out["classifier"] = "mean"
        return out

    def make_block(self) -> nn.Module:
        """One pre-LN block (the Associative Transformer overrides it with its Figure 1b block)."""
        c = self.config
        return TransformerBlock(c.d_model, c.num_heads, c.ffn_hidden, activation="gelu", qv_bias=c.qv_bias,
                                attention_backend=c.attention_backend)

    def position_bias(self, n: int) -> Tensor | None:
        """NI App. C.2.3's relative bias ``[H, N, N]`` over ``n`` tokens, or None."""
        return None if self.relative is None else pad_bias(self.relative(), n)

    def encode(self, x: Tensor, *, record: bool) -> tuple[Tensor, dict[str, Any]]:
        bias = self.position_bias(x.shape[1])                                            # [H, N, N]
        weights = []
        for block in self.blocks:
            x, w = self.run_block(block, x, bias=bias, return_weights=record)
            weights.append(w)
        return x, {"propagator_attention": weights if record else []}


register_model_type(ViT)


def _digits() -> ViTConfig:
    """NI Table 5: 192-d, depth 8, 3 heads × 64, MLP 192; 32×32 RGB digits in 4×4 patches, one CLS
    token and head per dataset (SVHN, MNIST-M, MNIST; NI §4.2), the relative positions NI uses."""
    return ViTConfig(num_classes=10, num_cls_tokens=3, task_input=True,
                     tokenizer=TokenizerConfig(kind="patches", image_size=32, in_channels=3, patch_size=4,
                                       positions="relative"))


register_preset("vit_digits", ViT, _digits, "NI Table 5 (digits ViT, 1.80e6 parameters)")

# AiT §5.1 / Table 6: Small / Medium / Base = 2 / 6 / 12 layers of 768-d, 12 heads, MLP 3072; no
# CLS token; patch size per task (CIFAR 4, Triangle 32, Oxford Pet 16). The AiT authors' ViT (module
# docstring: their vit_hn.py with sparse=False) has ViT-Small / Medium / Base on CIFAR-10 14,800,234 /
# 43,142,506 / 85,655,914 parameters used (tests/models/test_vit.py), Table 1's 14.9 / - / 85.7 M
# (their printed totals also count 109,056 created and never used: 14.91 / 43.25 / 85.76 M).
_AIT_SIZES = {"small": 2, "medium": 6, "base": 12}
_TABLE1 = {"small": "14.80 M; Table 1: 14.9 M", "medium": "43.14 M; not in Table 1", "base": "85.66 M; Table 1: 85.7 M"}
_AIT_TASKS = {"cifar10": (10, 32, 3, 4), "cifar100": (100, 32, 3, 4), "triangle": (2, 64, 1, 32),
              "pet": (37, 224, 3, 16)}


def ait_patches(size: int, channels: int, patch: int) -> TokenizerConfig:
    """The AiT authors' patch embedding (module docstring): LayerNorm → Linear → LayerNorm, no positions."""
    return TokenizerConfig(kind="patches", image_size=size, in_channels=channels, patch_size=patch,
                           patch_norm=True, positions="none")


def _ait_vit(layers: int, classes: int, size: int, channels: int, patch: int, question_dim: int = 0) -> ViTConfig:
    return ViTConfig(num_classes=classes, d_model=768, num_layers=layers, num_heads=12, ffn_hidden=3072,
                     num_cls_tokens=0, question_dim=question_dim, classifier="flatten", qv_bias=False,
                     tokenizer=ait_patches(size, channels, patch))


for _size, _layers in _AIT_SIZES.items():
    for _task, _shape in _AIT_TASKS.items():
        register_preset(f"vit_{_size}_{_task}", ViT, lambda l=_layers, s=_shape: _ait_vit(l, *s),
                        f"AiT §5.1, Table 6 (ViT-{_size.capitalize()}, {_task}; the AiT authors' ViT"
                        + (f"; {_TABLE1[_size]})" if _task == "cifar10" else ")"))

# AiT §5.8 / Table 6 "Relational reasoning": Sort-of-CLEVR's 75×75×3 images in 5×5 patches (225 tokens)
# plus one question token (the 11-d question vector of task sort_of_clevr_image, embedded by
# LayerNorm → Linear → LayerNorm), 10 answers, the flattened classifier over the 226 tokens.
SORT_OF_CLEVR = (10, 75, 3, 5, 11)
register_preset("vit_small_sort_of_clevr", ViT, lambda: _ait_vit(2, *SORT_OF_CLEVR),
                "AiT §5.8, Table 6 (ViT-Small, Sort-of-CLEVR with a question token)")

register_preset("vit_micro", ViT, lambda: ViTConfig(
    num_classes=5, d_model=32, num_layers=2, num_heads=2, ffn_hidden=48, pos_dim=8,
    tokenizer=TokenizerConfig(kind="patches", image_size=8, in_channels=1, patch_size=2, positions="relative")),
    "test-sized ViT (8×8 images, relative positions)")

# NI §4.3 trains ViTs "with the same architectural scaffolding" on PGM but gives no ViT table:
# NI Table 7's width (192-d, 4 heads) and 8 layers, 80×80 panels, one score per candidate.
register_preset("vit_pgm", ViT, lambda: ViTConfig(
    num_classes=1, d_model=192, num_layers=8, num_heads=4, ffn_hidden=192,
    tokenizer=TokenizerConfig(kind="panels", image_size=80, in_channels=16, num_context=8)),
    "NI §4.3 ViT baseline on PGM (width of NI Table 7; depth not given in the paper: 8)")
