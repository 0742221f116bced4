"""Checkpoints: a directory per save, swapped in atomically.

``<run>/checkpoints/<tag>`` is a symbolic link to ``<run>/checkpoints/<tag>-<step>/``,
which holds ``model.safetensors`` + ``config.json`` (what ``from_pretrained`` reads),
``ema.safetensors`` when an EMA is kept, and ``state.pt`` (optimizer, scheduler,
step, epoch, RNG states, metrics; tensors and plain containers only, read back with
``torch.load(weights_only=True)``, so no pickled code is ever executed). The
directory is complete before the link is replaced with ``os.replace``: a crash at any
moment leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..models.base import WEIGHTS_FILE


def save_checkpoint(run_dir: str | os.PathLike, tag: str, model, state: dict[str, Any],
                    ema_state: dict[str, torch.Tensor] | None = None) -> Path:
    from safetensors.torch import save_file

    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{tag}-{state['step']:08d}"
    tmp = root / f".{target.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if ema_state is not None:
        save_file({k: v.detach().contiguous().cpu() for k, v in ema_state.items()}, str(tmp / "ema.safetensors"))
    torch.save(state, tmp / "state.pt")
    link = root / tag
    old = link.resolve() if link.is_symlink() else None
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    tmp_link = root / f".{tag}.link"
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    tmp_link.symlink_to(target.name)
    os.replace(tmp_link, link)                       # the atomic switch
    if old is not None and old != target.resolve() and old.exists():
        shutil.rmtree(old, ignore_errors=True)
    return target


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A run directory (→ its best, else last checkpoint) or a checkpoint directory."""
    p = Path(path)
    if (p / WEIGHTS_FILE).is_file():
        return p
    for tag in ("best", "last"):
        if (p / "checkpoints" / tag / WEIGHTS_FILE).is_file():
            return (p / "checkpoints" / tag).resolve()
    raise FileNotFoundError(
        f"no checkpoint at {p}: expected a run directory with checkpoints/best/ or checkpoints/last/, "
        f"or a checkpoint directory holding {WEIGHTS_FILE}, config.json and state.pt")


def load_state(ckpt_dir: str | os.PathLike) -> dict[str, Any]:
    """The training state of a checkpoint, loaded without unpickling code."""
    path = Path(ckpt_dir) / "state.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {ckpt_dir} is not a training checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated file, or a pickle with globals outside the allow-list
        raise ValueError(f"{path} is not a readable modwire training state ({type(e).__name__}: {e})") from None
