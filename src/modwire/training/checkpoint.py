"""Checkpoints: a directory per save, swapped in atomically, checksummed.

``<run>/checkpoints/<tag>`` is a symbolic link to ``<run>/checkpoints/<tag>-<step>/``,
which holds ``model.safetensors`` + ``config.json`` (what ``from_pretrained`` reads: **the weights
validation scored**, the EMA's when one is kept), ``live.safetensors`` when an EMA is kept (the
weights the optimizer trains, which a resume continues; the EMA's files and their readers:
:mod:`modwire.training.ema`), ``state.pt`` (optimizer, scheduler, step,
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
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from ..manifest import MANIFEST_FILE, verify_manifest, write_manifest
from ..models.base import CONFIG_FILE, WEIGHTS_FILE, PretrainedModel
from ..errors import UserError
from ..files import WriteError, follow_umask, is_disk_full, space_note

STATE_FILE, SUMMARY_FILE = "state.pt", "checkpoint.json"
RUN_ID_NAME = "run_id"     # RUN_DIR/run_id: the run's identity, carried by each of its checkpoints


class CheckpointWriteError(WriteError):
    """A checkpoint could not be written; the previous one is intact."""


def save_checkpoint(run_dir: str | os.PathLike, tag: str, model, state: dict[str, Any],
                    extra_weights: dict[str, dict[str, torch.Tensor]] | None = None, *,
                    summary: dict[str, Any] | None = None) -> Path:
    """Write ``<run>/checkpoints/<tag>-<step>/`` and point ``<tag>`` at it (atomically). ``model``: the
    weights validation scored (the EMA model when one is kept: ``training/ema.py``); ``extra_weights``:
    more safetensors files by name (the EMA's ``live.safetensors``: the trained weights)."""
    root = Path(run_dir) / "checkpoints"
    link = root / tag
    old = link.resolve() if link.is_symlink() else None
    base = f"{tag}-{state['step']:08d}"
    # Saving the same step again (e.g. SIGINT right after a periodic save) alternates between
    # two names, so the directory the link points to is never touched before the switch.
    target = root / (f"{base}.1" if old is not None and old.name == base else base)
    tmp = root / f".{target.name}.tmp"
    state_bytes = io.BytesIO()   # torch.save on a full disk fails as "unexpected pos": serialised here, the
    torch.save(state, state_bytes)   # bytes are written with open(), whose failure is an OSError (ENOSPC)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f".{tag}-*.tmp"):   # left by a process killed mid-save (the run is locked)
            shutil.rmtree(stale, ignore_errors=True)
        _write_files(tmp, model, state_bytes, extra_weights or {}, summary)
        if target.exists():  # a leftover no link points to
            shutil.rmtree(target)
        os.replace(tmp, target)
        _point(root, tag, target.name)               # the atomic switch
    except Exception as e:  # safetensors reports a full disk as its own error type, not an OSError
        shutil.rmtree(tmp, ignore_errors=True)
        full = is_disk_full(e)
        if not (full or isinstance(e, OSError)):
            raise
        kept = _kept(root)
        needed = state_bytes.getbuffer().nbytes + _bytes(model.state_dict()) + \
            sum(_bytes(w) for w in (extra_weights or {}).values())
        cause = space_note(target, needed) if full else f"{e.strerror or e} ({e.filename or tmp})"
        error = CheckpointWriteError(f"could not write checkpoint {target}: {cause}; {kept}")
        error.errno = getattr(e, "errno", None) or (errno.ENOSPC if full else None)
        raise error from None
    if old is not None and old != target and old.exists() and not _linked_from_other_tag(root, old, tag):
        shutil.rmtree(old, ignore_errors=True)
    return target


def _kept(root: Path) -> str:
    """What a failed save leaves: ``the checkpoints 'last' (step 8, ...), 'best' (...) are kept``."""
    tags = [(p.name, p.resolve()) for p in sorted(root.iterdir()) if p.is_symlink() and p.resolve().is_dir()] \
        if root.is_dir() else []
    if not tags:
        return "no earlier checkpoint exists"
    listed = ", ".join(f"{tag!r} (step {checkpoint_step(d)}, {d})" for tag, d in tags)
    return f"the run's checkpoint{'s' if len(tags) > 1 else ''} {listed} {'are' if len(tags) > 1 else 'is'} kept"


def _bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _write_files(d: Path, model, state: io.BytesIO, extra_weights: dict[str, dict[str, torch.Tensor]],
                 summary: dict[str, Any] | None) -> None:
    from safetensors.torch import save_file

    from .feedback import dumps

    model.save_pretrained(d)
    names = [WEIGHTS_FILE, CONFIG_FILE, STATE_FILE]
    if summary is not None:
        (d / SUMMARY_FILE).write_text(dumps(summary) + "\n")
        names.append(SUMMARY_FILE)
    for name, weights in extra_weights.items():
        save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(d / name))
        follow_umask(d / name)
        names.append(name)
    with open(d / STATE_FILE, "wb") as f:
        f.write(state.getbuffer())
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
    best validation, or one whose final steps were never validated): then ``last``. A run's checkpoint
    that another run wrote (copied or linked in by hand) is refused, naming both run ids."""
    ckpt, why = _choose(Path(path))
    if not (Path(path) / WEIGHTS_FILE).is_file():        # chosen from a run directory: it must be the run's
        check_checkpoint_owner(path, ckpt, doing=f"run {path}")
    return ckpt, why


def _choose(p: Path) -> tuple[Path, str]:
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


def checkpoint_run_id(ckpt: str | os.PathLike) -> str | None:
    """The run id a checkpoint carries (its ``checkpoint.json``); None for one written before run ids."""
    summary = Path(ckpt) / "checkpoint.json"
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):       # none (before run ids), or damaged: the manifest check names it
        return None
    return data.get("run_id") if isinstance(data, dict) else None


def check_checkpoint_owner(run_dir: str | os.PathLike, ckpt: str | os.PathLike, doing: str | None = None) -> str | None:
    """Refuse a checkpoint of ``run_dir`` that another run wrote (copied or linked in by hand): a resume
    from it, or eval / analyze / finetune scoring it as this run's. Returns the checkpoint's run id.
    Checkpoints and runs from before run ids (none recorded) are not checked. ``doing``: the error's
    prefix (default ``--resume RUN_DIR``)."""
    path, ckpt = Path(run_dir) / RUN_ID_NAME, Path(ckpt)
    theirs = checkpoint_run_id(ckpt)
    mine = path.read_text().strip() if path.is_file() else None
    if theirs is not None and mine is not None and theirs != mine:
        raise UserError(f"{doing or f'--resume {run_dir}'}: checkpoint {ckpt.resolve()} was written by another run "
                        f"(run id {theirs}; this run's is {mine}, in {path}): it was copied or linked in by hand. "
                        f"Point {ckpt} back at one of this run's own checkpoints, or start a new run from those "
                        f"weights with --set finetune.init={ckpt.resolve()}")
    return theirs


def _summary(ckpt: Path) -> dict[str, Any]:
    """``checkpoint.json`` of a checkpoint ({} for checkpoints written before it existed)."""
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
    if isinstance(module, PretrainedModel):   # a model's renames of older keys, optional parts (models/base.py)
        module.prepare_state_dict(state)
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


__all__ = ["CheckpointWriteError", "MANIFEST_FILE", "RUN_ID_NAME", "check_checkpoint_owner", "checkpoint_run_id",
           "checkpoint_step", "choose_checkpoint", "load_state", "load_weights", "resolve_checkpoint",
           "save_checkpoint"]
