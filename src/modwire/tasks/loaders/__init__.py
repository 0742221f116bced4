"""Loaders for official on-disk dataset formats. Each module registers its tasks on import.

Every loader but ``digits`` (whose data ships with scikit-learn) needs ``root=`` (nothing
is downloaded; ``fashion_mnist`` defaults to where Debian installs it, :func:`system_dataset`)
and raises ``FileNotFoundError`` / ``ValueError`` showing the expected layout when the data is missing or malformed.

- :mod:`.images`: ``tiny_imagenet``, ``tiny_imagenet_r`` (float [3, 64, 64] in [0, 1])
- :mod:`.image_folder`: ``image_folder`` (any ``train/<class>/`` + ``val|test/<class>/`` image
  folders, e.g. CIFAR-10 as PNGs; resized to ``image_size``, RGB or grayscale)
- :mod:`.cifar`: ``cifar10``, ``cifar100`` (pickles read by a restricted unpickler)
- :mod:`.pets`: ``oxford_pet`` (``images/*.jpg`` + ``annotations/trainval.txt|test.txt``; [3, 224, 224]
  RGB, stretched to ``image_size``; AiT App. A.1)
- :mod:`.mnist`: ``mnist``, ``fashion_mnist`` (idx files; [1, 32, 32], zero-padded; or
  ``upsample_to=32, channels=3``: 32×32 RGB as NI App. C.1)
- :mod:`.kmnist`: ``kmnist`` (official ``kmnist-*.npz`` or idx files; as ``mnist``)
- :mod:`.svhn`: ``svhn`` (official ``*_32x32.mat``; [3, 32, 32])
- :mod:`.mnistm`: ``mnist_m`` (the authors' image folders + label lists; [3, 32, 32])
- :mod:`.digits_multitask`: ``digits_multitask`` (NI §4.2: SVHN + MNIST-M + MNIST,
  ``{"x": [3, 32, 32], "task": dataset id}``, 3 heads)
- :mod:`.digits`: ``digits`` (scikit-learn's 8×8 digits, shipped with scikit-learn: no ``root``; [1, 32, 32])
- :mod:`.text`: ``imdb_bytes``, ``lra_listops`` (1-D id sequences, padded by ``collate``)
- :mod:`.wikitext`: ``wikitext2`` (word-level language modelling: next-token chunks ``[seq_len]``,
  targets ``[seq_len]``; vocabulary from the train file)
- :mod:`.pointclouds`: ``modelnet40`` (OFF meshes or resampled text; [N, 3])
- :mod:`.pgm`: ``pgm`` (PGM .npz; [16, S, S], panels area-downsampled to ``panel_size``, default 80)
- :mod:`.nlvr2`: ``nlvr2_features`` (NLVR2 JSON lines + precomputed token features in
  safetensors / .npz; ``{"x": image tokens, "condition": sentence tokens}`` for a conditional NAC)
"""
from . import (cifar, digits, digits_multitask, image_folder, images, kmnist, mnist, mnistm, nlvr2,  # noqa: F401
               pets, pgm, pointclouds, svhn, text, wikitext)  # (register the tasks)
from ._common import SYSTEM_DATASETS, SYSTEM_DATASETS_ENV, system_dataset  # noqa: F401
