"""Helpers shared by the loaders: locating ``root``, errors that show the expected layout.

Every loader takes ``root`` (no default download location: nothing is ever
downloaded). A missing or malformed dataset raises ``FileNotFoundError`` or
``ValueError`` whose message holds the expected directory layout as a small tree and
what was actually found.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..base import pad_collate  # noqa: F401  (re-exported for the loaders)


def found_listing(path: Path | None, limit: int = 12) -> str:
    """A short description of what is at ``path`` (for error messages)."""
    if path is None:
        return "no root given"
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is a file, not a directory"
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:  # pragma: no cover - permissions
        return f"{path} cannot be listed ({exc})"
    if not entries:
        return f"{path} is empty"
    names = [e.name + ("/" if e.is_dir() else "") for e in entries[:limit]]
    more = f" ... ({len(entries) - limit} more)" if len(entries) > limit else ""
    return f"{path} contains: {', '.join(names)}{more}"


def layout_message(task: str, problem: str, layout: str, found: str) -> str:
    return (f"{task}: {problem}\n"
            f"Expected layout (nothing is downloaded; get the dataset yourself and pass root=...):\n"
            f"{layout.rstrip()}\n"
            f"Found: {found}")


class LayoutError(FileNotFoundError):
    """A dataset directory or file is missing (message shows the expected layout)."""


class FormatError(ValueError):
    """A dataset file exists but is malformed (message shows the expected format)."""


def missing(task: str, problem: str, layout: str, where: Path | None) -> LayoutError:
    return LayoutError(layout_message(task, problem, layout, found_listing(where)))


def malformed(task: str, path: Path | str, problem: str, layout: str) -> FormatError:
    try:
        found = f"{path} ({os.path.getsize(path)} bytes)"
    except OSError:
        found = str(path)
    return FormatError(layout_message(task, f"malformed file {path}: {problem}", layout, found))


def require_root(task: str, root: Any, layout: str) -> Path:
    """``root`` as an existing directory, or an error that explains the expected layout."""
    if root is None:
        raise ValueError(layout_message(
            task, "the parameter root=... is required: the directory that holds the dataset",
            layout, "root=None"))
    path = Path(os.path.expanduser(str(root)))
    if not path.is_dir():
        raise missing(task, f"root {str(path)!r} is not a directory", layout, path)
    return path


def first_dir(*candidates: Path) -> Path | None:
    return next((c for c in candidates if c.is_dir()), None)


def check_transform(transform: Any) -> Callable[[Tensor], Tensor] | None:
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be a callable on the input tensor or None, got {type(transform).__name__}")
    return transform


class LoaderDataset(Dataset):
    """Base of the loaders' datasets: ``len``, an optional ``transform`` on the input."""

    def __init__(self, transform: Callable[[Tensor], Tensor] | None = None) -> None:
        self.transform = check_transform(transform)

    def _out(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return (self.transform(x) if self.transform is not None else x), y
