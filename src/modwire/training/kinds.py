"""Run kinds: how a kind of model trains, and what each command does with its runs. One table.

A **run kind** is one row of :data:`RUN_KINDS`. It declares everything that differs between kinds of
training, so that the trainer, the config check, resume, ``modwire eval`` / ``finetune`` / ``analyze``
ask the table instead of naming a family:

=================  =====================================================================================
``capability``     the model capability (:mod:`modwire.models.capabilities`) whose models train this way;
                   None for the default kind (every model without another kind's capability)
``model_overrides``  the preset's config fitted to the task, validated before the run directory is touched
``build_run``      model, data, optimizers: a :class:`~modwire.training.run.TrainingRun` whose
                   :class:`~modwire.training.run.Program` takes one step and evaluates, and its state
``reads``          the training config keys (dotted prefixes) the kind reads; any other key set away from
                   its default is refused by name when the config is read (``reads_note``: where its
                   settings are instead). None: every key except the ``section`` of another kind
``section``        the config section only this kind reads (``gan``)
``check``          the relations among its own settings
``harmless_keys``  its keys a resume may change (``--allow-change``)
``score``          ``modwire eval RUN`` for its runs (``scores``: what, in words), or None: the task's
                   metrics on a split
``task_outputs``   whether its model has task outputs: fine-tuning, ``--task`` / ``--split`` and the task
                   metrics of ``modwire analyze`` apply
``instead``        what applies to its runs, said when a command refuses one
``label``          its runs' name in messages
=================  =====================================================================================

The rows are registered by the modules that implement them (:func:`register_kind`:
:mod:`modwire.training.supervised`, :mod:`modwire.training.gan`), as presets are by their model
files; ``modwire.training`` imports both. A new way of training is one module and one row.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError

__all__ = ["RUN_KINDS", "RunKind", "check_kind_settings", "harmless_keys", "kind_of_config", "kind_of_model",
           "kind_of_preset", "kind_of_run", "register_kind"]

#: keys any run may change on resume: they change neither the model, the data nor the optimisation
COMMON_HARMLESS_KEYS = ("epochs", "max_steps", "log_every", "loggers", "progress", "checkpoint_every",
                        "data.num_workers", "device", "compile", "grad_checkpointing")


@dataclass(frozen=True)
class RunKind:
    """One row of the run-kind table (module docstring). ``build_run(cfg, dist, run_dir, overrides)``
    returns ``(TrainingRun, TrainState)``; ``score(run_dir, overrides)`` the eval record."""

    name: str
    capability: type | None
    model_overrides: Callable[[Any], dict[str, Any]]
    build_run: Callable[..., tuple[Any, Any]]
    reads: tuple[str, ...] | None = None
    reads_note: str = ""                # said with a refused key: where its settings are instead
    section: str | None = None
    check: Callable[[Any], None] | None = None
    harmless_keys: tuple[str, ...] = ()
    score: Callable[[str | Path, Sequence[str]], dict[str, Any]] | None = None
    scores: str = ""                    # what ``score`` scores, in words
    task_outputs: bool = True
    instead: str = ""
    label: str = ""                     # its runs' name in messages ("a GAN run"); default: ``name``

    @property
    def noun(self) -> str:
        return self.label or self.name

    def claims(self, cls: type) -> bool:
        """Whether a model of class ``cls`` trains this way (the default kind claims what no other does)."""
        return self.capability is not None and issubclass(cls, self.capability)


#: name → kind, in registration order; the default kind (``capability`` None) is ``"supervised"``
RUN_KINDS: dict[str, RunKind] = {}


def register_kind(kind: RunKind) -> RunKind:
    """Add a row to :data:`RUN_KINDS` (once per name; at most one default kind)."""
    if kind.name in RUN_KINDS and RUN_KINDS[kind.name] is not kind:
        raise ValueError(f"run kind {kind.name!r} is registered twice")
    if kind.capability is None and any(k.capability is None and k.name != kind.name for k in RUN_KINDS.values()):
        raise ValueError(f"run kind {kind.name!r}: there is a default kind already")
    RUN_KINDS[kind.name] = kind
    return kind


def _default() -> RunKind:
    return next(k for k in RUN_KINDS.values() if k.capability is None)


def kind_of_model(cls: type) -> RunKind:
    """The kind whose capability model class ``cls`` has, else the default kind."""
    return next((k for k in RUN_KINDS.values() if k.claims(cls)), None) or _default()


def kind_of_preset(name: str) -> RunKind:
    """The kind of preset ``name`` (its model class), the default kind for an unknown name (the
    trainer names the unknown model)."""
    from ..models.registry import get_preset, list_models

    return kind_of_model(get_preset(name)[0]) if name in list_models() else _default()


def kind_of_config(cfg: Any) -> RunKind:
    """The kind a training config runs: its preset's, or the default kind when it fine-tunes
    (``finetune.init``: the architecture is the checkpoint's, trained on a task)."""
    return _default() if cfg.finetune.init else kind_of_preset(cfg.model.name)


def kind_of_run(path: str | Path) -> RunKind:
    """The kind of a run directory or checkpoint (the ``model_type`` of its best, else last,
    checkpoint's ``config.json``); the default kind when it cannot be read (the command that loads it
    then says what is wrong)."""
    from ..models.base import CONFIG_FILE, MODEL_TYPES
    from .checkpoint import resolve_checkpoint

    try:
        data = json.loads((resolve_checkpoint(Path(path)) / CONFIG_FILE).read_text())
    except (OSError, ValueError, UserError):
        return _default()
    cls = MODEL_TYPES.get(data.get("model_type")) if isinstance(data, dict) else None
    return _default() if cls is None else kind_of_model(cls)


def harmless_keys() -> tuple[str, ...]:
    """Keys a resumed run may change with ``--allow-change``: the common ones and each kind's own."""
    return COMMON_HARMLESS_KEYS + tuple(k for kind in RUN_KINDS.values() for k in kind.harmless_keys)


def _covered(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def check_kind_settings(cfg: Any, flat: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Refuse a setting the config's kind does not read (it would be silently ignored), naming the key.
    ``flat`` / ``defaults``: every leaf of the config / of the default config by dotted key."""
    if not RUN_KINDS:
        return
    kind = kind_of_config(cfg)
    others = [k.section for k in RUN_KINDS.values() if k.section and k is not kind]
    changed = {key: value for key, value in flat.items() if key not in defaults or value != defaults[key]}
    changed.update({key: None for key in defaults if key not in flat                 # a default entry removed
                    and not any(k.startswith(key + ".") for k in flat)})             # (not one filled in)
    for key, value in sorted(changed.items()):
        other = next((s for s in others if _covered(key, (s,))), None)
        if other is not None:
            owner = next(k for k in RUN_KINDS.values() if k.section == other)
            raise UserError(f"config key {key!r}: the {other}.* settings apply to {owner.noun} runs only; model "
                            f"{cfg.model.name!r} trains as a {kind.noun} run: remove them")
        if kind.reads is not None and not _covered(key, kind.reads):
            fix = f"leave it at {defaults[key]!r}" if key in defaults else "remove it"
            raise UserError(f"config key {key!r}: got {value!r}, but a {kind.noun} run (model {cfg.model.name!r}) "
                            f"does not read it: {fix}" + (f" ({kind.reads_note})" if kind.reads_note else ""))
    if kind.check is not None:
        kind.check(cfg)
