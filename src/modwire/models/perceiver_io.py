"""Perceiver IO (Jaegle et al. 2022), the NAC papers' baseline — NAC Table 4, PIO column.

Built from the same blocks as NAC with the modulation off and no kernel: learned
latents (the NAC module initial states) cross-attend to the tokens, ``L`` latent
self-attention layers with separate weights, and a decoder in which learned output
queries attend to the latents (App. B.2: a NAC module generalises a PIO latent).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn import ProcessorLayer, ReadIn, ReadOut
from ..nn.modulated import ACTIVATIONS
from ..nn.tokenizers import padding_bias
from .base import ModelConfig, PretrainedModel, TokenizerConfig, build_tokenizer, check_choice, check_positive
from .registry import register_model_type, register_preset


@dataclass
class PerceiverIOConfig(TokenizerConfig, ModelConfig):
    """Perceiver IO hyperparameters; defaults are NAC Table 4's PIO column (Tiny-ImageNet)."""

    model_type = "perceiver_io"

    num_classes: int = 200
    d_model: int = 384
    num_layers: int = 8
    num_latents: int = 320
    num_heads: int = 6
    cross_heads: int = 1
    output_heads: int = 6
    num_output_queries: int = 1
    ffn_hidden: int = 1536
    activation: str = "geglu"

    def validate(self) -> None:
        self.validate_tokenizer()
        check_positive(self, "num_classes", "d_model", "num_layers", "num_latents", "num_heads",
                       "cross_heads", "output_heads", "num_output_queries", "ffn_hidden")
        check_choice("activation", self.activation, ACTIVATIONS)
        for name in ("num_heads", "cross_heads", "output_heads"):
            if self.d_model % getattr(self, name):
                raise ValueError(f"config field {name!r}: d_model={self.d_model} is not divisible by "
                                 f"{name}={getattr(self, name)}")


class PerceiverIO(PretrainedModel):
    """Perceiver IO classifier. ``forward(x) → logits [B, num_classes]``;
    ``return_intermediates=True`` adds attention weights and the final ``states``."""

    config_class = PerceiverIOConfig

    def __init__(self, config: PerceiverIOConfig) -> None:
        super().__init__()
        self.config = c = config
        plain = dict(activation=c.activation, modulation="none")
        self.latents = nn.Parameter(torch.randn(c.num_latents, c.d_model))
        self.output_queries = nn.Parameter(torch.randn(c.num_output_queries, c.d_model))
        self.tokenizer = build_tokenizer(c)
        self.read_in = ReadIn(c.d_model, self.tokenizer.out_dim, c.cross_heads, c.ffn_hidden, **plain)
        self.propagators = nn.ModuleList(
            ProcessorLayer(c.d_model, c.num_heads, c.ffn_hidden, **plain) for _ in range(c.num_layers))
        self.read_out = ReadOut(c.d_model, c.num_output_queries, c.output_heads, c.ffn_hidden,
                                c.num_classes, **plain)

    def forward_features(self, x: Tensor, intermediates: dict[str, Any] | None = None) -> Tensor:
        """Encoder and latent transformer: latent states ``[B, U, d_model]``."""
        want = intermediates is not None
        z, w = self.read_in(self.latents, self.tokenizer(x), return_weights=want,
                            padding=padding_bias(self.tokenizer, x))
        weights = []
        for layer in self.propagators:
            z, w_l = layer(z, return_weights=want)
            weights.append(w_l)
        if want:
            intermediates.update(read_in_attention=w, propagator_attention=weights, states=z)
        return z

    def forward_head(self, states: Tensor, intermediates: dict[str, Any] | None = None) -> Tensor:
        """Decoder: logits ``[B, num_classes]``."""
        logits, w, conf = self.read_out(self.output_queries, states, return_weights=intermediates is not None)
        if intermediates is not None:
            intermediates.update(read_out_attention=w, readout_confidence=conf)
        return logits

    def forward(self, x: Tensor, return_intermediates: bool = False):
        inter: dict[str, Any] | None = {} if return_intermediates else None
        logits = self.forward_head(self.forward_features(x, inter), inter)
        return (logits, inter) if return_intermediates else logits


register_model_type(PerceiverIO)

register_preset("perceiver_io_tiny_imagenet", PerceiverIO, lambda: PerceiverIOConfig(), "NAC Table 4 (PIO)")
register_preset("perceiver_io_small", PerceiverIO, lambda: PerceiverIOConfig(
    num_classes=10, image_size=32, conv_channels=64, pos_dim=32, d_model=96, num_layers=4, num_latents=64,
    num_heads=4, output_heads=4, ffn_hidden=192), "CPU-sized PIO matching nac_small")
register_preset("perceiver_io_micro", PerceiverIO, lambda: PerceiverIOConfig(
    num_classes=5, tokenizer="linear", input_dim=8, token_dim=16, d_model=32, num_layers=2, num_latents=12,
    num_heads=2, output_heads=2, ffn_hidden=48), "test-sized PIO matching nac_micro")
