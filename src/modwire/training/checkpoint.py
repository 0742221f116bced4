"""Checkpoints: a directory per save, swapped in atomically, checksummed.

``<run>/checkpoints/<tag>`` is a symbolic link to ``<run>/checkpoints/<tag>-<step>/``,
which holds ``model.safetensors`` + ``config.json`` (what ``from_pretrained`` reads),
``ema.safetensors`` when an EMA is kept, ``state.pt`` (optimizer, scheduler, step,
epoch, RNG states, metrics; tensors and plain containers only, read back with
``torch.load(weights_only=True)``, so no pickled code is ever executed),
``checkpoint.json`` (tag, step, epoch, the last validation and the step it was measured
at: readable without loading tensors) and ``manifest.json`` (the sha256 of every other
file, verified before a load).

The directory is complete before the link is replaced with ``os.replace``: a crash at
any moment leaves the previous checkpoint intact. A write that fails (disk full,
read-only directory) removes its temporary directory, keeps the previous checkpoint and
raises :class:`CheckpointWriteError` naming the path and the cause.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from ..manifest import MANIFEST_FILE, verify_manifest, write_manifest
from ..models.base import CONFIG_FILE, WEIGHTS_FILE
from ..errors import UserError
from ..files import follow_umask, is_disk_full, space_note

STATE_FILE, EMA_FILE, SUMMARY_FILE = "state.pt", "ema.safetensors", "checkpoint.json"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the previous one is intact."""


def save_checkpoint(run_dir: str | os.PathLike, tag: str, model, state: dict[str, Any],
                    ema_state: dict[str, torch.Tensor] | None = None, *,
                    summary: dict[str, Any] | None = None) -> Path:
    """Write ``<run>/checkpoints/<tag>-<step>/`` and point ``<tag>`` at it (atomically)."""
    root = Path(run_dir) / "checkpoints"
    link = root / tag
    old = link.resolve() if link.is_symlink() else None
    base = f"{tag}-{state['step']:08d}"
    # Saving the same step again (e.g. SIGINT right after a periodic save) alternates between
    # two names, so the directory the link points to is never touched before the switch.
    target = root / (f"{base}.1" if old is not None and old.name == base else base)
    tmp = root / f".{target.name}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f".{tag}-*.tmp"):   # left by a process killed mid-save (the run is locked)
            shutil.rmtree(stale, ignore_errors=True)
        _write_files(tmp, model, state, ema_state, summary)
        if target.exists():  # a leftover no link points to
            shutil.rmtree(target)
        os.replace(tmp, target)
        _point(root, tag, target.name)               # the atomic switch
    except Exception as e:  # safetensors reports a full disk as its own error type, not an OSError
        shutil.rmtree(tmp, ignore_errors=True)
        full = is_disk_full(e)
        if not (full or isinstance(e, OSError)):
            raise
        kept = f"the previous checkpoint {old} is kept" if old is not None and old.exists() else \
            "no earlier checkpoint exists"
        cause = space_note(target, _bytes(model, state, ema_state)) if full else f"{e.strerror or e} ({e.filename or tmp})"
        error = CheckpointWriteError(f"could not write checkpoint {target}: {cause}; {kept}")
        error.errno = getattr(e, "errno", None) or (errno.ENOSPC if full else None)
        raise error from None
    if old is not None and old != target and old.exists() and not _linked_from_other_tag(root, old, tag):
        shutil.rmtree(old, ignore_errors=True)
    return target


def _bytes(model, state: dict[str, Any], ema_state: dict[str, torch.Tensor] | None) -> int:
    """About the size of a checkpoint: its tensors' bytes."""
    def size(x: Any) -> int:
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, dict):
            return sum(size(v) for v in x.values())
        return sum(size(v) for v in x) if isinstance(x, (list, tuple)) else 0
    return size(model.state_dict()) + size(state) + size(ema_state or {})


def _write_files(d: Path, model, state: dict[str, Any], ema_state: dict[str, torch.Tensor] | None,
                 summary: dict[str, Any] | None) -> None:
    from safetensors.torch import save_file

    from .feedback import dumps

    model.save_pretrained(d)
    names = [WEIGHTS_FILE, CONFIG_FILE, STATE_FILE]
    if summary is not None:
        (d / SUMMARY_FILE).write_text(dumps(summary) + "\n")
        names.append(SUMMARY_FILE)
    if ema_state is not None:
        save_file({k: v.detach().contiguous().cpu() for k, v in ema_state.items()}, str(d / EMA_FILE))
        follow_umask(d / EMA_FILE)
        names.append(EMA_FILE)
    torch.save(state, d / STATE_FILE)
    write_manifest(d, names)


