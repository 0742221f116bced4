"""Image augmentation for ImageNet-style pre-training, in plain PyTorch tensor ops.

NAC App. C trains NACs and PIOs on (Tiny-)ImageNet with "a standard data augmentation
regimen" [DeiT, Touvron et al. 2021]: random resized crop, horizontal flip,
RandAugment (2 ops, magnitude 9), random erasing (p=0.25), mixup (alpha 0.8) /
cutmix (alpha 1.0) and label smoothing 0.1. This module implements that regimen
without torchvision.

Conventions
-----------
* Images are float tensors ``[C, H, W]`` with values in ``[0, 1]`` (``ToFloat`` turns
  ``uint8`` images into that form); after ``Normalize`` they are standardised.
* Randomness comes only from an explicit CPU ``torch.Generator`` passed to every call
  (``transform(img, generator)``); the global RNG is never touched, so an output is a
  pure function of the input and the generator's state. Deterministic transforms
  accept ``generator=None``.
* ``AugmentedDataset`` seeds a fresh generator from ``(seed, epoch, index)`` for every
  item, so augmentation does not depend on worker count or iteration order.
* Batch-level ``MixupCutmix`` mixes each sample with the batch flipped along dim 0
  (timm's ``mode="batch"`` convention) and returns soft targets ``[B, num_classes]``
  for ``soft_target_cross_entropy``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Fill = float | Sequence[float]

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "AugmentedDataset", "CenterCrop", "Compose", "MixParams",
    "MixupCutmix", "Normalize", "RandAugment", "RandomErasing", "RandomHorizontalFlip",
    "RandomResizedCrop", "Resize", "ToFloat", "adjust_brightness", "adjust_contrast",
    "adjust_saturation", "adjust_sharpness", "affine", "autocontrast", "equalize",
    "eval_transform", "item_generator", "item_seed", "posterize", "rotate", "shear_x",
    "shear_y", "smooth_one_hot", "soft_target_cross_entropy", "solarize",
    "standard_train_transform", "translate_x", "translate_y",
]


# ----------------------------------------------------------------------------- randomness

def _need(generator: torch.Generator | None, who: str) -> torch.Generator:
    if generator is None:
        raise ValueError(f"{who} is random and needs an explicit torch.Generator (the global RNG is never used)")
    return generator


def _uniform(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * torch.rand((), generator=g).item()


def _randint(g: torch.Generator, lo: int, hi: int) -> int:
    """Uniform integer in ``[lo, hi)``."""
    return int(torch.randint(lo, hi, (), generator=g).item())


def _beta(g: torch.Generator, a: float, b: float) -> float:
    """Beta(a, b) sample; torch's Beta takes no generator, so numpy is seeded from ``g``."""
    seed = int(torch.randint(0, 2**62, (), generator=g).item())
    return float(np.random.default_rng(seed).beta(a, b))


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed that is a pure, well-mixed function of ``(seed, epoch, index)``."""
    lo, hi = np.random.SeedSequence([int(seed) & (2**64 - 1), int(epoch), int(index)]).generate_state(2, np.uint32)
    return (int(hi) << 31) ^ int(lo)


def item_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A fresh CPU generator seeded by :func:`item_seed`."""
    return torch.Generator().manual_seed(item_seed(seed, epoch, index))


# ----------------------------------------------------------------------------- base

