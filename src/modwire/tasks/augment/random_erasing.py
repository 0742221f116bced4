"""Random erasing (Zhong et al. 2020), as in DeiT / NAC App. C (p = 0.25)."""
from __future__ import annotations

import torch
from torch import Tensor

from .transforms import Fill, Transform, _fill_tensor, _need, _random_box
from ...errors import UserError

__all__ = ["RandomErasing"]


class RandomErasing(Transform):
    """With probability ``p``, overwrite one random rectangle (Zhong et al. 2020).

    The rectangle's area is ``U(scale) * H * W`` and its aspect ratio (h / w) is
    log-uniform in ``ratio``; up to 10 draws are tried for one that fits, else the image
    is returned unchanged. ``value``: ``"random"`` (per-pixel standard normal noise, meant
    for normalised images), a float, or one float per channel. ``[C, H, W] -> [C, H, W]``.
    """

    def __init__(self, p: float = 0.25, scale: tuple[float, float] = (0.02, 1 / 3),
                 ratio: tuple[float, float] = (0.3, 3.3), value: str | Fill = "random"):
        if isinstance(value, str) and value != "random":
            raise UserError(f"value must be 'random', a float or a per-channel sequence, got {value!r}")
        self.p, self.scale, self.ratio, self.value = p, tuple(scale), tuple(ratio), value

    def get_params(self, height: int, width: int, generator: torch.Generator) -> tuple[int, int, int, int] | None:
        """``(top, left, h, w)`` of the erased box, or ``None`` if no draw fitted."""
        # aspect here is h / w (timm's RandomErasing), hence the swapped ratio
        box = _random_box(height, width, self.scale, (1 / self.ratio[1], 1 / self.ratio[0]), generator,
                          fits=lambda h, w: h < height and w < width)
        return box

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        g = _need(generator)
        if torch.rand((), generator=g).item() >= self.p:
            return img
        box = self.get_params(img.shape[-2], img.shape[-1], g)
        if box is None:
            return img
        top, left, h, w = box
        out = img.clone()
        if isinstance(self.value, str):
            patch = torch.randn((img.shape[0], h, w), generator=g, dtype=img.dtype).to(img.device)
        else:
            patch = _fill_tensor(self.value, img)
        out[:, top:top + h, left:left + w] = patch
        return out

