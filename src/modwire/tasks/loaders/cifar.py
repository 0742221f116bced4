"""CIFAR-10 / CIFAR-100 from the official "python version" pickle batches.

The batches are pickles, which can run arbitrary code when loaded. They are read with
:class:`SafeUnpickler`, which resolves only an explicit allow-list of globals
(harmless builtin types and numpy's array/dtype reconstruction) and refuses anything
else with an ``UnpicklingError`` naming the refused object. Inputs are float
``[3, 32, 32]`` in [0, 1] (not normalised; pass ``transform=``).
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import LoaderDataset, first_dir, first_existing, malformed, missing, not_binary, require_root

CIFAR10_LAYOUT = """\
<root>/                      (the folder cifar-10-batches-py/, or its parent)
  data_batch_1 ... data_batch_5   train pickles: {b'data': uint8 [10000, 3072], b'labels': [int]}
  test_batch                      test pickle, same keys"""

CIFAR100_LAYOUT = """\
<root>/                      (the folder cifar-100-python/, or its parent)
  train                      pickle: {b'data': uint8 [50000, 3072], b'fine_labels': [int], ...}
  test                       pickle: {b'data': uint8 [10000, 3072], b'fine_labels': [int], ...}
  meta                       pickle: {b'fine_label_names': [100 names], ...} (optional: the classes' names)"""


def _codecs_encode(text: str, encoding: str = "utf-8") -> bytes:
    # Python 3 pickles bytes under protocols < 3 as _codecs.encode(str, 'latin1').
    if encoding.replace("_", "-").lower() not in ("latin1", "latin-1", "iso-8859-1", "utf-8", "utf8"):
        raise pickle.UnpicklingError(f"refused _codecs.encode with encoding {encoding!r}")
    return text.encode(encoding)


def _numpy_globals() -> dict[tuple[str, str], Any]:
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    allowed: dict[tuple[str, str], Any] = {}
    for pkg in ("numpy.core", "numpy._core"):  # pickles name whichever numpy wrote them
        allowed[(f"{pkg}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{pkg}.multiarray", "scalar")] = multiarray.scalar
        allowed[(f"{pkg}.numeric", "_frombuffer")] = numeric._frombuffer
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    return allowed


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that resolves only allow-listed globals; everything else is refused."""

    _BUILTINS = {"dict": dict, "list": list, "tuple": tuple, "set": set, "frozenset": frozenset,
                 "bytes": bytes, "bytearray": bytearray, "str": str, "int": int, "float": float,
                 "bool": bool, "complex": complex}

    def __init__(self, file: io.BufferedIOBase, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._allowed = _numpy_globals()
        for mod in ("builtins", "__builtin__"):
            self._allowed.update({(mod, k): v for k, v in self._BUILTINS.items()})
        self._allowed[("_codecs", "encode")] = _codecs_encode

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refused to load global {module}.{name}: the pickle may only use dict/list/bytes/str/int "
                f"and numpy array reconstruction (it is not a plain CIFAR batch)") from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id: not a plain CIFAR batch")


def safe_load_pickle(path: Path) -> Any:
    """Unpickle ``path`` (Python 2 CIFAR batches: ``encoding="bytes"``) with :class:`SafeUnpickler`."""
    with open(path, "rb") as f:
        return SafeUnpickler(f, encoding="bytes").load()


def _get(d: dict, key: str) -> Any:
    for k in (key.encode(), key):
        if k in d:
            return d[k]
    raise KeyError(key)              # read_batch turns it into a FormatError naming the file


def read_batch(path: Path, label_key: str, task: str, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N, 3, 32, 32], labels int64 [N])`` of one batch file."""
    if not path.is_file():
        raise missing(task, f"batch file {path.name} not found", layout, path.parent)
    try:
        d = safe_load_pickle(path)
    except pickle.UnpicklingError as exc:
        refused = str(exc).startswith("refused")  # a forbidden global: say which, whatever the protocol
        raise malformed(task, path, (not refused and not_binary(path, "a CIFAR pickle batch")) or str(exc),
                        layout) from None
    except (EOFError, ValueError, TypeError, IndexError, AttributeError, KeyError) as exc:
        problem = not_binary(path, "a CIFAR pickle batch")  # checked after a failure: protocol-0 pickles are text
        raise malformed(task, path, problem or f"not a readable pickle ({type(exc).__name__}: {exc})",
                        layout) from None
    if not isinstance(d, dict):
        raise malformed(task, path, f"expected a dict, got {type(d).__name__}", layout)
    try:
        data, labels = _get(d, "data"), _get(d, label_key)
    except KeyError as exc:
        keys = [k.decode() if isinstance(k, bytes) else k for k in d]
        raise malformed(task, path, f"no key {exc.args[0]!r} (keys: {keys})", layout) from None
    data, labels = np.asarray(data), np.asarray(labels)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise malformed(task, path, f"'data' must be uint8 [N, 3072], got {data.dtype} {list(data.shape)}", layout)
    if labels.ndim != 1 or labels.shape[0] != data.shape[0] or not np.issubdtype(labels.dtype, np.integer):
        raise malformed(task, path, f"{label_key!r} must be {data.shape[0]} integers, got "
                                    f"{labels.dtype} {list(labels.shape)}", layout)
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


class ArrayImageDataset(LoaderDataset):
    """In-memory uint8 images ``[N, C, H, W]`` → ``(float [C, H, W] in [0, 1], long)``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.images, self.labels = torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(labels)

    @property
    def targets(self) -> Tensor:
        """One class label per item: the declared way (:func:`~modwire.tasks.base.class_targets`)."""
        return self.labels

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self._out(self.images[index].float().div_(255.0), self.labels[index])


def _build(task: str, split: str, root: Any, transform: Callable | None) -> ArrayImageDataset:
    ten = task == "cifar10"
    layout = CIFAR10_LAYOUT if ten else CIFAR100_LAYOUT
    folder_name, label_key, num_classes = (("cifar-10-batches-py", "labels", 10) if ten
                                           else ("cifar-100-python", "fine_labels", 100))
    root_path = require_root(task, root, layout)
    if ten:
        files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    else:
        files = [split]
    found = [first_existing(task, f"batch file {f}", [root_path / folder_name / f, root_path / f], layout,
                            first_dir(root_path / folder_name, root_path)) for f in files]
    parts = [read_batch(f, label_key, task, layout) for f in found]
    path = found[0].parent
    images, labels = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise malformed(task, path, f"labels must lie in [0, {num_classes}), got [{labels.min()}, {labels.max()}]",
                        layout)
    dataset = ArrayImageDataset(images, labels, transform)
    names = None if ten else fine_label_names(path / "meta")
    if names is not None:
        dataset.classes = names
    return dataset


def fine_label_names(path: Path) -> list[str] | None:
    """CIFAR-100's 100 class names from its ``meta`` pickle (``fine_label_names``), or None when the
    file is absent or does not hold them (``build_dataset`` then names the classes by their labels)."""
    if not path.is_file():
        return None
    try:
        d = safe_load_pickle(path)
        names = _get(d, "fine_label_names") if isinstance(d, dict) else None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, AttributeError, KeyError):
        return None
    if not isinstance(names, list) or len(names) != 100:
        return None
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def build_cifar10(split: str, root: Any = None, transform: Callable | None = None) -> ArrayImageDataset:
    """CIFAR-10: ``train`` = data_batch_1..5 (50,000), ``test`` = test_batch (10,000)."""
    return _build("cifar10", split, root, transform)


def build_cifar100(split: str, root: Any = None, transform: Callable | None = None) -> ArrayImageDataset:
    """CIFAR-100 fine labels: ``train`` (50,000), ``test`` (10,000)."""
    return _build("cifar100", split, root, transform)


_INPUTS = InputSpec.image(3, 32, 32)
#: CIFAR-10's classes in label order (the batches' ``batches.meta``)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
register_task(TaskInfo(
    name="cifar10", kind="loader", description="CIFAR-10 from the python pickle batches (safe unpickling)",
    num_classes=10, inputs=_INPUTS, splits=("train", "test"), class_names=CIFAR10_CLASSES,
    params={"root": None, "transform": None},
), build_cifar10)
register_task(TaskInfo(
    name="cifar100", kind="loader", description="CIFAR-100 (fine labels) from the python pickles (safe unpickling)",
    num_classes=100, inputs=_INPUTS, metrics=("top1", "top5"), splits=("train", "test"),
    params={"root": None, "transform": None},
), build_cifar100)
