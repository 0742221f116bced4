"""The one config of a model's input layer: how an input becomes the set of vectors it reads.

:class:`TokenizerConfig` describes every input layer of :mod:`modwire.nn.tokenizers`: NAC's
convolutional preprocessor (``conv``), a ViT patch embedding (``patches``), the PGM panel encoder
(``panels``), a linear map of vectors (``linear``) and an id embedding (``embedding``). NAC and
Perceiver IO hold one as ``tokenizer`` (conv / linear / embedding: they read tokens through
cross-attention, so a token's width is free, ``token_dim``); the set models (ViT, Neural
Interpreter, AiT) hold one as ``tokenizer`` too (patches / linear / panels, embedded to ``d_model``).
:meth:`TokenizerConfig.for_input` maps a task's :class:`~modwire.models.inputs.InputSpec` onto
its fields (with :func:`single_input` to pick the one input of a single-input model) and
:func:`build_tokenizer` turns it into the ``modwire.nn`` module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from ..nn import ConvTokenizer, EmbeddingTokenizer, LinearTokenizer, PanelEncoder, PatchEmbedding
from ..fields import check_value
from .config import COUNT, FIELD, POSITIVE, Bounds, ConfigBase, example_generator
from .inputs import InputSpec, Inputs
from ..errors import UserError


KINDS = ("conv", "patches", "panels", "linear", "embedding")
TOKENIZERS = ("conv", "linear", "embedding")     # what NAC and Perceiver IO read (``tokenizer.kind``)
EMBEDDINGS = ("patches", "linear", "panels")      # what a set model embeds (``tokenizer.kind``)
POSITIONS = ("absolute", "relative", "none")
#: NAC App. C's preprocessor downsamples by 4, then 2.
CONV_IMAGE_SIZE = Bounds(lo=8, multiple_of=8, note="the conv tokenizer downsamples by 4, then 2")
#: The conv tokenizer's details as modwire built it before issue 35 (PyTorch's initialisation,
#: positions ``N(0, 0.02²)``, no layer scale, LayerNorm eps 1e-5); with ``stem_channels =
#: conv_channels`` (one width throughout) it is that network, parameter for parameter and draw for
#: draw. The CPU presets keep it. A config.json saved before these fields existed is refused (the
#: weights do not match); none was saved outside a test.
CONV_BEFORE_ISSUE_35 = {"conv_layer_scale": 0.0, "conv_norm_eps": 1e-5, "conv_init": "torch", "pos_std": 0.02}


@dataclass
class TokenizerConfig(ConfigBase):
    """How an input becomes the token set ``X`` (the ``tokenizer`` sub-config of every model that has one).

    ``conv``: NAC App. C preprocessor for ``[B, in_channels, image_size, image_size]`` images
    (:class:`~modwire.nn.tokenizers.ConvTokenizer`): ``stem_channels`` after the 4×4/4 conv and in
    the ConvNeXt block, ``conv_channels`` after the 2×2/2 conv; tokens are ``conv_channels +
    pos_dim`` wide. App. C gives no widths: the defaults are the authors' (``d/4``, ``d/2`` of their
    state width, here NAC Table 4's ``d = 384``), as are the details App. C leaves open (layer scale
    ``conv_layer_scale``, LayerNorm eps ``conv_norm_eps``, ``conv_init``, positions ``N(0,
    pos_std²)``); the LayerNorms are where App. C puts them (``conv_down_norm: after``,
    ``conv_block_norms: 2``; ``before`` and ``1`` are the authors' code). ``patches``: the same
    images cut into ``patch_size`` patches (ViT), each mapped linearly (a strided conv), or with ``patch_norm``
    flattened and embedded by LayerNorm → Linear → LayerNorm (the AiT authors' ``vit_hn.py``);
    ``positions``: ``absolute`` (learned, added), ``relative`` (NI App. C.2.3: a bias on the
    attention logits, built by the model's attention layers) or ``none`` (the AiT authors' code
    creates positions and never adds them). ``panels``: PGM puzzles ``[B, in_channels, image_size, image_size]`` whose
    ``in_channels`` panels are ``num_context`` context panels and then the candidates (NI §4.3),
    each read by a CNN of ``panel_channels`` filters. ``linear``: sets/sequences ``[B, N,
    input_dim]`` mapped linearly. ``embedding``: ids ``[B,
    N]`` < ``vocab_size``; ``pad_id`` is hidden from the attention that reads the tokens.
    ``max_len > 0`` adds learned positions (linear, embedding; 0: none, a permutation-equivariant
    set). Width: linear, embedding, patches and panels tokens are ``token_dim`` wide in NAC and
    Perceiver IO, ``d_model`` wide in a set model (which ignores ``token_dim``).
    """

    kind: str = "conv"
    image_size: int = 32
    in_channels: int = 3
    stem_channels: int = 96          # conv: width of the 4×4/4 conv and the ConvNeXt block (authors': d/4)
    conv_channels: int = 192         # conv: width of the 2×2/2 conv, the tokens' features (authors': d/2)
    conv_down_norm: str = "after"    # conv: LN after the 2×2/2 conv (App. C); "before": the authors' ConvNeXt
    conv_block_norms: int = 2        # conv: LNs in the ConvNeXt block, one per linear (App. C); 1: the authors'
    conv_layer_scale: float = 1e-6   # conv: the block's layer scale γ at initialisation (authors'); 0: none
    conv_norm_eps: float = 1e-6      # conv: eps of every LayerNorm (authors' ConvNeXt)
    conv_init: str = "convnext"      # conv: weights N(0, 0.02²), zero biases (authors' ConvNeXt); "torch"
    pos_dim: int = 64
    pos_std: float = 1.0             # conv: positions N(0, pos_std²) at initialisation (authors' grid: randn)
    patch_size: int = 4
    positions: str = "absolute"
    num_context: int = 8
    panel_channels: int = 32
    input_dim: int = 1
    vocab_size: int = 0
    token_dim: int = 384
    max_len: int = 0
    pad_id: int = -1          # embedding: this id is padding (-1: none)
    patch_norm: bool = False  # patches: LayerNorm → Linear → LayerNorm (the AiT authors'); False: a strided conv

    choices = {"kind": KINDS, "positions": POSITIONS, "conv_down_norm": ("after", "before"),
               "conv_block_norms": (2, 1), "conv_init": ("convnext", "torch")}
    bounds = {"in_channels": COUNT, "stem_channels": COUNT, "conv_channels": COUNT, "pos_dim": COUNT,
              "conv_layer_scale": Bounds(lo=0, note="0: no layer scale"), "conv_norm_eps": POSITIVE,
              "pos_std": Bounds(lo=0), "patch_size": COUNT,
              "num_context": COUNT, "panel_channels": COUNT, "input_dim": COUNT, "vocab_size": COUNT,
              "token_dim": COUNT, "max_len": Bounds(lo=0, note="0: no learned positions"),
              "pad_id": Bounds(lo=-1, hi="vocab_size", hi_open=True, note="-1: no padding id")}
    uses: ClassVar[dict[str, tuple[str, ...]]] = {
        "conv": ("image_size", "in_channels", "stem_channels", "conv_channels", "conv_down_norm",
                 "conv_block_norms", "conv_layer_scale", "conv_norm_eps", "conv_init", "pos_dim", "pos_std"),
        "patches": ("image_size", "in_channels", "patch_size", "patch_norm"),
        "panels": ("image_size", "in_channels", "num_context", "panel_channels"),
        "linear": ("input_dim", "token_dim", "max_len"),
        "embedding": ("vocab_size", "token_dim", "max_len", "pad_id")}

    def unused_fields(self) -> tuple[str, ...]:   # an unknown kind: the choices table names it
        return tuple(n for n in self.bounds if n not in self.uses.get(self.kind, ()))

    def example_input(self, batch: int, *, device: Any = "cpu", seed: int = 0) -> Any:
        """A valid random input of ``batch`` samples for this input layer: images ``[B, C, S, S]``
        (conv: normal; patches, panels: uniform in [0, 1]), sets ``[B, N, input_dim]`` (linear) or ids
        ``[B, N] < vocab_size`` (embedding), ``N = 5`` (at most ``max_len`` when positions are learned)."""
        import torch

        g, n = example_generator(device, seed), min(5, self.max_len) if self.max_len > 0 else 5
        if self.kind in ("conv", "patches", "panels"):
            draw = torch.randn if self.kind == "conv" else torch.rand
            return draw(batch, self.in_channels, self.image_size, self.image_size, generator=g, device=device)
        if self.kind == "embedding":
            return torch.randint(0, self.vocab_size, (batch, n), generator=g, device=device)
        return torch.randn(batch, n, self.input_dim, generator=g, device=device)

    def validate(self) -> None:
        """The image size each image layer needs (conv: a multiple of 8; patches: of ``patch_size``)
        and the candidates a PGM puzzle keeps."""
        p = self._prefix
        if self.kind in ("conv", "patches", "panels"):
            check_value(self.image_size, CONV_IMAGE_SIZE if self.kind == "conv" else COUNT, p + "image_size",
                        self, FIELD)
        if self.kind == "patches" and self.image_size % self.patch_size:
            raise UserError(f"{FIELD} {p + 'patch_size'!r}: got {self.patch_size}, expected a divisor of "
                            f"image_size={self.image_size}")
        if self.kind == "panels" and self.num_context >= self.in_channels:
            raise UserError(f"{FIELD} {p + 'num_context'!r}: got {self.num_context}, expected fewer than the "
                            f"{self.in_channels} panels (in_channels) so candidates remain")

    @property
    def grid(self) -> tuple[int, int] | None:
        """``(rows, cols)`` of the patch tokens; None for other kinds."""
        side = self.image_size // self.patch_size
        return (side, side) if self.kind == "patches" else None

    @staticmethod
    def for_input(spec: InputSpec, image: str = "conv") -> dict[str, Any]:
        """The fields that read ``spec``: images → ``image`` (``conv``: NAC App. C, NAC and
        Perceiver IO; ``patches`` or ``panels``: a set model), token ids → ``embedding`` with
        learned positions up to the spec's length and its padding id, vectors → ``linear`` with
        learned positions only for an ordered sequence (a set stays permutation-invariant).
        Widths (``token_dim``, ``stem_channels``, ``conv_channels``, ``pos_dim``) and the patch size
        are the model's own and are left alone. An ``index`` (one integer per sample, e.g. the dataset of NI's
        digits multi-task) is no sequence: refused."""
        if spec.kind == "index":
            raise UserError(f"a tokenizer reads images, token sequences or vectors, not an index input "
                            f"({spec!r}: one integer per sample, e.g. which dataset a sample comes from, "
                            f"read by a model with one CLS token per value such as a ViT or Neural "
                            f"Interpreter); use such a model, or a task without it")
        if spec.kind == "image":
            if spec.height != spec.width or (image == "conv" and spec.height % 8):
                need = " whose side is a multiple of 8 (two downsamplings, 4 then 2)" if image == "conv" else ""
                raise UserError(f"the {image} input layer reads square images{need}; the task gives "
                                f"{spec.channels}x{spec.height}x{spec.width} images (resize or pad them, "
                                f"e.g. mnist's pad_to=32)")
            return {"kind": image, "image_size": spec.height, "in_channels": spec.channels}
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


def build_tokenizer(cfg: TokenizerConfig, dim: int | None = None) -> nn.Module:
    """The ``modwire.nn`` input layer that ``cfg`` describes (its ``kind`` is already validated);
    ``dim``: the width of linear, embedding, patch and panel tokens (default ``cfg.token_dim``; a
    set model passes its ``d_model``). Each layer has ``out_dim``, ``grid`` and ``check_input``."""
    dim = cfg.token_dim if dim is None else dim
    if cfg.kind == "conv":
        return ConvTokenizer(cfg.image_size, cfg.in_channels, cfg.conv_channels, cfg.pos_dim,
                             stem_channels=cfg.stem_channels, down_norm=cfg.conv_down_norm,
                             block_norms=cfg.conv_block_norms, layer_scale=cfg.conv_layer_scale,
                             eps=cfg.conv_norm_eps, init=cfg.conv_init, pos_std=cfg.pos_std)
    if cfg.kind == "patches":
        return PatchEmbedding(cfg.image_size, cfg.in_channels, cfg.patch_size, dim,
                              absolute_positions=cfg.positions == "absolute", norm=cfg.patch_norm)
    if cfg.kind == "panels":
        return PanelEncoder(cfg.image_size, cfg.in_channels, cfg.num_context, dim, channels=cfg.panel_channels)
    if cfg.kind == "linear":
        return LinearTokenizer(cfg.input_dim, dim, cfg.max_len)
    return EmbeddingTokenizer(cfg.vocab_size, dim, cfg.max_len, None if cfg.pad_id < 0 else cfg.pad_id)
