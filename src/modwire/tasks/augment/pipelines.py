"""The per-sample pipelines of NAC App. C (DeiT-style training, deterministic evaluation),
AiT App. A.1's lighter ones (``crop_flip_transform`` for CIFAR, ``resized_crop_flip_transform``
for Oxford-IIIT Pet; :data:`TRAIN_PIPELINES` names them for ``data.augment``)
and ``AugmentedDataset``, which seeds each item's generator with
``modwire.seeding.torch_generator(seed, epoch, index)`` so augmentation does not depend on
worker count or iteration order. A user's own transform (``data.augment: "package.module:attribute"``,
:func:`user_transform`) runs inside :class:`SeededGlobalRNG`, so its draws from the global RNGs follow the
same ``(seed, epoch, index)``."""
from __future__ import annotations

import inspect
import math
import random
from typing import Any, Callable, Sequence

import numpy as np

import torch
from torch import Tensor
from torch.utils.data import Dataset

from ...errors import UserError
from ...fields import import_object
from ...seeding import torch_generator
from .rand_augment import DeiTRandAugment, RandAugment
from .random_erasing import RandomErasing
from .transforms import (IMAGENET_MEAN, IMAGENET_STD, CenterCrop, Compose, Normalize, RandomCrop,
                         RandomHorizontalFlip, RandomResizedCrop, Resize, ToFloat, _pair)

__all__ = ["TRAIN_PIPELINES", "AugmentedDataset", "SeededGlobalRNG", "user_transform", "crop_flip_transform", "eval_transform", "rand_augment_transform",
           "resized_crop_flip_transform", "standard_train_transform"]


def standard_train_transform(image_size: int | Sequence[int], *, scale: tuple[float, float] = (0.08, 1.0),
                             ratio: tuple[float, float] = (3 / 4, 4 / 3), hflip: float = 0.5,
                             randaug_num_ops: int = 2, randaug_magnitude: float = 9,
                             randaug_magnitude_std: float = 0.5, randaug_prob: float = 0.5,
                             mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                             erase_prob: float = 0.25) -> Compose:
    """The DeiT-style per-sample training pipeline of NAC App. C (``data.augment: deit``):
    ToFloat -> RandomResizedCrop(image_size) -> RandomHorizontalFlip(0.5) ->
    DeiTRandAugment (DeiT's ``rand-m9-mstd0.5-inc1``: 2 ops, each applied with probability 0.5,
    magnitude 9 of 10, std 0.5, fill = mean) -> Normalize(mean, std) -> RandomErasing(0.25).

    ``[C, H, W]`` (uint8 or float in [0, 1]) ``-> [C, *image_size]`` normalised. Batch-level
    Mixup/CutMix and label smoothing are :class:`MixupCutmix`, applied to collated batches.
    """
    return Compose([
        ToFloat(),
        RandomResizedCrop(image_size, scale=scale, ratio=ratio),
        RandomHorizontalFlip(hflip),
        DeiTRandAugment(randaug_num_ops, randaug_magnitude, magnitude_std=randaug_magnitude_std, prob=randaug_prob,
                        fill=tuple(mean)),
        Normalize(mean, std),
        RandomErasing(erase_prob),
    ])


def rand_augment_transform(*, num_ops: int = 2, magnitude: float = 9, magnitude_std: float = 0.5,
                           fill: float | Sequence[float] = 0.5) -> Compose:
    """RandAugment alone (NI App. C: digit images "augmented with RandAugment", timm's
    implementation): ToFloat -> RandAugment(2, 9, magnitude_std 0.5, fill). No crop, no flip (a
    mirrored digit is another symbol), no normalisation: images stay in [0, 1], as evaluation
    sees them. ``[C, H, W] -> [C, H, W]``. (NI App. C names timm's implementation but not its settings;
    this is torchvision's table, :class:`RandAugment`, magnitude 9 of 30, every op applied: not DeiT's
    ``rand-m9-mstd0.5-inc1``, :class:`DeiTRandAugment`.)"""
    return Compose([ToFloat(), RandAugment(num_ops, magnitude, magnitude_std=magnitude_std, fill=fill)])


