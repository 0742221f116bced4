"""Perceiver IO (Jaegle et al. 2022), the NAC papers' baseline — NAC Table 4, PIO column.

Built from the same blocks as NAC with the modulation off and no kernel: learned
latents (the NAC module initial states) cross-attend to the tokens, ``L`` latent
self-attention layers with separate weights, and a decoder in which learned output
queries attend to the latents (App. B.2: a NAC module generalises a PIO latent). Field
names are NAC's where the hyperparameter is the same (``read_in_heads``,
``read_out_heads``, ``head_dim``, ``num_output_modules``, ``qv_bias``, ``read_out_norm``).

Where Table 4 is silent, the NAC authors' Perceiver IO (``external/perceiver_io.py``, adapted
from lucidrains' perceiver-pytorch, as NAC App. C says; their ``perceiver_io_tiny_imnet.yml``):
every head 64 wide (``cross_dim_head``, ``latent_dim_head``), one decoder head (``cross_heads``),
no query/key/value biases, the decoder's cross-attention without residual followed by a
residual FFN, no LayerNorm before the logits. Tested equal to a literal re-statement of that
code with its weights copied across (``tests/reference/authors_nac.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..nn import ReadIn, ReadOut, TransformerBlock
from ..nn.modulated import FFN_ACTIVATIONS
from ..nn.tokenizers import padding_mask
from .axis import ModuleAxis
from .base import Record
from .classifier_api import ReadOutClassifier
from .config import CLASSES, COUNT, ModelConfig, check_head_split, check_single_head
from .finetune_protocol import ReadOutHeadFineTuning
from .inputs import Inputs
from .registry import register_model_type, register_preset
from .tokenizer_config import CONV_BEFORE_ISSUE_35, TOKENIZERS, TokenizerConfig, build_tokenizer, single_input


@dataclass
class PerceiverIOConfig(ModelConfig):
    """Perceiver IO hyperparameters; defaults are NAC Table 4's PIO column (Tiny-ImageNet), and
    where it is silent the NAC authors' Perceiver IO (module docstring)."""

    model_type = "perceiver_io"

    num_classes: int = 200
    d_model: int = 384
    num_layers: int = 8
    num_latents: int = 320
    num_heads: int = 6
    read_in_heads: int = 1             # cross-attention heads
    read_out_heads: int = 1            # decoder heads (authors' cross_heads)
    head_dim: int | None = 64          # features per head (authors' *_dim_head); None: heads split d_model
    num_output_modules: int = 1        # decoder queries
    ffn_hidden: int = 1536
    activation: str = "geglu"
    qv_bias: bool = False              # biases on query and value projections (authors': none)
    read_out_norm: bool = False        # a LayerNorm before the logits (authors': none)
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(kind="conv", image_size=64))

    bounds = {"num_classes": CLASSES, **{n: COUNT for n in ("d_model", "num_layers", "num_latents", "num_output_modules",
                                                            "ffn_hidden", "head_dim", "num_heads", "read_in_heads",
                                                            "read_out_heads")}}
    choices = {"activation": FFN_ACTIVATIONS, "tokenizer.kind": TOKENIZERS}

    def validate(self) -> None:
        check_head_split(self, ("num_heads", "read_in_heads", "read_out_heads"))

    def example_inputs(self, batch: int = 2, *, device: Any = "cpu", seed: int = 0) -> dict[str, Any]:
        return {"x": self.tokenizer.example_input(batch, device=device, seed=seed)}

    def input_overrides(self, inputs: Inputs, num_classes: int, heads: int = 1) -> dict[str, Any]:
        """Perceiver IO reads one input through its tokenizer (the encoder's key/value array);
        one read-out: ``heads`` must be 1."""
        check_single_head(heads, self.model_type)
        return {"tokenizer": TokenizerConfig.for_input(single_input(inputs, self.model_type)),
                "num_classes": num_classes}


@dataclass
class PerceiverIORecord(Record):
    """A Perceiver IO forward pass (and, with NAC's fields added, a NAC's: :class:`~modwire.models.nac.NACRecord`).
    For a batch of ``B``: ``logits [B, C]``, ``states`` (final latents / processor states) ``[B, U, d]``,
    ``read_in_attention [B, H, U, N]`` (encoder; NAC Eq. 4-5), ``propagator_attention`` one
    ``[B, H, U, U]`` per latent layer (NAC Eq. 2-3), ``read_out_attention [B, H, U_o, U]`` (decoder) and
    ``readout_confidence [B, U_o]`` (NAC Fig. 6, 8; App. F)."""

    read_in_attention: Tensor | None = None
    propagator_attention: list[Tensor] = field(default_factory=list)
    read_out_attention: Tensor | None = None
    readout_confidence: Tensor | None = None