def _random_box(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
                g: torch.Generator, fits: Callable[[int, int], bool], tries: int = 10):
    """``(top, left, h, w)`` of a box with area fraction ~ U(scale) and log-uniform aspect
    ``w / h`` in ``ratio``, placed uniformly; None if no draw of ``tries`` fits."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(tries):
        target = area * _uniform(g, *scale)
        aspect = math.exp(_uniform(g, log_lo, log_hi))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if w > 0 and h > 0 and fits(h, w):
            return _randint(g, 0, height - h + 1), _randint(g, 0, width - w + 1), h, w
    return None


class Transform:
    """Base class: ``__call__(img [C, H, W], generator) -> img``."""

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class Compose(Transform):
    """Apply ``transforms`` in order, all drawing from the same generator."""

    def __init__(self, transforms: Sequence[Callable[[Tensor, torch.Generator | None], Tensor]]):
        self.transforms = list(transforms)

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        for t in self.transforms:
            img = t(img, generator)
        return img

    def __repr__(self) -> str:
        inner = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose([{inner}\n])"


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


def _check_image(img: Tensor, who: str) -> None:
    if img.dim() != 3 or not img.is_floating_point():
        raise ValueError(f"{who} expects a float image [C, H, W], got dtype {img.dtype} and shape {tuple(img.shape)}")


def _resize(img: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinear, antialiased resize of ``img [C, H, W]`` to ``[C, *size]``."""
    if tuple(img.shape[-2:]) == size:
        return img
    return F.interpolate(img[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0]


class ToFloat(Transform):
    """``uint8`` image ``[C, H, W]`` in [0, 255] -> float32 in [0, 1]; float images pass through."""

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if img.dtype == torch.uint8:
            return img.float().div_(255)
        return img


class Resize(Transform):
    """Resize ``[C, H, W]``: an int sets the shorter side (aspect kept), a pair sets ``(h, w)``."""

    def __init__(self, size: int | Sequence[int]):
        self.size = size

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        _check_image(img, "Resize")
        h, w = img.shape[-2:]
        if isinstance(self.size, int):
            if h <= w:
                out = (self.size, max(1, round(w * self.size / h)))
            else:
                out = (max(1, round(h * self.size / w)), self.size)
        else:
            out = _pair(self.size)
        return _resize(img, out)


class CenterCrop(Transform):
    """Crop the central ``size`` window of ``[C, H, W]`` (the image must be at least that big)."""

    def __init__(self, size: int | Sequence[int]):
        self.size = size

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        th, tw = _pair(self.size)
        h, w = img.shape[-2:]
        if th > h or tw > w:
            raise ValueError(f"CenterCrop{(th, tw)} is larger than the image {(h, w)}")
        top, left = (h - th) // 2, (w - tw) // 2
        return img[..., top:top + th, left:left + tw]


class Normalize(Transform):
    """``(img - mean) / std`` per channel; works on ``[..., C, H, W]``."""

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD):
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        mean = torch.as_tensor(self.mean, dtype=img.dtype, device=img.device)[:, None, None]
        std = torch.as_tensor(self.std, dtype=img.dtype, device=img.device)[:, None, None]
        return (img - mean) / std


# ----------------------------------------------------------------------------- crop and flip

class RandomResizedCrop(Transform):
    """Crop a random window of random area and aspect ratio, then resize it to ``size``.

    The window's area is ``U(scale) * H * W`` and its aspect ratio (w / h) is log-uniform
    in ``ratio``; up to 10 draws are tried, after which the largest central crop whose
    aspect ratio lies in ``ratio`` is used. Resizing is bilinear with antialiasing.
    ``[C, H, W] -> [C, size_h, size_w]``.
    """

    def __init__(self, size: int | Sequence[int], scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3)):
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            raise ValueError(f"scale and ratio must be (min, max), got {scale} and {ratio}")
        self.size, self.scale, self.ratio = _pair(size), tuple(scale), tuple(ratio)

    def get_params(self, height: int, width: int, generator: torch.Generator) -> tuple[int, int, int, int]:
        """``(top, left, h, w)`` of the crop window for an image of ``height x width``."""
        box = _random_box(height, width, self.scale, self.ratio, generator, fits=lambda h, w: h <= height and w <= width)
        if box is not None:
            return box
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            h, w = height, round(height * self.ratio[1])
        else:
            h, w = height, width
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        _check_image(img, "RandomResizedCrop")
        top, left, h, w = self.get_params(img.shape[-2], img.shape[-1], _need(generator, "RandomResizedCrop"))
        return _resize(img[..., top:top + h, left:left + w], self.size)


