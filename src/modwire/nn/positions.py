"""Relative positional bias (NI App. C.2.3, Eq. 20-21). Interim version of the integrator: the
shared, per-head part only; the `ni` branch replaces this file with the full Eq. 20-24."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class RelativePositionBias(nn.Module):
    """``b^h[Δr, Δc] = w_row^h·e_row[Δr] + w_col^h·e_col[Δc]`` over a ``(R, C)`` grid → ``[H, G, G]``."""

    def __init__(self, grid: tuple[int, int], num_heads: int, pos_dim: int) -> None:
        super().__init__()
        r, c = grid
        self.grid = grid
        self.e_row = nn.Parameter(0.02 * torch.randn(2 * r - 1, pos_dim))
        self.e_col = nn.Parameter(0.02 * torch.randn(2 * c - 1, pos_dim))
        self.w_row = nn.Linear(pos_dim, num_heads, bias=False)
        self.w_col = nn.Linear(pos_dim, num_heads, bias=False)
        rows, cols = torch.meshgrid(torch.arange(r), torch.arange(c), indexing="ij")
        rows, cols = rows.flatten(), cols.flatten()
        self.register_buffer("d_row", rows[None, :] - rows[:, None] + r - 1, persistent=False)
        self.register_buffer("d_col", cols[None, :] - cols[:, None] + c - 1, persistent=False)

    def forward(self) -> Tensor:
        row = self.w_row(self.e_row)[self.d_row]              # [G, G, H]
        col = self.w_col(self.e_col)[self.d_col]
        return (row + col).permute(2, 0, 1)                   # [H, G, G]
