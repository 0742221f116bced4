"""Loaders for official on-disk dataset formats. Each module registers its tasks on import.

Every loader but ``digits`` (whose data ships with scikit-learn) needs ``root=`` (nothing
is downloaded) and raises ``FileNotFoundError`` /
``ValueError`` showing the expected layout when the data is missing or malformed.

- :mod:`.images`: ``tiny_imagenet``, ``tiny_imagenet_r`` (float [3, 64, 64] in [0, 1])
- :mod:`.image_folder`: ``image_folder`` (any ``train/<class>/`` + ``val|test/<class>/`` image
  folders, e.g. CIFAR-10 as PNGs; resized to ``image_size``, RGB or grayscale)
- :mod:`.cifar`: ``cifar10``, ``cifar100`` (pickles read by a restricted unpickler)
- :mod:`.mnist`: ``mnist``, ``fashion_mnist`` (idx files; [1, 32, 32], zero-padded)
- :mod:`.digits`: ``digits`` (scikit-learn's 8×8 digits, shipped with scikit-learn: no ``root``; [1, 32, 32])
- :mod:`.text`: ``imdb_bytes``, ``lra_listops`` (1-D id sequences, padded by ``collate``)
- :mod:`.pointclouds`: ``modelnet40`` (OFF meshes or resampled text; [N, 3])
- :mod:`.pgm`: ``pgm`` (PGM .npz; [16, 160, 160])
- :mod:`.nlvr2`: ``nlvr2_features`` (NLVR2 JSON lines + precomputed token features in
  safetensors / .npz; ``{"x": image tokens, "condition": sentence tokens}`` for a conditional NAC)
"""
from . import cifar, digits, image_folder, images, mnist, nlvr2, pgm, pointclouds, text  # noqa: F401  (register the tasks)
