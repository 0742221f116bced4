"""Resume trusts the run, not the command line.

A run directory's ``config.yaml`` is written once, when the run starts, and never
rewritten. ``modwire train --resume RUN_DIR`` continues with that config; the config form
(``modwire train CFG --resume``) must agree with it. Any difference is listed key by key
(``old → new``) and refused, unless every differing key is harmless (it changes neither the
model, the data nor the optimizer: :func:`~modwire.training.kinds.harmless_keys`) and named in ``--allow-change``. Allowed
changes are appended to ``RUN_DIR/resumes.jsonl`` (one record per resume: step, time,
changes), and the run's effective config is ``config.yaml`` with those changes applied in
order.

A run also has an identity, ``RUN_DIR/run_id`` (32 hex digits, created with the run), written into each
of its checkpoints (``checkpoint.json`` and ``state.pt``): a resume refuses a ``last`` or ``best``
checkpoint that another run wrote (copied or linked in by hand), which would otherwise continue silently
from foreign weights and counters (:func:`modwire.training.checkpoint.check_checkpoint_owner`; eval,
analyze and finetune check the checkpoint they choose from a run directory too).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from .config import TrainConfig, flat_config, load_config, to_yaml
from .kinds import harmless_keys
from ..errors import UserError
from ..files import append_line, atomic_write_text
from .checkpoint import RUN_ID_NAME

CONFIG_NAME, RESUMES_NAME = "config.yaml", "resumes.jsonl"
IGNORED = ("out_dir",)     # the run directory is the run's identity; it may have been moved


def is_data_root(key: str) -> bool:
    """``data.params.root`` / ``data.params.<name>_root``: a directory the task reads."""
    return key.startswith("data.params.") and (key.endswith(".root") or key.endswith("_root"))


def absolute_roots(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its data roots (:func:`is_data_root`) as absolute paths, resolved against the
    current directory: recorded so, a resume started from another directory reads the same data."""
    import copy

    params = cfg.data.params
    relative = {k: v for k, v in params.items() if is_data_root(f"data.params.{k}") and isinstance(v, str)
                and not Path(v).expanduser().is_absolute()}
    if not relative:
        return cfg
    cfg = copy.deepcopy(cfg)
    for k, v in relative.items():
        cfg.data.params[k] = str(Path(v).expanduser().resolve())
    return cfg


def config_changes(old: TrainConfig, new: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ (data roots compared as absolute paths: a run recorded with a relative
    root equals the same root given absolutely)."""
    a, b = (_roots_resolved(flat_config(c)) for c in (old, new))
    missing = object()
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in IGNORED and a.get(k, missing) != b.get(k, missing)}


def recorded_changes(run_dir: str | os.PathLike) -> list[str]:
    """The allowed changes of earlier resumes, as ``key=value`` overrides in order."""
    path = Path(run_dir) / RESUMES_NAME
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out += [f"{k}={json.dumps(new)}" for k, (_, new) in json.loads(line)["changes"].items()]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{path}, line {n}: not a resume record ({type(e).__name__}: {e})") from None
    return out


def run_config(run_dir: str | os.PathLike, overrides: Iterable[str] = ()) -> TrainConfig:
    """The run's effective config (``config.yaml`` + recorded changes), then ``overrides``."""
    run = Path(run_dir)
    path = run / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"--resume {run}: no {path} (expected a run directory written by modwire train)")
    return load_config(str(path), [*recorded_changes(run), *overrides, f"out_dir={json.dumps(str(run))}"])


def _roots_resolved(flat: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(Path(v).expanduser().resolve()) if is_data_root(k) and isinstance(v, str) else v)
            for k, v in flat.items()}


def saved_config_changes(run_dir: str | os.PathLike, cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, new)}``: where ``cfg`` differs from the run's effective config."""
    return config_changes(run_config(run_dir), cfg)


def check_resume(run_dir: str | os.PathLike, cfg: TrainConfig, allow: Iterable[str] = ()) -> dict[str, tuple]:
    """The allowed differences between the run's config and ``cfg``; anything else is refused."""
    allow, harmless = set(allow), harmless_keys()
    not_harmless = sorted(allow - set(harmless))
    if not_harmless:
        raise UserError(f"--allow-change {','.join(not_harmless)}: only keys that change neither the model, "
                        f"the data nor the optimizer may change on resume: {', '.join(harmless)}")
    changes = saved_config_changes(run_dir, cfg)
    refused = {k: v for k, v in changes.items() if k not in allow}
    if refused:
        listed = "; ".join(f"{k}: {old!r} → {new!r}" for k, (old, new) in refused.items())
        hard = [k for k in refused if k not in harmless]
        soft = [k for k in refused if k in harmless]
        why = (f"{', '.join(hard)} would change the model, data or optimizer of a run already under way: "
               f"start a new run (another out_dir) instead" if hard else "")
        hint = f"allow {', '.join(soft)} with --allow-change {','.join(soft)}" if soft else ""
        raise UserError(f"--resume {run_dir}: the config differs from the run's {CONFIG_NAME}: {listed}. "
                        + ". ".join(s for s in (why, hint) if s))
    return changes


def record_resume(run_dir: str | os.PathLike, step: int, changes: dict[str, tuple]) -> None:
    record = {"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "changes": {k: [old, new] for k, (old, new) in changes.items()}}
    append_line(Path(run_dir) / RESUMES_NAME, json.dumps(record))


def write_config_once(run_dir: str | os.PathLike, cfg: TrainConfig) -> None:
    """Write ``config.yaml`` if the run has none; it is never replaced."""
    path = Path(run_dir) / CONFIG_NAME
    if not path.exists():
        atomic_write_text(path, to_yaml(cfg))


def run_id(run_dir: str | os.PathLike, proposed: str | None = None) -> str:
    """The run's identity (``RUN_DIR/run_id``). Created the first time it is asked for: ``proposed`` (the
    id its checkpoint carries, for a run whose file was lost) or a new one."""
    path = Path(run_dir) / RUN_ID_NAME
    if path.is_file():
        return path.read_text().strip()
    ident = proposed or uuid.uuid4().hex
    atomic_write_text(path, ident + "\n")
    return ident
