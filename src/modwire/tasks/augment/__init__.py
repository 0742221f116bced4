"""Image augmentation for ImageNet-style pre-training, in plain PyTorch tensor ops.

NAC App. C trains NACs and PIOs on (Tiny-)ImageNet with "a standard data augmentation
regimen" [DeiT, Touvron et al. 2021]: random resized crop, horizontal flip,
RandAugment (DeiT's ``rand-m9-mstd0.5-inc1``), random erasing (p=0.25), mixup (alpha 0.8) /
cutmix (alpha 1.0) and label smoothing 0.1. This package implements that regimen
without torchvision, one file per idea (as timm's ``timm.data``):

* ``transforms``: the ``Transform`` protocol, ``Compose``, crops, flip, resize, normalise;
* ``rand_augment``: ``DeiTRandAugment`` (timm's, as DeiT runs it), ``RandAugment`` (torchvision's
  table) and the functional ops they draw from;
* ``random_erasing``: ``RandomErasing``;
* ``mixup``: batch-level ``MixupCutmix``, label smoothing, ``soft_target_cross_entropy``;
* ``pipelines``: ``standard_train_transform``, ``eval_transform``, ``rand_augment_transform``
  (NI App. C: RandAugment alone), ``crop_flip_transform`` and ``resized_crop_flip_transform``
  (AiT App. A.1: CIFAR's padded random crop + flip, Pet's random resized crop + flip, each then
  normalised), ``AugmentedDataset``.

Conventions
-----------
* Images are float tensors ``[C, H, W]`` with values in ``[0, 1]`` (``ToFloat`` turns
  ``uint8`` images into that form); after ``Normalize`` they are standardised.
* Randomness comes only from a CPU ``torch.Generator`` passed to every call
  (``transform(img, generator)``); the global RNG is never touched, so an output is a
  pure function of the input and the generator's state. Called with the image alone
  (``transform(img)``: a torchvision-style one-argument ``transform=``), a random transform
  draws from torch's default generator (seeded by ``torch.manual_seed``), as torchvision's do.
* A user's transform (``data.augment: "package.module:attribute"``, ``user_transform``) is
  wrapped in ``SeededGlobalRNG``: its draws from the global RNGs follow the item's generator.
* ``AugmentedDataset`` seeds a fresh generator with ``modwire.seeding.derive_seed(seed,
  epoch, index)`` for every item, so augmentation does not depend on worker count or
  iteration order.
* Batch-level ``MixupCutmix`` mixes each sample with the batch flipped along dim 0
  (timm's ``mode="batch"`` convention) and returns soft targets ``[B, num_classes]``
  for ``soft_target_cross_entropy``.
"""
from .mixup import MixParams, MixupCutmix, smooth_one_hot, soft_target_cross_entropy
from .pipelines import (TRAIN_PIPELINES, AugmentedDataset, SeededGlobalRNG, crop_flip_transform, eval_transform,
                        rand_augment_transform, resized_crop_flip_transform, standard_train_transform, user_transform)
from .rand_augment import (DEIT_RANDAUGMENT_OPS, RANDAUGMENT_OPS, DeiTRandAugment, RandAugment, adjust_brightness,
                           adjust_contrast, adjust_saturation, adjust_sharpness, affine, autocontrast, equalize, invert,
                           posterize, rotate, shear_x, shear_y, solarize, solarize_add, translate_x, translate_y)
from .random_erasing import RandomErasing
from .transforms import (IMAGENET_MEAN, IMAGENET_STD, CenterCrop, Compose, Normalize, RandomCrop, RandomHorizontalFlip,
                         RandomResizedCrop, Resize, ToFloat, Transform)

__all__ = [
    "DEIT_RANDAUGMENT_OPS", "DeiTRandAugment", "invert", "solarize_add",
    "IMAGENET_MEAN", "IMAGENET_STD", "RANDAUGMENT_OPS", "TRAIN_PIPELINES", "AugmentedDataset", "CenterCrop", "Compose",
    "MixParams", "MixupCutmix", "Normalize", "RandAugment", "RandomCrop", "RandomErasing", "RandomHorizontalFlip",
    "RandomResizedCrop", "SeededGlobalRNG", "crop_flip_transform", "user_transform", "resized_crop_flip_transform",
    "Resize", "ToFloat", "Transform", "adjust_brightness", "adjust_contrast", "adjust_saturation",
    "adjust_sharpness", "affine", "autocontrast", "equalize", "eval_transform", "posterize", "rand_augment_transform", "rotate", "shear_x",
    "shear_y", "smooth_one_hot", "soft_target_cross_entropy", "solarize", "standard_train_transform",
    "translate_x", "translate_y",
]
