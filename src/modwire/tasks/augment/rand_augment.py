"""RandAugment (Cubuk et al. 2020) and the functional image ops it draws from, in two forms:

* :class:`DeiTRandAugment`: timm's ``rand_augment_transform("rand-m9-mstd0.5-inc1")`` as DeiT runs it
  (NAC App. C's "standard data augmentation regimen" [DeiT]; ``data.augment: deit``): magnitude on a
  scale of 10, each of the 2 ops applied with probability 0.5, 15 ops with the "increasing" variants;
* :class:`RandAugment`: torchvision's table (14 ops, magnitude on a scale of 30, every op applied),
  NI's ``data.augment: randaugment``.

Both draw from the same functional ops below (one implementation of each).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .transforms import Fill, Transform, _check_image, _fill_tensor, _need, _randint
from ...errors import UserError

__all__ = ["DEIT_RANDAUGMENT_OPS", "DeiTRandAugment", "RANDAUGMENT_OPS", "RandAugment", "adjust_brightness",
           "adjust_contrast", "adjust_saturation", "adjust_sharpness", "affine", "autocontrast", "equalize", "invert",
           "posterize", "rotate", "shear_x", "shear_y", "solarize", "solarize_add", "translate_x", "translate_y"]


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


def solarize_add(img: Tensor, add: float, threshold: float = 128 / 255) -> Tensor:
    """Add ``add`` to every value ``v < threshold`` (clipped at 1); others are kept (PIL's point table of
    timm's ``solarize_add``: 8-bit levels below 128 raised by ``add·255``)."""
    return torch.where(img < threshold, (img + add).clamp(max=1), img)


def invert(img: Tensor) -> Tensor:
    """``1 - v`` (PIL's ``ImageOps.invert``)."""
    return 1 - img


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
    is drawn from ``N(magnitude, magnitude_std)`` clipped to the bin range (as timm's
    ``mstd``). Every drawn op is applied. ``fill`` colours pixels uncovered by the
    geometric ops. ``[C, H, W] -> [C, H, W]``. (NI's ``data.augment: randaugment``; DeiT's
    RandAugment, ``data.augment: deit``, is :class:`DeiTRandAugment`: at the same ``magnitude`` 9
    this table's ops are about a third as strong.)
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
        g = _need(generator)
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



# ----------------------------------------------------------------------------- DeiT's RandAugment (timm)

DEIT_RANDAUGMENT_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
                        "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                        "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
LEVEL_DENOM = 10       # timm's ``_LEVEL_DENOM``: magnitude m means the fraction l = m / 10 of each op's range
_ENHANCE = {"ColorIncreasing": adjust_saturation, "ContrastIncreasing": adjust_contrast,
            "BrightnessIncreasing": adjust_brightness, "SharpnessIncreasing": adjust_sharpness}
_DEIT_GEOMETRIC = {"Rotate": rotate, "ShearX": shear_x, "ShearY": shear_y, "TranslateXRel": translate_x,
                   "TranslateYRel": translate_y}
_DEIT_SIGNED = {*_DEIT_GEOMETRIC, *_ENHANCE}
# timm's level-to-argument functions, unsigned, of l = level / 10 and the image's (height, width); an enhance
# op's factor is 1 ± this
_DEIT_RANGES = {
    "Rotate": lambda l, h, w: 30.0 * l, "ShearX": lambda l, h, w: 0.3 * l, "ShearY": lambda l, h, w: 0.3 * l,
    "TranslateXRel": lambda l, h, w: 0.45 * l * w, "TranslateYRel": lambda l, h, w: 0.45 * l * h,
    **{op: (lambda l, h, w: 0.9 * l) for op in _ENHANCE},
    "PosterizeIncreasing": lambda l, h, w: float(4 - int(4 * l)),          # bits kept
    "SolarizeIncreasing": lambda l, h, w: (256 - int(256 * l)) / 255,       # threshold
    "SolarizeAdd": lambda l, h, w: int(110 * l) / 255}                       # added to values below 128 / 255


class DeiTRandAugment(Transform):
    """timm's RandAugment ``rand-m{magnitude}-mstd{magnitude_std}-inc1`` (``timm/data/auto_augment.py``:
    ``rand_augment_transform``), DeiT's ``rand-m9-mstd0.5-inc1`` by default (NAC App. C).

    ``num_ops`` ops are drawn uniformly with replacement from the 15 of :data:`DEIT_RANDAUGMENT_OPS`
    (timm's ``_RAND_INCREASING_TRANSFORMS``); each is applied with probability ``prob`` (0.5), at a
    level drawn per call from ``N(magnitude, magnitude_std)`` clipped to ``[0, 10]``, ``l = level / 10``:

    ======================================  ===========================================================
    Rotate                                  ``±30 l`` degrees
    ShearX, ShearY                          ``±0.3 l``
    TranslateXRel, TranslateYRel            ``±0.45 l`` of the width / height (not rounded)
    Color/Contrast/Brightness/Sharpness-    factor ``max(0.1, 1 ± 0.9 l)``
    Increasing
    PosterizeIncreasing                     keep ``4 - ⌊4 l⌋`` bits
    SolarizeIncreasing                      invert levels ``≥ (256 - ⌊256 l⌋) / 255``
    SolarizeAdd                             add ``⌊110 l⌋ / 255`` to levels below 128 / 255
    AutoContrast, Equalize, Invert          no argument
    ======================================  ===========================================================

    (``±``: the sign flips with probability 1/2.) At m = 9: 27°, 0.27, 0.405·size, ``1 ± 0.81``, 1 bit,
    threshold 26 / 255, add 99 / 255. ``fill`` colours pixels uncovered by the geometric ops (DeiT: the
    ImageNet mean). Differences from timm: images are float tensors (PIL's ops on 8-bit levels, re-stated
    on ``[0, 1]``) and the geometric ops resample bilinearly (DeiT: bicubic). ``[C, H, W] -> [C, H, W]``.
    """

    def __init__(self, num_ops: int = 2, magnitude: float = 9, magnitude_std: float = 0.5, prob: float = 0.5,
                 fill: Fill = 0.0, ops: Sequence[str] = DEIT_RANDAUGMENT_OPS):
        unknown = sorted(set(ops) - set(DEIT_RANDAUGMENT_OPS))
        if unknown or not ops:
            raise UserError(f"DeiTRandAugment: unknown or no op(s) {unknown or list(ops)}; valid: "
                            f"{list(DEIT_RANDAUGMENT_OPS)}")
        for name, v, lo, hi in (("magnitude", magnitude, 0, LEVEL_DENOM), ("prob", prob, 0, 1),
                                ("magnitude_std", magnitude_std, 0, math.inf), ("num_ops", num_ops, 0, math.inf)):
            if not lo <= v <= hi:
                raise UserError(f"DeiTRandAugment: {name} must be in [{lo}, {hi}], got {v!r}")
        self.num_ops, self.magnitude, self.magnitude_std, self.prob = int(num_ops), magnitude, magnitude_std, prob
        self.fill, self.ops = fill, tuple(ops)

    @staticmethod
    def op_argument(op: str, level: float, height: int, width: int, negate: bool = False) -> float | None:
        """timm's level-to-argument of ``op`` at ``level`` (on the scale of 10; class docstring), the sign
        flipped when ``negate`` (signed ops only); None for the ops without an argument."""
        if op not in _DEIT_RANGES:
            return None
        x = _DEIT_RANGES[op](level / LEVEL_DENOM, height, width)
        x = -x if negate and op in _DEIT_SIGNED else x
        return max(0.1, 1.0 + x) if op in _ENHANCE else x

    def apply_op(self, img: Tensor, op: str, arg: float | None) -> Tensor:
        """``op`` with its argument as :meth:`op_argument` returns it."""
        if op in _ENHANCE:
            return _ENHANCE[op](img, arg)
        if op in _DEIT_GEOMETRIC:
            return _DEIT_GEOMETRIC[op](img, arg, self.fill)
        if op == "PosterizeIncreasing":
            return posterize(img, int(arg))
        if op == "SolarizeIncreasing":
            return solarize(img, arg)
        if op == "SolarizeAdd":
            return solarize_add(img, arg)
        return {"AutoContrast": autocontrast, "Equalize": equalize, "Invert": invert}[op](img)

    def plan(self, generator: torch.Generator, height: int, width: int) -> list[tuple[str, float | None]]:
        """The ops this call applies, in order, with their arguments: ``num_ops`` ops drawn (with
        replacement), each kept with probability ``prob``, its level ``N(magnitude, magnitude_std)``
        clipped to ``[0, 10]``, its sign flipped with probability 1/2 (signed ops)."""
        g = generator
        chosen = [self.ops[_randint(g, 0, len(self.ops))] for _ in range(self.num_ops)]
        out = []
        for op in chosen:
            if self.prob < 1.0 and torch.rand((), generator=g).item() >= self.prob:
                continue
            level = float(self.magnitude)
            if self.magnitude_std > 0:
                level = min(max(level + self.magnitude_std * torch.randn((), generator=g).item(), 0.0), LEVEL_DENOM)
            negate = op in _DEIT_SIGNED and bool(_randint(g, 0, 2))
            out.append((op, self.op_argument(op, level, height, width, negate)))
        return out

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        _check_image(img, "DeiTRandAugment")
        g = _need(generator)
        for op, arg in self.plan(g, *img.shape[-2:]):
            img = self.apply_op(img, op, arg)
        return img
