"""Base transforms: the ``Transform`` protocol, ``Compose``, crops, flips, resize, normalise,
and the explicit-generator random helpers every augmentation file uses.

Conventions (the whole ``modwire.tasks.augment`` package)
--------------------------------------------------------
* Images are float tensors ``[C, H, W]`` with values in ``[0, 1]`` (``ToFloat`` turns
  ``uint8`` images into that form); after ``Normalize`` they are standardised.
* Randomness comes only from a CPU ``torch.Generator`` passed to every call
  (``transform(img, generator)``); the global RNG is never touched, so an output is a
  pure function of the input and the generator's state. Called without one (``transform(img)``,
  a DataLoader's one-argument ``transform=``), a random transform draws from torch's default
  (global) generator, seeded by ``torch.manual_seed``, as torchvision's transforms do.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import UserError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Fill = float | Sequence[float]

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "CenterCrop", "Compose", "Normalize", "RandomCrop", "RandomHorizontalFlip",
           "RandomResizedCrop", "Resize", "ToFloat", "Transform"]


# ----------------------------------------------------------------------------- randomness

def _need(generator: torch.Generator | None) -> torch.Generator:
    """``generator``; called without one (``t(img)``, as a DataLoader's one-argument ``transform=``
    calls it), torch's default generator, as torchvision's transforms draw: ``torch.manual_seed(s)``
    makes the draws reproducible and each DataLoader worker (seeded ``base_seed + worker_id``) draws
    its own. ``modwire train`` never gets here: :class:`~modwire.tasks.augment.AugmentedDataset` passes
    each item its own ``(seed, epoch, index)`` generator, and the global RNG is untouched."""
    return torch.default_generator if generator is None else generator


def _uniform(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * torch.rand((), generator=g).item()


def _randint(g: torch.Generator, lo: int, hi: int) -> int:
    """Uniform integer in ``[lo, hi)``."""
    return int(torch.randint(lo, hi, (), generator=g).item())




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
        raise UserError(f"{who} expects a float image [C, H, W], got dtype {img.dtype} and shape {tuple(img.shape)}")


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
            raise UserError(f"CenterCrop{(th, tw)} is larger than the image {(h, w)}")
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
            raise UserError(f"scale and ratio must be (min, max), got {scale} and {ratio}")
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
        top, left, h, w = self.get_params(img.shape[-2], img.shape[-1], _need(generator))
        return _resize(img[..., top:top + h, left:left + w], self.size)


class RandomCrop(Transform):
    """Pad every side by ``padding`` pixels of value ``fill`` (0: black), then crop a ``size`` window
    at a uniform position (the CIFAR recipe; AiT App. A.1: "random cropping with size 32 × 32 × 3
    and a padding size of 4"). ``[C, H, W] -> [C, size_h, size_w]``: the image shifted by up to
    ``padding`` pixels along each axis, the uncovered border filled."""

    def __init__(self, size: int | Sequence[int], padding: int = 0, fill: float = 0.0):
        if padding < 0:
            raise UserError(f"RandomCrop: padding must be >= 0, got {padding}")
        self.size, self.padding, self.fill = _pair(size), int(padding), float(fill)

    def get_params(self, height: int, width: int, generator: torch.Generator) -> tuple[int, int]:
        """``(top, left)`` of the window in the padded ``(height + 2p) × (width + 2p)`` image."""
        th, tw = self.size
        h, w = height + 2 * self.padding, width + 2 * self.padding
        if th > h or tw > w:
            raise UserError(f"RandomCrop{self.size} is larger than the padded image {(h, w)}")
        return _randint(generator, 0, h - th + 1), _randint(generator, 0, w - tw + 1)

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        _check_image(img, "RandomCrop")
        top, left = self.get_params(img.shape[-2], img.shape[-1], _need(generator))
        p = self.padding
        padded = F.pad(img, (p, p, p, p), value=self.fill) if p else img
        return padded[..., top:top + self.size[0], left:left + self.size[1]]


class RandomHorizontalFlip(Transform):
    """With probability ``p``, mirror the image left-right (``img.flip(-1)``)."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, img: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if torch.rand((), generator=_need(generator)).item() < self.p:
            return img.flip(-1)
        return img


def _fill_tensor(fill: Fill, img: Tensor) -> Tensor:
    f = torch.as_tensor(fill, dtype=img.dtype, device=img.device).reshape(-1)
    if f.numel() not in (1, img.shape[0]):
        raise UserError(f"fill has {f.numel()} values for an image with {img.shape[0]} channels")
    return f.expand(img.shape[0])[:, None, None]

