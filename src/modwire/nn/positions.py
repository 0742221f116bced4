"""Relative positional bias on a grid of tokens (NI App. C.2.3, Eq. 20-24; after Cordonnier et
al. 2020), shared by the ViT baseline (Eq. 20-21) and the Neural Interpreter (Eq. 20-24).

For tokens at grid positions ``(i1, j1)`` (query) and ``(i2, j2)`` (key), with learned
embeddings ``e_row[i2 - i1]`` ``[2R-1, pos_dim]`` and ``e_col[j2 - j1]`` ``[2C-1, pos_dim]``:

* Eq. 20-21, per head ``h``: ``e^h_row[Δr] = w^h_row·e_row[Δr]``, ``e^h_col[Δc] = w^h_col·e_col[Δc]``;
* Eq. 22-23, per function ``u`` (NI only): ``p^{uh}_row[Δr] = ModLin^h_row(e_row[Δr]; c_u)``,
  likewise for columns. The ``H`` per-head ModLins are the ``H`` output rows of one ModLin
  (:class:`~modwire.nn.modulated.ModulatedLinear`, NI Eq. 4), so they share the code projection
  ``W_c`` (the paper does not say; the authors' released preset uses a cheaper variant,
  ``p^{uh} = (W c_u)_h``, which does not depend on the offset);
* Eq. 24: ``b^{uh}[Δr, Δc] = (p^{uh}_row + e^h_row)[Δr] + (p^{uh}_col + e^h_col)[Δc]``, added to
  the attention logits between the grid tokens.

The grid tokens come first in the set; :func:`pad_bias` gives the other tokens (CLS tokens,
appended after the grid) bias 0 (NI §4.2: "applied only to the first 64 input elements").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .modulated import ModulationSpec
from ..errors import UserError


def grid_offsets(rows: int, cols: int) -> tuple[Tensor, Tensor]:
    """``(Δr, Δc)`` ``[G, G]`` (``G = rows·cols``, row-major): offsets ``key - query`` shifted to
    ``[0, 2R-1)`` and ``[0, 2C-1)``, the indices into ``e_row`` and ``e_col``."""
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    r, c = r.flatten(), c.flatten()
    return r[None, :] - r[:, None] + rows - 1, c[None, :] - c[:, None] + cols - 1


class RelativePositionBias(nn.Module):
    """NI Eq. 20-24 (module docstring) over a ``grid = (R, C)`` of tokens.

    Args:
        grid: ``(rows, cols)`` of the patch tokens. num_heads: ``H``. pos_dim: width of ``e_row``, ``e_col``.
        mod: a ``ModulationSpec`` of kind ``"ni"`` adds each function's own bias (Eq. 22-23);
            None: the shared part only (Eq. 20-21, the ViT).

    ``forward()`` → ``[H, G, G]``; ``forward(codes [U, d_code])`` → ``[U, H, G, G]``.
    """

    def __init__(self, grid: tuple[int, int], num_heads: int, pos_dim: int, *,
                 mod: ModulationSpec | None = None) -> None:
        super().__init__()
        rows, cols = grid
        if min(rows, cols, num_heads, pos_dim) < 1:
            raise UserError(f"RelativePositionBias: grid, num_heads and pos_dim must be positive, got "
                            f"grid={grid}, num_heads={num_heads}, pos_dim={pos_dim}")
        if mod is not None and mod.kind != "ni":
            raise UserError(f"RelativePositionBias: per-function biases are NI ModLins (Eq. 22-23), "
                            f"need a ModulationSpec of kind 'ni', got {mod.kind!r}")
        self.grid = (rows, cols)
        self.e_row = nn.Parameter(0.02 * torch.randn(2 * rows - 1, pos_dim))
        self.e_col = nn.Parameter(0.02 * torch.randn(2 * cols - 1, pos_dim))
        self.w_row = nn.Linear(pos_dim, num_heads, bias=False)               # rows are w^h_row (Eq. 20)
        self.w_col = nn.Linear(pos_dim, num_heads, bias=False)
        self.f_row = None if mod is None else mod.linear(pos_dim, num_heads)  # ModLin^h_row (Eq. 22)
        self.f_col = None if mod is None else mod.linear(pos_dim, num_heads)
        d_row, d_col = grid_offsets(rows, cols)
        self.register_buffer("d_row", d_row, persistent=False)
        self.register_buffer("d_col", d_col, persistent=False)

    def forward(self, codes: Tensor | None = None) -> Tensor:
        """``[H, G, G]``, or ``[U, H, G, G]`` given codes ``[U, d_code]`` (needs ``mod``)."""
        row, col = self.w_row(self.e_row), self.w_col(self.e_col)           # [2R-1, H], [2C-1, H]
        if codes is not None:
            if self.f_row is None:
                raise UserError("RelativePositionBias: per-function biases need mod=ModulationSpec('ni', ...)")
            c = codes.unsqueeze(-2)                                         # [U, 1, d_code]
            row = row + self.f_row(self.e_row, c)                           # Eq. 24's sums  [U, 2R-1, H]
            col = col + self.f_col(self.e_col, c)
        bias = row[..., self.d_row, :] + col[..., self.d_col, :]            # [(U,) G, G, H]
        return bias.movedim(-1, -3)                                         # [(U,) H, G, G]


def pad_bias(bias: Tensor, num_tokens: int) -> Tensor:
    """``[..., G, G] → [..., N, N]``: a bias over the first ``G`` (grid) tokens, 0 for pairs that
    involve any later token (the CLS tokens)."""
    pad = num_tokens - bias.shape[-1]
    if pad < 0:
        raise UserError(f"pad_bias: the bias covers {bias.shape[-1]} tokens, more than the {num_tokens} given")
    return bias if pad == 0 else F.pad(bias, (0, pad, 0, pad))
