"""Tokenizers: turn an input into the set of vectors ``X`` that models read in.

* :class:`ConvTokenizer`: NAC App. C's convolutional preprocessor (shared by NAC and
  Perceiver IO): conv 4×4/4 + LN, one ConvNeXt block, conv 2×2/2 + LN, then a
  learned 64-d positional encoding *concatenated* to each token. 64×64 → 8×8 tokens.
  Widths (App. C gives none) and the block's details as the authors' ``ConvNeXtImageTokenizer``.
* :class:`LinearTokenizer`: generic sets and sequences ``[B, N, d_in]``, with
  optional learned positions (added). Without positions it is permutation-equivariant.
* :class:`EmbeddingTokenizer`: discrete sequences (bytes, ListOps symbols), learned
  positions added.
* :class:`PatchEmbedding`: ViT patches, mapped linearly (a strided conv) or by
  :class:`NormLinearNorm` (LayerNorm → Linear → LayerNorm, the AiT authors' patch embedding,
  which is also AiT §5.8's question embedding), with optional learned positions.

Every tokenizer exposes ``out_dim`` and returns ``[B, N, out_dim]``; ``grid`` is ``(rows, cols)``
of tokens that lie on an image grid in row-major order (conv, patches), else None.

**Input checks.** Each tokenizer's ``check_input`` (called first by its ``forward``, so it
is the entry check of every model that reads through it) refuses, with an error naming
the input, what was expected and what was given:

* anything but a ``torch.Tensor`` (numpy arrays and lists are *not* converted, because
  the right dtype and device are the caller's to choose: ``torch.as_tensor(x,
  dtype=torch.float32)`` for features, ``torch.as_tensor(x)`` for integer ids);
* a wrong rank, channel count, image size or feature width; an empty batch (``B = 0``)
  or an empty token set (``N = 0``); a sequence longer than ``max_len``;
* images and features that are not floating point. In particular ``uint8`` images are
  refused, not rescaled: whether ``x / 255`` is right depends on the normalisation used
  in training (``modwire.tasks`` feeds floats in [0, 1], then normalised), so the error
  says to convert with ``x.float() / 255`` and apply that normalisation;
* a float dtype other than the weights' outside autocast, and a tensor on another device;
* NaN or inf in float inputs (NaN in would be NaN out), and token ids outside
  ``[0, vocab_size)`` (float ids are refused; integer ids of any width are cast to int64).

The checks are :mod:`modwire.nn.checks` (public: every model's forward uses them); the value checks
(finiteness, id range) cost one ``aminmax`` reduction and are skipped while ``torch.compile`` traces
(they are data-dependent) and on the meta device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UserError, UserTypeError
from .init import trunc_normal_
from .checks import check_device, check_float, check_images, check_not_empty, check_tensor, values_checkable


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channel axis of a ``[B, C, H, W]`` map."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """NAC App. C's ConvNeXt block (Liu et al. 2022), ``[B, C, H, W] → [B, C, H, W]``: a 7×7
    depthwise conv, then per position LN → Linear(C, 4C) → GELU → LN → Linear(4C, C), times a
    per-channel layer scale ``γ``, added to the input.

    ``norms=2``: App. C ("each of the linear layers ... is preceded by a layernorm");
    ``norms=1``: the authors' ``external/convnext.py`` ``Block`` (no LN before the second linear).
    ``layer_scale``: ``γ``'s initial value (their ``layer_scale_init_value`` 1e-6; 0: no ``γ``).
    Their drop-path is 0 in every released config: none here."""

    def __init__(self, channels: int, *, norms: int = 2, layer_scale: float = 1e-6, eps: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm1, self.fc1 = nn.LayerNorm(channels, eps=eps), nn.Linear(channels, 4 * channels)
        self.norm2 = nn.LayerNorm(4 * channels, eps=eps) if norms == 2 else nn.Identity()
        self.fc2 = nn.Linear(4 * channels, channels)
        self.layer_scale = nn.Parameter(torch.full((channels,), float(layer_scale))) if layer_scale > 0 else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.dwconv(x).permute(0, 2, 3, 1)  # [B, H, W, C]
        h = self.fc2(self.norm2(F.gelu(self.fc1(self.norm1(h)))))
        if self.layer_scale is not None:
            h = h * self.layer_scale
        return x + h.permute(0, 3, 1, 2)


class ConvTokenizer(nn.Module):
    """NAC App. C convolutional preprocessor. ``[B, C_in, S, S] → [B, (S/8)², channels + pos_dim]``.

    Stem: conv 4×4 stride 4 to ``stem_channels``, LN; one :class:`ConvNeXtBlock` at
    ``stem_channels``; downsampling: conv 2×2 stride 2 to ``channels``, then LN (``down_norm=
    "after"``, App. C) or LN then the conv (``"before"``: the authors' ConvNeXt downsampling layer,
    the LN at ``stem_channels``, none after); learned positions ``[(S/8)², pos_dim]`` concatenated
    to each token (their ``PositionalGrid``), tokens in row-major order.

    Defaults: the LayerNorms where App. C puts them (``down_norm="after"``, ``block_norms=2``);
    what App. C leaves open as the authors' ``ConvNeXtImageTokenizer`` (``capacity_preset: femto``,
    ``num_stages: 2``) at NAC Table 4's ``d = 384``: ``stem_channels = d/4``, ``channels = d/2``,
    LayerNorm eps 1e-6, layer scale 1e-6. ``init="convnext"``: their ``ConvNeXt._init_weights`` (conv and linear
    weights ``N(0, 0.02²)`` truncated at ±2, i.e. timm's ``trunc_normal_`` bounds, which are
    absolute; zero biases); ``"torch"``: PyTorch's layer defaults. Positions ``N(0, pos_std²)``
    (their grid: ``torch.randn``, ``pos_std = 1``). Drawn in this order: stem, block,
    downsampling (PyTorch's defaults), then with ``init="convnext"`` the redraw of those weights,
    then the positions."""

    def __init__(self, image_size: int = 64, in_channels: int = 3, channels: int = 192, pos_dim: int = 64, *,
                 stem_channels: int = 96, down_norm: str = "after", block_norms: int = 2,
                 layer_scale: float = 1e-6, eps: float = 1e-6, init: str = "convnext", pos_std: float = 1.0) -> None:
        super().__init__()
        if image_size % 8:
            raise UserError(f"image_size must be a multiple of 8 (two downsamplings, 4 then 2), got {image_size}")
        if down_norm not in ("after", "before") or block_norms not in (1, 2) or init not in ("convnext", "torch"):
            raise UserError(f"ConvTokenizer: expected down_norm in ('after', 'before'), block_norms in (1, 2), "
                            f"init in ('convnext', 'torch'), got {down_norm!r}, {block_norms!r}, {init!r}")
        self.image_size, self.in_channels = image_size, in_channels
        c1, c2 = stem_channels, channels
        self.stem = nn.Sequential(nn.Conv2d(in_channels, c1, 4, stride=4), ChannelLayerNorm(c1, eps=eps))
        self.block = ConvNeXtBlock(c1, norms=block_norms, layer_scale=layer_scale, eps=eps)
        conv = nn.Conv2d(c1, c2, 2, stride=2)
        self.down = nn.Sequential(conv, ChannelLayerNorm(c2, eps=eps)) if down_norm == "after" else \
            nn.Sequential(ChannelLayerNorm(c1, eps=eps), conv)
        if init == "convnext":
            for layer in self.modules():
                if isinstance(layer, (nn.Conv2d, nn.Linear)):
                    trunc_normal_(layer.weight, std=0.02)             # bounds ±2 (absolute), as timm's
                    if not layer.bias.is_meta:
                        nn.init.zeros_(layer.bias)
        self.num_tokens = (image_size // 8) ** 2
        self.grid = (image_size // 8, image_size // 8)
        self.pos = nn.Parameter(pos_std * torch.randn(self.num_tokens, pos_dim))
        self.out_dim = channels + pos_dim

    def check_input(self, x: Tensor, *, name: str = "x") -> Tensor:
        """Refuse what this tokenizer cannot read (module docstring); return ``x``."""
        expected = (self.in_channels, self.image_size, self.image_size)
        return check_images(x, name, "ConvTokenizer", expected, self.stem[0].weight)

    def forward(self, x: Tensor, *, name: str = "x") -> Tensor:
        x = self.check_input(x, name=name)
        h = self.down(self.block(self.stem(x))).flatten(2).transpose(1, 2)  # [B, N, C]
        return torch.cat([h, self.pos.expand(h.shape[0], *self.pos.shape)], dim=-1)


class LinearTokenizer(nn.Module):
    """``[B, N, in_dim] → [B, N, dim]`` by a linear map, plus optional learned positions."""

    grid = None

    def __init__(self, in_dim: int, dim: int, max_len: int = 0) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, dim
        self.proj = nn.Linear(in_dim, dim)
        self.pos = nn.Embedding(max_len, dim) if max_len > 0 else None

    def check_input(self, x: Tensor, *, name: str = "x") -> Tensor:
        """Refuse what this tokenizer cannot read (module docstring); return ``x``."""
        layout = f"features [B, N, {self.in_dim}]"
        check_tensor(x, name, layout)
        if x.dim() != 3 or x.shape[-1] != self.in_dim:
            raise UserError(f"{name}: LinearTokenizer expects {layout}, got {list(x.shape)}")
        check_not_empty(x, name, layout)
        _check_length(x, name, self.pos)
        check_float(x, name, layout, self.proj.weight)
        return x

    def forward(self, x: Tensor, *, name: str = "x") -> Tensor:
        x = self.check_input(x, name=name)
        h = self.proj(x)
        return h if self.pos is None else h + _positions(self.pos, x.shape[1])


class EmbeddingTokenizer(nn.Module):
    """``[B, N]`` integer ids → ``[B, N, dim]``, plus learned positions.

    With ``pad_id`` set, :func:`padding_mask` marks the padding positions so that the
    read-in attention ignores them: a padded batch gives each sequence the output it
    would have alone."""

    grid = None

    def __init__(self, vocab_size: int, dim: int, max_len: int = 0, pad_id: int | None = None) -> None:
        super().__init__()
        self.vocab_size, self.out_dim, self.pad_id = vocab_size, dim, pad_id
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_len, dim) if max_len > 0 else None

    def check_input(self, x: Tensor, *, name: str = "x") -> Tensor:
        """Refuse what this tokenizer cannot read (module docstring); return ``x`` as int32/int64."""
        layout = f"integer token ids [B, N] in [0, {self.vocab_size})"
        check_tensor(x, name, layout)
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise UserTypeError(f"{name}: EmbeddingTokenizer expects {layout}, got {x.dtype}")
        if x.dim() != 2:
            raise UserError(f"{name}: EmbeddingTokenizer expects {layout}, got shape {list(x.shape)}")
        check_not_empty(x, name, layout)
        _check_length(x, name, self.pos)
        check_device(x, name, self.embed.weight)
        if x.dtype not in (torch.int32, torch.int64):
            x = x.long()                               # lossless: nn.Embedding reads int32/int64 only
        if values_checkable(x):
            # one device-to-host copy: min, max and (with pad_id) how many samples are padding only
            stats = torch.aminmax(x.detach())
            if self.pad_id is not None:
                pad_only = (x.detach() == self.pad_id).all(1)
                stats = (*stats, pad_only.sum().to(x.dtype))
            lo, hi, *n_pad_only = torch.stack(stats).tolist()
            if lo < 0 or hi >= self.vocab_size:
                raise UserError(f"{name}: token id {lo if lo < 0 else hi} is outside the vocabulary "
                                f"[0, vocab_size={self.vocab_size})")
            if n_pad_only and n_pad_only[0]:  # a sample of padding only is an empty token set: nothing to read
                empty = pad_only.nonzero().flatten().tolist()
                raise UserError(f"{name}: sample(s) {empty[:4]} hold only padding (pad_id={self.pad_id}); "
                                f"expected at least one token per sample")
        return x

    def forward(self, x: Tensor, *, name: str = "x") -> Tensor:
        x = self.check_input(x, name=name)
        h = self.embed(x)
        return h if self.pos is None else h + _positions(self.pos, x.shape[1])


def padding_mask(tokenizer: nn.Module, x: Tensor) -> Tensor | None:
    """Key mask ``[B, 1, 1, N]`` (bool, True = a real token) that hides padding ids from the
    read-in (:func:`~modwire.nn.attention.attend`'s ``key_mask``); None without padding."""
    pad_id = getattr(tokenizer, "pad_id", None)
    return None if pad_id is None else (x != pad_id)[:, None, None, :]


def _check_length(x: Tensor, name: str, table: nn.Embedding | None) -> None:
    """At most ``max_len`` tokens when there are learned positions."""
    if table is not None and x.shape[1] > table.num_embeddings:
        raise UserError(f"{name}: sequence length {x.shape[1]} exceeds max_len {table.num_embeddings} "
                        f"(the learned positions); got shape {list(x.shape)}")


def _positions(table: nn.Embedding, n: int) -> Tensor:
    return table.weight[:n]


class NormLinearNorm(nn.Module):
    """LayerNorm(d_in) → Linear(d_in, d_out) → LayerNorm(d_out), ``[..., d_in] → [..., d_out]``:
    AiT §5.8's question embedding ("a learnable linear projection and layer normalization before
    and after the linear projection") and the AiT authors' patch embedding (``vit_hn.py``'s
    ``to_patch_embedding``)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.norm_in = nn.LayerNorm(d_in)
        self.proj = nn.Linear(d_in, d_out)
        self.norm_out = nn.LayerNorm(d_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm_out(self.proj(self.norm_in(x)))


class PatchEmbedding(nn.Module):
    """ViT patch embedding (Dosovitskiy et al. 2021; NI §4.2, AiT §5.1): non-overlapping
    ``patch × patch`` patches, each mapped linearly to ``dim`` (a strided conv is that linear
    map), with optional learned absolute positions (added).

    ``norm=True``: each patch flattened in ``(row, column, channel)`` order (``patch²·C``
    values), then :class:`NormLinearNorm` (the AiT authors' ``vit_hn.py``: LayerNorm → Linear
    → LayerNorm; AiT §3 says only "mapped to embeddings with the linear projection").

    ``[B, C, S, S] → [B, G, dim]`` with ``G = (S / patch)²`` tokens in row-major order;
    ``grid = (S / patch, S / patch)`` is what a relative positional bias (NI App. C.2.3) reads.
    """

    def __init__(self, image_size: int, in_channels: int, patch_size: int, dim: int, *,
                 absolute_positions: bool = True, norm: bool = False) -> None:
        super().__init__()
        if image_size % patch_size:
            raise UserError(f"image_size ({image_size}) must be a multiple of patch_size ({patch_size})")
        self.image_size, self.in_channels, self.patch_size, self.out_dim = image_size, in_channels, patch_size, dim
        self.proj = NormLinearNorm(in_channels * patch_size ** 2, dim) if norm else \
            nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        side = image_size // patch_size
        self.grid = (side, side)
        self.pos = nn.Parameter(0.02 * torch.randn(side * side, dim)) if absolute_positions else None

    def check_input(self, x: Tensor, *, name: str = "x") -> Tensor:
        """Refuse what this embedding cannot read (module docstring of :mod:`modwire.nn.tokenizers`)."""
        expected = (self.in_channels, self.image_size, self.image_size)
        weight = self.proj.proj.weight if isinstance(self.proj, NormLinearNorm) else self.proj.weight
        return check_images(x, name, "PatchEmbedding", expected, weight)

    def forward(self, x: Tensor, *, name: str = "x") -> Tensor:
        x = self.check_input(x, name=name)
        if isinstance(self.proj, NormLinearNorm):
            h = self.proj(self.patches(x))                                          # [B, G, dim]
        else:
            h = self.proj(x).flatten(2).transpose(1, 2)                             # [B, G, dim]
        return h if self.pos is None else h + self.pos

    def patches(self, x: Tensor) -> Tensor:
        """``[B, C, S, S] → [B, G, p·p·C]``: each patch flattened row by row, channels innermost."""
        b, c, s, _ = x.shape
        p, side = self.patch_size, s // self.patch_size
        x = x.reshape(b, c, side, p, side, p).permute(0, 2, 4, 3, 5, 1)            # [B, rows, cols, p, p, C]
        return x.reshape(b, side * side, p * p * c)


class PanelEncoder(nn.Module):
    """NI §4.3 / App. D (after WReN, Barrett et al. 2018): a shallow CNN embeds each panel of a
    PGM puzzle; each of the ``K`` candidate panels then forms its own set with the ``num_context``
    context panels, so one puzzle becomes ``K`` sets that a set model scores.

    ``[B, P, S, S]`` (P = num_context + K panels, context first) → ``[B·K, num_context + 1, dim]``:
    per set the context embeddings then the candidate's, each plus a learned slot embedding
    (the position of a panel in the 3×3 matrix). CNN: four 3×3 stride-2 convolutions with
    ``channels`` filters, BatchNorm and ReLU (WReN), then a linear map to ``dim``. The convolutions
    have no bias: the BatchNorm after each cancels a per-channel constant (a bias there never trains).
    ``groups = K``: the set model folds its ``[B·K]`` scores back to ``[B, K]``.
    """

    def __init__(self, panel_size: int, num_panels: int, num_context: int, dim: int, *,
                 channels: int = 32) -> None:
        super().__init__()
        if not 0 < num_context < num_panels:
            raise UserError(f"num_context must be in [1, num_panels={num_panels}), got {num_context}")
        self.panel_size, self.num_panels, self.num_context = panel_size, num_panels, num_context
        self.groups, self.out_dim, self.grid = num_panels - num_context, dim, None
        layers, c_in, side = [], 1, panel_size
        for _ in range(4):
            layers += [nn.Conv2d(c_in, channels, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(channels),
                       nn.ReLU()]
            c_in, side = channels, (side + 1) // 2
        self.cnn = nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * side * side, dim))
        self.slots = nn.Parameter(0.02 * torch.randn(num_context + 1, dim))

    def check_input(self, x: Tensor, *, name: str = "x") -> Tensor:
        expected = (self.num_panels, self.panel_size, self.panel_size)
        return check_images(x, name, "PanelEncoder", expected, self.cnn[0].weight, what="panels",
                             note=f" ({self.num_context} context, then candidates)")

    def forward(self, x: Tensor, *, name: str = "x") -> Tensor:
        b, p, s, _ = self.check_input(x, name=name).shape
        e = self.cnn(x.reshape(b * p, 1, s, s)).view(b, p, -1)                   # [B, P, dim]
        ctx, cand = e[:, : self.num_context], e[:, self.num_context:]            # [B, 8, d], [B, K, d]
        k = cand.shape[1]
        sets = torch.cat([ctx.unsqueeze(1).expand(b, k, *ctx.shape[1:]), cand.unsqueeze(2)], dim=2)
        return (sets + self.slots).flatten(0, 1)                                  # [B·K, num_context + 1, d]