def _point(root: Path, tag: str, name: str) -> None:
    tmp_link = root / f".{tag}.link"
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    tmp_link.symlink_to(name)
    os.replace(tmp_link, root / tag)


def _linked_from_other_tag(root: Path, directory: Path, tag: str) -> bool:
    return any(p.is_symlink() and p.name != tag and p.resolve() == directory for p in root.iterdir())


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A run directory (→ its best, else last checkpoint) or a checkpoint directory."""
    return choose_checkpoint(path)[0]


def checkpoint_step(ckpt: Path) -> int | None:
    """The step a checkpoint directory was saved at (from its name ``<tag>-<step>``)."""
    m = re.search(r"-(\d+)(\.1)?$", ckpt.name)
    return int(m.group(1)) if m else None


def choose_checkpoint(path: str | os.PathLike) -> tuple[Path, str]:
    """``(checkpoint directory, why it was chosen)`` for a run or checkpoint directory.

    A run's ``best`` is scored unless its ``last`` is newer (a run interrupted after its
    best validation, or one whose final steps were never validated): then ``last``."""
    p = Path(path)
    if (p / WEIGHTS_FILE).is_file():
        return p.resolve(), "the checkpoint directory given"
    found = {tag: (p / "checkpoints" / tag).resolve() for tag in ("best", "last")
             if (p / "checkpoints" / tag / WEIGHTS_FILE).is_file()}
    if not found:
        raise FileNotFoundError(
            f"no checkpoint at {p}: expected a run directory with checkpoints/best/ or checkpoints/last/, "
            f"or a checkpoint directory holding {WEIGHTS_FILE}, config.json and state.pt")
    if "best" in found and "last" in found:
        best, last = checkpoint_step(found["best"]) or 0, checkpoint_step(found["last"]) or 0
        if last <= best:
            return found["best"], f"'best' (step {best}) is also the run's latest checkpoint"
        info = _summary(found["last"])
        validated = info.get("val_step")
        if info and not info.get("val_pending") and validated is not None and validated >= last:
            return found["best"], (f"'best' (step {best}) has the run's best validation score; 'last' (step "
                                   f"{last}) was validated and scored lower")
        return found["last"], (f"'last' (step {last}) is newer than 'best' (step {best}) and its latest steps "
                               f"were never validated (an interrupted run)")
    tag = next(iter(found))
    return found[tag], f"the run has only '{tag}'"


def _summary(ckpt: Path) -> dict[str, Any]:
    """``checkpoint.json`` of a checkpoint ({} for checkpoints written before it existed)."""
    import json

    try:
        data = json.loads((ckpt / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_state(ckpt_dir: str | os.PathLike) -> dict[str, Any]:
    """The training state of a checkpoint, verified and loaded without unpickling code."""
    path = Path(ckpt_dir) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {ckpt_dir} is not a training checkpoint")
    verify_manifest(ckpt_dir)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated file, or a pickle with globals outside the allow-list
        raise UserError(f"{path} is not a readable modwire training state ({type(e).__name__}: {e})") from None


def load_weights(module: torch.nn.Module, path: str | os.PathLike) -> None:
    """Load a safetensors file into ``module``; a mismatch is ONE line naming the keys."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path), device=str(next(module.parameters()).device))
    except (SafetensorError, OSError) as e:
        raise UserError(f"{path} is not a readable safetensors file ({e})") from None
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(set(own) & set(state))
              if state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = [f"{label} {_few(keys)}" for label, keys in
                 (("missing", missing), ("unexpected", unexpected), ("shape (saved vs model)", shapes)) if keys]
        differ = _config_differences(Path(path).parent / CONFIG_FILE, getattr(module, "config", None))
        if differ:
            parts.insert(0, f"model config (saved vs model) {_few(differ)}")
        raise UserError(f"checkpoint {path} does not match the model: " + "; ".join(parts))
    module.load_state_dict(state)


def _config_differences(saved_file: Path, config) -> list[str]:
    """``key: saved vs now`` for each model-config field that differs from the checkpoint's
    ``config.json`` (the likely cause of a weight mismatch); [] when either is unavailable."""
    import json

    try:
        saved, now = json.loads(saved_file.read_text()), config.to_dict()
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(saved, dict):
        return []

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    a, b = flat(saved), flat(json.loads(json.dumps(now)))  # lists / tuples compare as JSON
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _few(keys: list[str], n: int = 4) -> str:
    shown = ", ".join(keys[:n])
    return f"[{shown}{f', … ({len(keys)} in all)' if len(keys) > n else ''}]"


__all__ = ["CheckpointWriteError", "MANIFEST_FILE", "checkpoint_step", "choose_checkpoint", "load_state",
           "load_weights", "resolve_checkpoint", "save_checkpoint"]