def crop_flip_transform(image_size: int | Sequence[int], *, padding: int = 4, hflip: float = 0.5,
                        mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> Compose:
    """AiT App. A.1 for CIFAR-10/100: "random cropping with size 32 × 32 × 3 and a padding size of 4",
    "random horizontal flip and normalization": ToFloat -> RandomCrop(image_size, padding, fill 0) ->
    RandomHorizontalFlip(0.5) -> Normalize(mean, std). The paper does not give the normalisation's
    statistics: ImageNet's, as every 3-channel pipeline here. ``[C, H, W] -> [C, *image_size]``."""
    return Compose([ToFloat(), RandomCrop(image_size, padding), RandomHorizontalFlip(hflip), Normalize(mean, std)])


def resized_crop_flip_transform(image_size: int | Sequence[int], *, scale: tuple[float, float] = (0.08, 1.0),
                                ratio: tuple[float, float] = (3 / 4, 4 / 3), hflip: float = 0.5,
                                mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> Compose:
    """AiT App. A.1 for Oxford-IIIT Pet: "random resized cropping", "random horizontal flip and
    normalization": ToFloat -> RandomResizedCrop(image_size, scale, ratio) -> RandomHorizontalFlip(0.5)
    -> Normalize(mean, std); no RandAugment, erasing or mixing (unlike :func:`standard_train_transform`).
    The crop's output is the model's input size (224 for Pet; the paper's "256 × 256" crop cannot
    also be a 224 input: see :mod:`modwire.tasks.loaders.pets`). ``[C, H, W] -> [C, *image_size]``."""
    return Compose([ToFloat(), RandomResizedCrop(image_size, scale=scale, ratio=ratio), RandomHorizontalFlip(hflip),
                    Normalize(mean, std)])


# ``data.augment`` values whose training pipeline is ``make(image_size, mean=..., std=...)`` and whose
# evaluation pipeline is :func:`eval_transform` (same normalisation): AiT App. A.1.
TRAIN_PIPELINES = {"crop_flip": crop_flip_transform, "resized_crop_flip": resized_crop_flip_transform}


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
    ``modwire.seeding.derive_seed(seed, e, i)``, so augmentation is a pure function of ``(seed, epoch,
    index)``: reproducible regardless of worker count, sampler order or restarts. Items
    that are tuples/lists ``(input, target, ...)`` have only ``input`` transformed; other
    items are transformed whole. A dict input (a multi-input task, e.g. ``{"x": image,
    "task": dataset id}``) has only its entry ``key`` transformed; the others pass through. Call :meth:`set_epoch` before each epoch (with
    ``persistent_workers=True`` the workers keep their own copy, so set it before the
    loader's workers start).
    """

    def __init__(self, dataset: Dataset, transform: Callable[[Tensor, torch.Generator], Tensor], seed: int = 0,
                 *, key: str = "x"):
        self.dataset, self.transform, self.seed, self.epoch, self.key = dataset, transform, int(seed), 0, key

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
        g = torch_generator(self.seed, self.epoch, index)
        if isinstance(item, (tuple, list)):
            return (self._apply(item[0], g), *item[1:])
        return self._apply(item, g)

    def _apply(self, x, g: torch.Generator):
        if isinstance(x, dict):
            return {**x, self.key: self.transform(x[self.key], g)}
        return self.transform(x, g)

    @property
    def classes(self) -> list[str]:
        """The class names of the dataset under it (as torchvision's ``dataset.classes``)."""
        return self.dataset.classes


class SeededGlobalRNG:
    """A one-argument transform ``fn(img)`` (a torchvision v2 or timm pipeline, a user's function)
    called as modwire's ``transform(img, generator)``: for the call, the global RNGs that such
    transforms draw from (torch's CPU RNG, Python's ``random``, NumPy's legacy ``np.random``) are
    seeded from ``generator`` and restored after it. Inside :class:`AugmentedDataset` its output is then
    a function of ``(seed, epoch, index)``, as modwire's own transforms' are (an exact resume gives the
    same run), and the global RNGs of the process are left as they were. Draws from any other source
    (an RNG object the transform keeps, the CUDA RNG, the clock) are not seeded: those stay random."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, img: Any, generator: torch.Generator | None = None) -> Any:
        if generator is None:
            return self.fn(img)
        seed = int(torch.randint(0, 2**62, (), generator=generator))
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)      # the CPU generator only (torch.manual_seed: ~0.7 ms)
            random.seed(seed)
            np.random.seed(seed % 2**32)
            try:
                return self.fn(img)
            finally:
                random.setstate(py_state)
                np.random.set_state(np_state)

    def __repr__(self) -> str:
        return f"SeededGlobalRNG({self.fn!r})"


def user_transform(path: str, image_size: tuple[int, int], channels: int, where: str = "config key 'data.augment'"
                   ) -> tuple[SeededGlobalRNG, SeededGlobalRNG | None]:
    """The ``(train, eval)`` per-sample transforms that an import path ``"package.module:attribute"``
    names, each as :class:`SeededGlobalRNG` (``eval`` None: evaluation sees the dataset's images as they
    are). A function or class there is a factory, called once here as ``factory(image_size=(H, W),
    channels=C)`` (the task's image), returning the training transform or a pair ``(train, eval)``
    (e.g. when it normalises, evaluation must too); any other callable (e.g. a module-level
    ``v2.Compose([...])``) is the training transform itself. A transform is called as ``t(img)`` on the
    dataset's image, a float tensor ``[C, H, W]`` in [0, 1], and returns what the model takes: a float
    tensor ``[C, H, W]`` of the task's size."""
    obj = import_object(path, where)
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
        return SeededGlobalRNG(obj), None
    try:
        made = obj(image_size=tuple(image_size), channels=int(channels))
    except TypeError as exc:
        raise UserError(f"{where}: {path!r} names a {'class' if inspect.isclass(obj) else 'function'}, which is "
                        f"called as a factory, {path.split(':')[1]}(image_size={tuple(image_size)}, "
                        f"channels={channels}), and it raised TypeError: {exc}; point it at a function that takes "
                        f"those keywords and returns the transform, or at a transform object") from None
    pair = tuple(made) if isinstance(made, (tuple, list)) else (made, None)
    if len(pair) != 2 or not callable(pair[0]) or not (pair[1] is None or callable(pair[1])):
        raise UserError(f"{where}: the factory {path!r} returned {type(made).__name__} {made!r:.80}, expected a "
                        f"transform t(img) or a pair (train transform, eval transform)")
    return SeededGlobalRNG(pair[0]), (SeededGlobalRNG(pair[1]) if pair[1] is not None else None)
