"""The tokenizer NAC and Perceiver IO share as their input layer, as a config.

:class:`TokenizerConfig` (the ``tokenizer`` sub-config: ``conv``, ``linear`` or
``embedding``), its mapping of a task's :class:`~modwire.models.inputs.InputSpec` onto
those fields (:meth:`TokenizerConfig.for_input`, with :func:`single_input` to pick the one
input of a single-input model) and :func:`build_tokenizer`, which turns the config into
the ``modwire.nn`` module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from ..nn import ConvTokenizer, EmbeddingTokenizer, LinearTokenizer
from .config import COUNT, Bounds, ConfigBase, check_choice
from .inputs import InputSpec, Inputs
from ..errors import UserError


TOKENIZERS = ("conv", "linear", "embedding")


@dataclass
class TokenizerConfig(ConfigBase):
    """How an input becomes the token set ``X`` (a sub-config: ``tokenizer``).

    ``conv``: NAC App. C preprocessor for ``[B, in_channels, image_size, image_size]``
    images; tokens are ``conv_channels + pos_dim`` wide. ``linear``: sets/sequences
    ``[B, N, input_dim]`` → ``token_dim``. ``embedding``: ids ``[B, N]`` <
    ``vocab_size`` → ``token_dim``. ``max_len > 0`` adds learned positions (linear,
    embedding); ``pad_id`` (embedding) is hidden from the attention that reads the tokens.
    """

    kind: str = "conv"
    image_size: int = 64
    in_channels: int = 3
    conv_channels: int = 320
    pos_dim: int = 64
    input_dim: int = 0
    vocab_size: int = 0
    token_dim: int = 384
    max_len: int = 0
    pad_id: int = -1          # embedding: this id is padding (-1: none)

    bounds = {"image_size": Bounds(lo=8, multiple_of=8, note="the conv tokenizer downsamples by 4, then 2"),
              "in_channels": COUNT, "conv_channels": COUNT, "pos_dim": COUNT, "input_dim": COUNT,
              "vocab_size": COUNT, "token_dim": COUNT, "max_len": Bounds(lo=0, note="0: no learned positions"),
              "pad_id": Bounds(lo=-1, hi="vocab_size", hi_open=True, note="-1: no padding id")}
    uses: ClassVar[dict[str, tuple[str, ...]]] = {
        "conv": ("image_size", "in_channels", "conv_channels", "pos_dim"),
        "linear": ("input_dim", "token_dim", "max_len"),
        "embedding": ("vocab_size", "token_dim", "max_len", "pad_id")}

    def validate(self) -> None:
        check_choice(self._prefix + "kind", self.kind, TOKENIZERS)

    def unused_fields(self) -> tuple[str, ...]:   # an unknown kind: validate() names it
        return tuple(n for n in self.bounds if n not in self.uses.get(self.kind, ()))

    @staticmethod
    def for_input(spec: InputSpec) -> dict[str, Any]:
        """The tokenizer fields that read ``spec`` (NAC/Perceiver IO's input layer): images →
        ``conv`` (NAC App. C), token ids → ``embedding`` with learned positions up to the spec's
        length and its padding id, vectors → ``linear`` with learned positions only for an ordered
        sequence (a set stays permutation-invariant). Widths (``token_dim``, ``conv_channels``,
        ``pos_dim``) are the model's own and are left alone. An ``index`` (one integer per
        sample, e.g. the dataset of NI's digits multi-task) is no sequence: refused."""
        if spec.kind == "index":
            raise UserError(f"a tokenizer reads images, token sequences or vectors, not an index input "
                            f"({spec!r}: one integer per sample, e.g. which dataset a sample comes from, "
                            f"read by a model with one CLS token per value such as a ViT or Neural "
                            f"Interpreter); use such a model, or a task without it")
        if spec.kind == "image":
            if spec.height != spec.width or spec.height % 8:
                raise UserError(f"the conv tokenizer reads square images whose side is a multiple of 8 "
                                f"(two downsamplings, 4 then 2); the task gives {spec.channels}x{spec.height}"
                                f"x{spec.width} images (resize or pad them, e.g. mnist's pad_to=32)")
            return {"kind": "conv", "image_size": spec.height, "in_channels": spec.channels}
        if spec.kind == "tokens":
            return {"kind": "embedding", "vocab_size": spec.vocab_size, "max_len": spec.length,
                    "pad_id": -1 if spec.pad_id is None else spec.pad_id}
        if spec.ordered and spec.length is None:
            raise UserError("the linear tokenizer needs the length of an ordered sequence of vectors "
                            "(for its learned positions); the task gives length=None")
        return {"kind": "linear", "input_dim": spec.dim, "max_len": spec.length if spec.ordered else 0}


def single_input(inputs: Inputs, model_type: str) -> InputSpec:
    """The one input of a single-input model, or a ValueError naming the inputs it was given."""
    if isinstance(inputs, InputSpec):
        return inputs
    if list(inputs) == ["x"]:
        return inputs["x"]
    raise UserError(f"a {model_type!r} model reads one input, but the task gives the named inputs "
                    f"{sorted(inputs)} (a multimodal task: use a model that takes them, e.g. a "
                    f"conditional NAC for {{'x', 'condition'}})")


def build_tokenizer(cfg: TokenizerConfig) -> nn.Module:
    """The ``modwire.nn`` tokenizer that ``cfg`` describes (its ``kind`` is already validated)."""
    if cfg.kind == "conv":
        return ConvTokenizer(cfg.image_size, cfg.in_channels, cfg.conv_channels, cfg.pos_dim)
    if cfg.kind == "linear":
        return LinearTokenizer(cfg.input_dim, cfg.token_dim, cfg.max_len)
    return EmbeddingTokenizer(cfg.vocab_size, cfg.token_dim, cfg.max_len, None if cfg.pad_id < 0 else cfg.pad_id)