class PerceiverIO(ReadOutHeadFineTuning, ReadOutClassifier):
    """Perceiver IO classifier. ``model(x) → logits [B, num_classes]``;
    ``forward_record(x)`` adds the attention weights and the final ``states`` (:class:`PerceiverIORecord`)."""

    config_class = PerceiverIOConfig
    grad_checkpointing_refusal = None                 # its latent layers recompute exactly (run_block)
    record_type = PerceiverIORecord
    readout_design = ("output_queries",)              # the decoder's learned queries

    def __init__(self, config: PerceiverIOConfig) -> None:
        super().__init__()
        self.config = c = config
        self.latents = nn.Parameter(torch.randn(c.num_latents, c.d_model))
        self.output_queries = nn.Parameter(torch.randn(c.num_output_modules, c.d_model))
        self.tokenizer = build_tokenizer(c.tokenizer)
        spec = dict(activation=c.activation, head_dim=c.head_dim, qv_bias=c.qv_bias)
        self.read_in = ReadIn(c.d_model, self.tokenizer.out_dim, c.read_in_heads, c.ffn_hidden, **spec)
        self.propagators = nn.ModuleList(TransformerBlock(c.d_model, c.num_heads, c.ffn_hidden, **spec)
                                         for _ in range(c.num_layers))
        self.read_out = ReadOut(c.d_model, c.num_output_modules, c.read_out_heads, c.ffn_hidden, c.num_classes,
                                norm=c.read_out_norm, **spec)

    def forward(self, x: Tensor) -> Tensor:
        return self._run(x, record=False).logits

    def forward_record(self, x: Tensor) -> PerceiverIORecord:
        return self._run(x, record=True)

    def _run(self, x: Tensor, *, record: bool) -> PerceiverIORecord:
        z, w_in, weights = self._features(x, record=record)
        logits, w_out, conf = self.read_out(self.output_queries, z, return_weights=record)  # decoder
        return PerceiverIORecord(logits, z, w_in, weights, w_out, conf)

    def _features(self, x: Tensor, *, record: bool) -> tuple[Tensor, Tensor | None, list]:
        z, w_in = self.read_in(self.latents, self.tokenizer(x), return_weights=record,
                               key_mask=padding_mask(self.tokenizer, x))          # encoder
        weights = []
        for layer in self.propagators:                                            # latent transformer
            z, w = self.run_block(layer, z, return_weights=record)
            weights.append(w)
        return z, w_in, weights

    # timm's API (classifier_api): the features are the final latents [B, U, d]; the head is the decoder
    # (learned queries attend to the latents: attention pooling, timm's "map") and its linear layer;
    # a block is one latent layer, its output the latents.
    input_layer = "tokenizer"
    stem_modules = ("tokenizer", "latents", "read_in")

    def forward_features(self, x: Tensor) -> Tensor:
        """The final latents ``[B, U, d]``."""
        return self._features(x, record=False)[0]

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Latents ``[B, U, d]`` → logits ``[B, C]`` (the decoder), or the pooled queries ``[B, d]``."""
        return self.read_out(self.output_queries, x, pre_logits=pre_logits)[0]

    def module_axis(self) -> ModuleAxis:
        """The latents ``[U, d_model]``: the Perceiver IO counterpart of NAC's modules (NAC Fig. 5)."""
        return ModuleAxis("latents", self.config.num_latents, "num_latents", ("latents",))


register_model_type(PerceiverIO)

register_preset("perceiver_io_tiny_imagenet", PerceiverIO, lambda: PerceiverIOConfig(),
                "NAC Table 4 (PIO); heads 64 wide, 1 decoder head (the NAC authors' Perceiver IO)")
register_preset("perceiver_io_small", PerceiverIO, lambda: PerceiverIOConfig(
    num_classes=10, tokenizer=TokenizerConfig(kind="conv", image_size=32, stem_channels=64, conv_channels=64,
                                              pos_dim=32, **CONV_BEFORE_ISSUE_35), d_model=96,
    num_layers=4, num_latents=64, num_heads=4, head_dim=24, ffn_hidden=192), "CPU-sized PIO matching nac_small")
register_preset("perceiver_io_micro", PerceiverIO, lambda: PerceiverIOConfig(
    num_classes=5, tokenizer=TokenizerConfig(kind="linear", input_dim=8, token_dim=16), d_model=32, num_layers=2,
    num_latents=12, num_heads=2, head_dim=16, ffn_hidden=48), "test-sized PIO matching nac_micro")
