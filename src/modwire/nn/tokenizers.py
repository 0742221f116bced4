"""Tokenizers: turn an input into the set of vectors ``X`` that models read in.

* :class:`ConvTokenizer`: NAC App. C's convolutional preprocessor (shared by NAC and
  Perceiver IO): conv 4×4/4 + LN, one ConvNeXt block, conv 2×2/2 + LN, then a
  learned 64-d positional encoding *concatenated* to each token. 64×64 → 8×8 tokens.
* :class:`LinearTokenizer`: generic sets and sequences ``[B, N, d_in]``, with
  optional learned positions (added). Without positions it is permutation-equivariant.
* :class:`EmbeddingTokenizer`: discrete sequences (bytes, ListOps symbols), learned
  positions added.

Every tokenizer exposes ``out_dim`` and returns ``[B, N, out_dim]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn



class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channel axis of a ``[B, C, H, W]`` map."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """App. C: one 7×7 (depthwise) conv, then LN → Linear(C, 4C) → GELU → LN → Linear(4C, C), residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm1, self.fc1 = nn.LayerNorm(channels), nn.Linear(channels, 4 * channels)
        self.norm2, self.fc2 = nn.LayerNorm(4 * channels), nn.Linear(4 * channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        h = self.dwconv(x).permute(0, 2, 3, 1)  # [B, H, W, C]
        h = self.fc2(self.norm2(F.gelu(self.fc1(self.norm1(h)))))
        return x + h.permute(0, 3, 1, 2)


class ConvTokenizer(nn.Module):
    """NAC App. C convolutional preprocessor. ``[B, C_in, S, S] → [B, (S/8)², channels + pos_dim]``."""

    def __init__(self, image_size: int = 64, in_channels: int = 3, channels: int = 320,
                 pos_dim: int = 64) -> None:
        super().__init__()
        if image_size % 8:
            raise ValueError(f"image_size must be a multiple of 8 (two downsamplings, 4 then 2), got {image_size}")
        self.image_size, self.in_channels = image_size, in_channels
        self.stem = nn.Sequential(nn.Conv2d(in_channels, channels, 4, stride=4), ChannelLayerNorm(channels))
        self.block = ConvNeXtBlock(channels)
        self.down = nn.Sequential(nn.Conv2d(channels, channels, 2, stride=2), ChannelLayerNorm(channels))
        self.num_tokens = (image_size // 8) ** 2
        self.pos = nn.Parameter(0.02 * torch.randn(self.num_tokens, pos_dim))
        self.out_dim = channels + pos_dim

    def forward(self, x: Tensor) -> Tensor:
        expected = (self.in_channels, self.image_size, self.image_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"ConvTokenizer expects images [B, {', '.join(map(str, expected))}], "
                             f"got {list(x.shape)}")
        h = self.down(self.block(self.stem(x))).flatten(2).transpose(1, 2)  # [B, N, C]
        return torch.cat([h, self.pos.expand(h.shape[0], *self.pos.shape)], dim=-1)


class LinearTokenizer(nn.Module):
    """``[B, N, in_dim] → [B, N, dim]`` by a linear map, plus optional learned positions."""

    def __init__(self, in_dim: int, dim: int, max_len: int = 0) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, dim
        self.proj = nn.Linear(in_dim, dim)
        self.pos = nn.Embedding(max_len, dim) if max_len > 0 else None

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.in_dim:
            raise ValueError(f"LinearTokenizer expects [B, N, {self.in_dim}], got {list(x.shape)}")
        h = self.proj(x)
        return h if self.pos is None else h + _positions(self.pos, x.shape[1])


class EmbeddingTokenizer(nn.Module):
    """``[B, N]`` integer ids → ``[B, N, dim]``, plus learned positions.

    With ``pad_id`` set, :func:`padding_mask` marks the padding positions so that the
    read-in attention ignores them: a padded batch gives each sequence the output it
    would have alone."""

    def __init__(self, vocab_size: int, dim: int, max_len: int = 0, pad_id: int | None = None) -> None:
        super().__init__()
        self.vocab_size, self.out_dim, self.pad_id = vocab_size, dim, pad_id
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_len, dim) if max_len > 0 else None

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.is_floating_point():
            raise ValueError(f"EmbeddingTokenizer expects integer ids [B, N], got {x.dtype} {list(x.shape)}")
        h = self.embed(x)
        return h if self.pos is None else h + _positions(self.pos, x.shape[1])


def padding_mask(tokenizer: nn.Module, x: Tensor) -> Tensor | None:
    """Key mask ``[B, 1, 1, N]`` (bool, True = a real token) that hides padding ids from the
    read-in (:func:`~modwire.nn.attention.attend`'s ``key_mask``); None without padding."""
    pad_id = getattr(tokenizer, "pad_id", None)
    return None if pad_id is None else (x != pad_id)[:, None, None, :]


def _positions(table: nn.Embedding, n: int) -> Tensor:
    if n > table.num_embeddings:
        raise ValueError(f"sequence length {n} exceeds max_len {table.num_embeddings}")
    return table.weight[:n]
