"""Tiny on-disk fixtures in the official formats, written by tests (nothing is downloaded):
``write_pgm`` (PGM ``.npz``), ``write_svhn`` (SVHN ``.mat``), ``write_mnist`` (idx ``.gz``),
``write_mnist_m`` (MNIST-M folders + label lists), ``write_imdb`` (aclImdb review files). Each returns what
it wrote, to compare with."""
import gzip
import struct
from pathlib import Path

import numpy as np


def write_pgm(root: Path, split: str = "train", n: int = 2, *, regime: str = "neutral", seed: int = 0,
              targets=None) -> list[tuple[np.ndarray, int]]:
    """``n`` files ``root/PGM_<regime>_<split>_<i>.npz`` (random uint8 panels ``[16, 160, 160]``,
    ``target = i % 8`` unless given, a one-hot ``meta_target``); ``[(image, target)]`` in order."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        image = rng.integers(0, 256, (16, 160, 160), dtype=np.uint8)
        target = int(targets[i]) if targets is not None else i % 8
        np.savez(root / f"PGM_{regime}_{split}_{i}.npz", image=image, target=np.int64(target),
                 meta_target=np.eye(12, dtype=np.int64)[i % 12])
        out.append((image, target))
    return out


def write_svhn(root: Path, split: str = "train", n: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``root/<split>_32x32.mat`` as the official files: ``X`` uint8 ``[32, 32, 3, n]``, ``y [n, 1]`` in
    1-10 (10 = the digit 0; item ``i`` has ``y = i % 10 + 1``)."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    y = (np.arange(n) % 10 + 1).reshape(n, 1).astype(np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    savemat(root / f"{split}_32x32.mat", {"X": x, "y": y})
    return x, y


def write_idx(path: Path, arr: np.ndarray) -> None:
    data = struct.pack(">I", 0x0800 | arr.ndim) + b"".join(struct.pack(">I", s) for s in arr.shape) + arr.tobytes()
    path.write_bytes(gzip.compress(data))


def write_mnist(root: Path, n: int = 4, seed: int = 1, *, n_test: int | None = None,
                balanced: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """MNIST-style ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`` (also Fashion-MNIST's, as Debian's
    ``dataset-fashion-mnist`` installs them) with ``n`` (``n_test``) random 28×28 images; labels random
    in 0-9, or ``i % 10`` when ``balanced`` (every class in any 10 consecutive items)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for prefix, size in (("train", n), ("t10k", n if n_test is None else n_test)):
        images = rng.integers(0, 256, (size, 28, 28), dtype=np.uint8)
        labels = (np.arange(size) % 10).astype(np.uint8) if balanced else rng.integers(0, 10, size, dtype=np.uint8)
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)
        out[prefix] = images, labels
    return out


def write_mnist_m(root: Path, n: int = 3, seed: int = 2) -> dict[str, list[np.ndarray]]:
    """``mnist_m_{train,test}/<i:08d>.png`` (28×28 RGB) and ``mnist_m_{split}_labels.txt`` (label ``(i+3) % 10``)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = {}
    for split in ("train", "test"):
        (root / f"mnist_m_{split}").mkdir(parents=True, exist_ok=True)
        lines, images = [], []
        for i in range(n):
            img = rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)
            Image.fromarray(img).save(root / f"mnist_m_{split}" / f"{i:08d}.png")
            lines.append(f"{i:08d}.png {(i + 3) % 10}")
            images.append(img)
        (root / f"mnist_m_{split}_labels.txt").write_text("\n".join(lines) + "\n")
        out[split] = images
    return out


def write_imdb(root: Path, split: str = "train", neg: int = 3, pos: int = 3) -> dict[str, list[bytes]]:
    """``root/<split>/{neg,pos}/<id>_<rating>.txt`` as aclImdb: review ``i`` of a class is ``b"<class> review
    <i>"``; ``{"neg": [texts], "pos": [texts]}`` in id order."""
    out = {}
    for name, count in (("neg", neg), ("pos", pos)):
        folder = root / split / name
        folder.mkdir(parents=True, exist_ok=True)
        out[name] = []
        for i in range(count):
            text = f"{name} review {i}".encode()
            (folder / f"{i}_{2 if name == 'neg' else 9}.txt").write_bytes(text)
            out[name].append(text)
    return out