class RandomHorizontalFlip(Transform):
    """With probability ``p``, mirror the image left-right (``img.flip(-1)``)."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if torch.rand((), generator=_need(generator, "RandomHorizontalFlip")).item() < self.p:
            return img.flip(-1)
        return img


# ----------------------------------------------------------------------------- functional ops
# All take and return float images [C, H, W] in [0, 1]. Geometric ops fill uncovered
# pixels with ``fill`` (a float or one value per channel).

def _fill_tensor(fill: Fill, img: Tensor) -> Tensor:
    f = torch.as_tensor(fill, dtype=img.dtype, device=img.device).reshape(-1)
    if f.numel() not in (1, img.shape[0]):
        raise ValueError(f"fill has {f.numel()} values for an image with {img.shape[0]} channels")
    return f.expand(img.shape[0])[:, None, None]


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
        raise ValueError(f"bits must be in [0, 8], got {bits}")
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
            raise ValueError(f"unknown RandAugment op(s) {unknown}; valid: {list(RANDAUGMENT_OPS)}")
        if not 0 <= magnitude <= num_magnitude_bins - 1:
            raise ValueError(f"magnitude must be in [0, {num_magnitude_bins - 1}], got {magnitude}")
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
        raise ValueError(op)

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


# ----------------------------------------------------------------------------- random erasing

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
            raise ValueError(f"value must be 'random', a float or a per-channel sequence, got {value!r}")
        self.p, self.scale, self.ratio, self.value = p, tuple(scale), tuple(ratio), value

    def get_params(self, height: int, width: int, generator: torch.Generator) -> tuple[int, int, int, int] | None:
        """``(top, left, h, w)`` of the erased box, or ``None`` if no draw fitted."""
        # aspect here is h / w (timm's RandomErasing), hence the swapped ratio
        box = _random_box(height, width, self.scale, (1 / self.ratio[1], 1 / self.ratio[0]), generator,
                          fits=lambda h, w: h < height and w < width)
        return box

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        g = _need(generator, "RandomErasing")
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


# ----------------------------------------------------------------------------- mixup / cutmix

def smooth_one_hot(y: Tensor, num_classes: int, smoothing: float = 0.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """Label-smoothed one-hot targets ``[B, num_classes]`` for labels ``y [B]``:
    ``1 - smoothing + smoothing / num_classes`` on the label, ``smoothing / num_classes`` elsewhere."""
    off = smoothing / num_classes
    out = torch.full((y.shape[0], num_classes), off, dtype=dtype, device=y.device)
    return out.scatter_(1, y.long()[:, None], 1 - smoothing + off)


def soft_target_cross_entropy(logits: Tensor, soft_targets: Tensor, reduction: str = "mean") -> Tensor:
    """``-sum_c t_c log softmax(logits)_c`` per row; logits and soft_targets ``[B, C]``.
    ``reduction``: ``"mean"`` (scalar), ``"sum"`` or ``"none"`` (``[B]``)."""
    loss = -(soft_targets * F.log_softmax(logits, dim=-1)).sum(-1)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


@dataclass(frozen=True)
class MixParams:
    """One batch's mixing draw. ``mode``: ``"none"``, ``"mixup"`` or ``"cutmix"``; ``lam``:
    weight of the un-flipped batch (for cutmix: 1 - box area fraction); ``box``:
    ``(y0, y1, x0, x1)`` pasted from the flipped batch (cutmix only)."""

    mode: str
    lam: float
    box: tuple[int, int, int, int] | None = None


class MixupCutmix:
    """Batch-level Mixup (Zhang et al. 2018) or CutMix (Yun et al. 2019) with label smoothing.

    With probability ``prob`` the batch is mixed with itself flipped along dim 0 (sample
    ``i`` with sample ``B - 1 - i``): CutMix with probability ``switch_prob`` (when both
    alphas are > 0), else Mixup. ``lam ~ Beta(alpha, alpha)``; for CutMix a box of area
    ``(1 - lam) H W`` centred uniformly at random is clipped to the image and ``lam`` is
    recomputed from the clipped area. Targets: ``lam * smooth(y) + (1 - lam) * smooth(y.flip(0))``.
    ``x [B, C, H, W], y [B] -> (x_mixed [B, C, H, W], y_soft [B, num_classes])``; inputs are not modified.
    Defaults are DeiT's (NAC App. C). The last draw is kept in ``last_params``.
    """

    def __init__(self, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0, prob: float = 1.0,
                 switch_prob: float = 0.5, label_smoothing: float = 0.1, *, num_classes: int):
        self.mixup_alpha, self.cutmix_alpha, self.prob = mixup_alpha, cutmix_alpha, prob
        self.switch_prob, self.label_smoothing, self.num_classes = switch_prob, label_smoothing, num_classes
        self.last_params: MixParams | None = None

    def sample_params(self, height: int, width: int, generator: torch.Generator) -> MixParams:
        """Draw the mixing mode, ``lam`` and (for CutMix) the box for ``height x width`` images."""
        g = generator
        if torch.rand((), generator=g).item() >= self.prob:
            return MixParams("none", 1.0)
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            use_cutmix = torch.rand((), generator=g).item() < self.switch_prob
        elif self.cutmix_alpha > 0:
            use_cutmix = True
        elif self.mixup_alpha > 0:
            use_cutmix = False
        else:
            return MixParams("none", 1.0)
        if not use_cutmix:
            return MixParams("mixup", _beta(g, self.mixup_alpha, self.mixup_alpha))
        lam = _beta(g, self.cutmix_alpha, self.cutmix_alpha)
        cut = math.sqrt(1 - lam)
        cut_h, cut_w = int(height * cut), int(width * cut)
        cy, cx = _randint(g, 0, height), _randint(g, 0, width)
        y0, y1 = min(max(cy - cut_h // 2, 0), height), min(max(cy + cut_h // 2, 0), height)
        x0, x1 = min(max(cx - cut_w // 2, 0), width), min(max(cx + cut_w // 2, 0), width)
        lam = 1 - (y1 - y0) * (x1 - x0) / (height * width)
        return MixParams("cutmix", lam, (y0, y1, x0, x1))

    def apply(self, x: Tensor, y: Tensor, params: MixParams) -> tuple[Tensor, Tensor]:
        """Mix ``x`` and build soft targets for a given draw."""
        y1 = smooth_one_hot(y, self.num_classes, self.label_smoothing)
        if params.mode == "none":
            return x, y1
        if params.mode == "mixup":
            x = params.lam * x + (1 - params.lam) * x.flip(0)
        else:
            y0, y1_, x0, x1 = params.box
            x = x.clone()
            x[..., y0:y1_, x0:x1] = x.flip(0)[..., y0:y1_, x0:x1]
        y2 = smooth_one_hot(y.flip(0), self.num_classes, self.label_smoothing)
        return x, params.lam * y1 + (1 - params.lam) * y2

    def __call__(self, x: Tensor, y: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        params = self.sample_params(x.shape[-2], x.shape[-1], _need(generator, "MixupCutmix"))
        self.last_params = params
        return self.apply(x, y, params)

    def __repr__(self) -> str:
        return (f"MixupCutmix(mixup_alpha={self.mixup_alpha}, cutmix_alpha={self.cutmix_alpha}, prob={self.prob}, "
                f"switch_prob={self.switch_prob}, label_smoothing={self.label_smoothing}, "
                f"num_classes={self.num_classes})")


# ----------------------------------------------------------------------------- pipelines

def standard_train_transform(image_size: int | Sequence[int], *, scale: tuple[float, float] = (0.08, 1.0),
                             ratio: tuple[float, float] = (3 / 4, 4 / 3), hflip: float = 0.5,
                             randaug_num_ops: int = 2, randaug_magnitude: float = 9,
                             randaug_magnitude_std: float = 0.5, mean: Sequence[float] = IMAGENET_MEAN,
                             std: Sequence[float] = IMAGENET_STD, erase_prob: float = 0.25) -> Compose:
    """The DeiT-style per-sample training pipeline of NAC App. C:
    ToFloat -> RandomResizedCrop(image_size) -> RandomHorizontalFlip(0.5) ->
    RandAugment(2, 9, magnitude_std 0.5, fill = mean) -> Normalize(mean, std) -> RandomErasing(0.25).

    ``[C, H, W]`` (uint8 or float in [0, 1]) ``-> [C, *image_size]`` normalised. Batch-level
    Mixup/CutMix and label smoothing are :class:`MixupCutmix`, applied to collated batches.
    """
    return Compose([
        ToFloat(),
        RandomResizedCrop(image_size, scale=scale, ratio=ratio),
        RandomHorizontalFlip(hflip),
        RandAugment(randaug_num_ops, randaug_magnitude, magnitude_std=randaug_magnitude_std, fill=tuple(mean)),
        Normalize(mean, std),
        RandomErasing(erase_prob),
    ])


def eval_transform(image_size: int | Sequence[int], *, crop_pct: float = 1.0,
                   mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> Compose:
    """Deterministic evaluation pipeline: ToFloat -> Resize(shorter side to
    ``image_size / crop_pct``) -> CenterCrop(image_size) -> Normalize(mean, std).

    ``crop_pct=1.0`` (default) resizes straight to ``image_size`` for square inputs;
    DeiT's ImageNet evaluation uses ``crop_pct=0.875``. A non-square ``image_size`` is
    resized to directly (``crop_pct`` unused). ``[C, H, W] -> [C, *image_size]``.
    """
    th, tw = _pair(image_size)
    return Compose([
        ToFloat(),
        Resize(int(math.floor(th / crop_pct))) if th == tw else Resize((th, tw)),
        CenterCrop((th, tw)),
        Normalize(mean, std),
    ])


class AugmentedDataset(Dataset):
    """Apply ``transform`` to the input of each item of ``dataset``.

    Item ``i`` in epoch ``e`` is transformed with a fresh generator seeded by
    ``item_seed(seed, e, i)``, so augmentation is a pure function of ``(seed, epoch,
    index)``: reproducible regardless of worker count, sampler order or restarts. Items
    that are tuples/lists ``(input, target, ...)`` have only ``input`` transformed; other
    items are transformed whole. Call :meth:`set_epoch` before each epoch (with
    ``persistent_workers=True`` the workers keep their own copy, so set it before the
    loader's workers start).
    """

    def __init__(self, dataset: Dataset, transform: Callable[[Tensor, torch.Generator], Tensor], seed: int = 0):
        self.dataset, self.transform, self.seed, self.epoch = dataset, transform, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} items")
        index %= n
        item = self.dataset[index]
        g = item_generator(self.seed, self.epoch, index)
        if isinstance(item, (tuple, list)):
            return (self.transform(item[0], g), *item[1:])
        return self.transform(item, g)
