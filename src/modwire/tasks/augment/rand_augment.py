"""RandAugment (Cubuk et al. 2020) and the functional image ops it draws from.

NAC App. C uses DeiT's setting: 2 ops at magnitude 9 (``magnitude_std`` 0.5).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .transforms import Fill, Transform, _check_image, _fill_tensor, _need, _randint
from ...errors import UserError

__all__ = ["RANDAUGMENT_OPS", "RandAugment", "adjust_brightness", "adjust_contrast", "adjust_saturation",
           "adjust_sharpness", "affine", "autocontrast", "equalize", "posterize", "rotate", "shear_x", "shear_y",
           "solarize", "translate_x", "translate_y"]


# All take and return float images [C, H, W] in [0, 1]. Geometric ops fill uncovered
# pixels with ``fill`` (a float or one value per channel).

def affine(img: Tensor, matrix: Sequence[Sequence[float]], offset: Sequence[float] = (0.0, 0.0),
           fill: Fill = 0.0) -> Tensor:
    """Resample ``img [C, H, W]`` through an inverse affine map, bilinearly.

    Coordinates are in pixels, ``(x, y)`` = (column, row) measured from the image centre
    (y points down). The output pixel at ``p`` takes the input value at
    ``matrix @ p + offset``; samples outside the image take ``fill`` (blended at the
    border by the fraction of the bilinear footprint that falls outside).
    """
    _check_image(img, "affine")
    c, h, w = img.shape
    (a, b), (d, e) = matrix
    tx, ty = offset
    # normalised coords (align_corners=False): x_n = 2 x / W, y_n = 2 y / H
    theta = torch.tensor([[a, b * h / w, 2 * tx / w], [d * w / h, e, 2 * ty / h]],
                         dtype=img.dtype, device=img.device)[None]
    grid = F.affine_grid(theta, [1, c + 1, h, w], align_corners=False)
    src = torch.cat([img, torch.ones_like(img[:1])], 0)[None]
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0]
    img_out, inside = out[:c], out[c:]
    return img_out + (1 - inside) * _fill_tensor(fill, img)


def shear_x(img: Tensor, factor: float, fill: Fill = 0.0) -> Tensor:
    """Horizontal shear about the top-left corner (as PIL / torchvision): out(x, y) = in(x + factor*y, y)."""
    return affine(img, [[1.0, factor], [0.0, 1.0]], (factor * img.shape[-2] / 2, 0.0), fill)


def shear_y(img: Tensor, factor: float, fill: Fill = 0.0) -> Tensor:
    """Vertical shear about the top-left corner: out(x, y) = in(x, y + factor*x)."""
    return affine(img, [[1.0, 0.0], [factor, 1.0]], (0.0, factor * img.shape[-1] / 2), fill)


def translate_x(img: Tensor, pixels: float, fill: Fill = 0.0) -> Tensor:
    """Move the content ``pixels`` to the right (negative: left)."""
    return affine(img, [[1.0, 0.0], [0.0, 1.0]], (-pixels, 0.0), fill)


def translate_y(img: Tensor, pixels: float, fill: Fill = 0.0) -> Tensor:
    """Move the content ``pixels`` down (negative: up)."""
    return affine(img, [[1.0, 0.0], [0.0, 1.0]], (0.0, -pixels), fill)


def rotate(img: Tensor, degrees: float, fill: Fill = 0.0) -> Tensor:
    """Rotate counter-clockwise (as displayed) by ``degrees`` about the image centre.

    For a square image, ``rotate(img, 90)`` equals ``torch.rot90(img, 1, (-2, -1))``.
    """
    t = math.radians(degrees)
    cos, sin = math.cos(t), math.sin(t)
    return affine(img, [[cos, -sin], [sin, cos]], (0.0, 0.0), fill)


def _grayscale(img: Tensor) -> Tensor:
    """Luma ``[1, H, W]`` (ITU-R 601-2 weights for RGB; the channel mean otherwise)."""
    if img.shape[0] == 3:
        r, g, b = img[0], img[1], img[2]
        return (0.299 * r + 0.587 * g + 0.114 * b)[None]
    return img.mean(0, keepdim=True)


def _blend(img: Tensor, other: Tensor, factor: float) -> Tensor:
    return (factor * img + (1 - factor) * other).clamp(0, 1)


def adjust_brightness(img: Tensor, factor: float) -> Tensor:
    """``clamp(factor * img)``: 0 is black, 1 the original."""
    return _blend(img, torch.zeros_like(img), factor)


def adjust_saturation(img: Tensor, factor: float) -> Tensor:
    """Blend with the grayscale image ("Color"): 0 is grayscale, 1 the original."""
    return _blend(img, _grayscale(img), factor)


def adjust_contrast(img: Tensor, factor: float) -> Tensor:
    """Blend with the mean gray level: 0 is uniform gray, 1 the original."""
    return _blend(img, _grayscale(img).mean(), factor)


def adjust_sharpness(img: Tensor, factor: float) -> Tensor:
    """Blend with a smoothed image (3x3 kernel [[1,1,1],[1,5,1],[1,1,1]]/13, border kept):
    0 is the smoothed image, 1 the original, > 1 sharpens."""
    c, h, w = img.shape
    if h <= 2 or w <= 2:
        return img
    k = torch.ones(3, 3, dtype=img.dtype, device=img.device)
    k[1, 1] = 5
    k = (k / k.sum()).expand(c, 1, 3, 3)
    smooth = img.clone()
    smooth[:, 1:-1, 1:-1] = F.conv2d(img[None], k, groups=c)[0]
    return _blend(img, smooth, factor)


def _to_uint8_levels(img: Tensor) -> Tensor:
    return (img * 255).round().clamp(0, 255).to(torch.int64)


def posterize(img: Tensor, bits: int) -> Tensor:
    """Keep the ``bits`` most significant bits of each 8-bit value (``img`` is first
    quantised to 256 levels); outputs are multiples of ``2**(8 - bits) / 255``."""
    if not 0 <= bits <= 8:
        raise UserError(f"bits must be in [0, 8], got {bits}")
    mask = ~(2 ** (8 - bits) - 1) & 0xFF
    return (_to_uint8_levels(img) & mask).to(img.dtype) / 255


def solarize(img: Tensor, threshold: float) -> Tensor:
    """Invert (``1 - v``) every value ``v >= threshold``; others are kept."""
    return torch.where(img >= threshold, 1 - img, img)


def autocontrast(img: Tensor) -> Tensor:
    """Stretch each channel linearly so its minimum maps to 0 and maximum to 1
    (constant channels are kept)."""
    lo = img.amin(dim=(-2, -1), keepdim=True)
    hi = img.amax(dim=(-2, -1), keepdim=True)
    flat = hi <= lo
    scale = torch.where(flat, torch.ones_like(hi), 1 / (hi - lo).clamp_min(1e-12))
    lo = torch.where(flat, torch.zeros_like(lo), lo)
    return ((img - lo) * scale).clamp(0, 1)


def equalize(img: Tensor) -> Tensor:
    """Histogram equalisation of each channel over 256 bins (PIL's ImageOps.equalize rule).

    The image is quantised to 8 bits; each channel's lookup table maps level ``v`` to
    ``(cdf(v - 1) + step // 2) // step`` with ``step = (N - count of the top level) // 255``.
    A channel with a single level (step 0) is returned unchanged.
    """
    levels = _to_uint8_levels(img)
    out = []
    for ch, lv in zip(img, levels):
        hist = torch.bincount(lv.reshape(-1), minlength=256)
        nonzero = hist[hist > 0]
        step = (int(nonzero.sum()) - int(nonzero[-1])) // 255
        if step == 0:
            out.append(ch)
            continue
        lut = (hist.cumsum(0) + step // 2) // step
        lut = torch.cat([lut.new_zeros(1), lut[:-1]]).clamp(0, 255)
        out.append(lut[lv].to(img.dtype) / 255)
    return torch.stack(out)


# ----------------------------------------------------------------------------- RandAugment

RANDAUGMENT_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
                   "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
_SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
           "Sharpness"}


class RandAugment(Transform):
    """RandAugment (Cubuk et al. 2020): apply ``num_ops`` ops drawn uniformly (with
    replacement) from the standard 14, each at a magnitude level ``magnitude`` out of
    ``num_magnitude_bins - 1``.

    Op strengths at level ``m`` (``l = m / (num_magnitude_bins - 1)``, torchvision's table):
    shear ``0.3 l``, translate ``(150/331) l`` of the width / height (rounded to whole
    pixels), rotate ``30 l`` degrees, brightness / color / contrast / sharpness factor
    ``1 +- 0.9 l``, posterize to ``8 - round(4 l)`` bits, solarize threshold ``1 - l``.
    Signed ops flip sign with probability 1/2. With ``magnitude_std > 0`` each op's level
    is drawn from ``N(magnitude, magnitude_std)`` clipped to the bin range (timm's
    ``mstd``; DeiT uses ``rand-m9-mstd0.5``). ``fill`` colours pixels uncovered by the
    geometric ops. ``[C, H, W] -> [C, H, W]``.
    """

    def __init__(self, num_ops: int = 2, magnitude: float = 9, num_magnitude_bins: int = 31,
                 magnitude_std: float = 0.0, fill: Fill = 0.0, ops: Sequence[str] = RANDAUGMENT_OPS):
        unknown = sorted(set(ops) - set(RANDAUGMENT_OPS))
        if unknown:
            raise UserError(f"unknown RandAugment op(s) {unknown}; valid: {list(RANDAUGMENT_OPS)}")
        if not 0 <= magnitude <= num_magnitude_bins - 1:
            raise UserError(f"magnitude must be in [0, {num_magnitude_bins - 1}], got {magnitude}")
        self.num_ops, self.magnitude, self.num_magnitude_bins = num_ops, magnitude, num_magnitude_bins
        self.magnitude_std, self.fill, self.ops = magnitude_std, fill, tuple(ops)

    def op_strength(self, op: str, level: float, height: int, width: int) -> float:
        """Unsigned strength of ``op`` at magnitude ``level`` (see the class docstring)."""
        lv = level / (self.num_magnitude_bins - 1)
        return {
            "Identity": 0.0, "AutoContrast": 0.0, "Equalize": 0.0,
            "ShearX": 0.3 * lv, "ShearY": 0.3 * lv,
            "TranslateX": float(round(150 / 331 * width * lv)), "TranslateY": float(round(150 / 331 * height * lv)),
            "Rotate": 30.0 * lv,
            "Brightness": 0.9 * lv, "Color": 0.9 * lv, "Contrast": 0.9 * lv, "Sharpness": 0.9 * lv,
            "Posterize": float(8 - round(4 * lv)),
            "Solarize": 1.0 - lv,
        }[op]

    def apply_op(self, img: Tensor, op: str, strength: float) -> Tensor:
        """Apply ``op`` with a signed ``strength`` (as returned by ``op_strength``, sign included)."""
        fill = self.fill
        if op == "Identity":
            return img
        if op == "ShearX":
            return shear_x(img, strength, fill)
        if op == "ShearY":
            return shear_y(img, strength, fill)
        if op == "TranslateX":
            return translate_x(img, strength, fill)
        if op == "TranslateY":
            return translate_y(img, strength, fill)
        if op == "Rotate":
            return rotate(img, strength, fill)
        if op == "Brightness":
            return adjust_brightness(img, 1 + strength)
        if op == "Color":
            return adjust_saturation(img, 1 + strength)
        if op == "Contrast":
            return adjust_contrast(img, 1 + strength)
        if op == "Sharpness":
            return adjust_sharpness(img, 1 + strength)
        if op == "Posterize":
            return posterize(img, int(strength))
        if op == "Solarize":
            return solarize(img, strength)
        if op == "AutoContrast":
            return autocontrast(img)
        if op == "Equalize":
            return equalize(img)
        raise UserError(op)

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        _check_image(img, "RandAugment")
        g = _need(generator, "RandAugment")
        h, w = img.shape[-2:]
        for _ in range(self.num_ops):
            op = self.ops[_randint(g, 0, len(self.ops))]
            level = float(self.magnitude)
            if self.magnitude_std > 0:
                level += self.magnitude_std * torch.randn((), generator=g).item()
                level = min(max(level, 0.0), self.num_magnitude_bins - 1.0)
            strength = self.op_strength(op, level, h, w)
            if op in _SIGNED and _randint(g, 0, 2):
                strength = -strength
            img = self.apply_op(img, op, strength)
        return img

