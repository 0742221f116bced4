"""Trained runs as ``modwire analyze`` sees them: loading one (:func:`load_run`), its
per-module axis, and evaluating / timing a (sparsified) copy of its model on its data."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..models.capabilities import EvalOptions, ModuleSurgery
from ..tasks.base import FirstN
from .sparsify import module_axis
from ..errors import UserError, UserTypeError

__all__ = ["AnalyzedRun", "evaluate_run", "forward", "load_run", "open_run", "other_analyses", "run_model_class",
           "task_params", "timing_batch"]


def load_run(path: str | os.PathLike, overrides: Sequence[str] = (), task: str | None = None,
             split: str | None = None, weights: str | None = None):
    """A trained run as ``modwire eval`` sees it: ``(cfg, model, info, dataset)``.

    ``path``: a run directory (its ``checkpoints/best``, else ``checkpoints/last``) or a
    checkpoint directory; the run's ``config.yaml`` (next to ``checkpoints/``) gives the
    task, its parameters and the eval transform, with ``overrides`` (``key=value``)
    applied. ``task`` / ``split`` default to the run's task and validation split (another
    task is built with its default parameters and the ``data.params.*`` of ``overrides``). The model is on the CPU, in eval mode;
    the dataset has the run's eval transform applied, cut to the first ``data.max_samples``
    samples when that is set (in the run's config or an override). ``weights``: None, the weights
    validation scored (the EMA's when the run kept one), or ``"live"`` / ``"ema"``
    (:func:`modwire.training.ema.checkpoint_model`)."""
    from ..tasks import build_dataset, describe_task
    from ..training import apply_augmentation, load_config
    from ..training.checkpoint import resolve_checkpoint
    from ..training.ema import check_weights_choice, checkpoint_model

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no run directory or checkpoint at {p}: expected a run directory (with "
                                f"config.yaml and checkpoints/best/ or checkpoints/last/) or a checkpoint directory")
    _check_eval_overrides(overrides)
    check_weights_choice(weights)
    ckpt = resolve_checkpoint(p)
    run_cfg = next((q / "config.yaml" for q in (p, ckpt.parent.parent) if (q / "config.yaml").is_file()), None)
    if run_cfg is None and task is None:  # the defaults' task would be scored silently
        raise FileNotFoundError(f"no config.yaml in {p} or next to its checkpoints/, so the task the model was "
                                f"trained on is unknown: give the task (eval --task NAME, with --set data.params... "
                                f"for its parameters) or point at the run directory")
    cfg = load_config(str(run_cfg) if run_cfg else None, list(overrides))
    task = task or cfg.data.task
    params = task_params(cfg, task, overrides)
    info = describe_task(task, params)  # the class count and inputs of these parameters
    dataset = build_dataset(task, split or cfg.data.val_split, max_samples=cfg.data.max_samples, **params)
    if task == cfg.data.task and (cfg.data.few_shot.shots or cfg.data.few_shot.ways):  # a few-shot run's classes
        from ..training.finetune import few_shot_eval_set

        dataset = few_shot_eval_set(cfg, info, dataset, split or cfg.data.val_split)
    model, _ = checkpoint_model(ckpt, weights)
    apply_eval_options(model, cfg, overrides)
    if task != cfg.data.task:   # another task's data (the run's own fits by construction)
        check_task_fits(model, info)
    _, dataset, _ = apply_augmentation(cfg, info, dataset, dataset)  # the run's eval transform, if any
    return cfg, model.eval(), info, dataset


def task_params(cfg, task: str, overrides: Sequence[str]) -> dict:
    """The parameters of ``task``: the config's ``data.params`` for its own task; for another task its
    defaults plus the ``data.params.*`` given in ``overrides`` (the config's params are another task's)."""
    from ..training import load_config

    if task == cfg.data.task:
        return cfg.data.params
    return load_config(None, [o for o in overrides if o.split("=", 1)[0].startswith("data.params")]).data.params


# input-layer fields a model may set differently from the task's description: a longer
# max_len reads the task's sequences too; the class count is checked on the labels
_MAY_DIFFER = ("max_len", "num_classes")


def check_task_fits(model, info) -> None:
    """The model's input layer reads ``info``'s inputs as the task describes them (same kind,
    sizes, vocabulary, padding id), or a ValueError naming each field that differs: scoring a
    model on another task's data would otherwise fail deep in a tokenizer, or not at all."""
    from ..models.config import ModelConfig

    if type(model.config).input_overrides is ModelConfig.input_overrides:
        return                                      # a model that does not describe its input layer
    expected = model.config.input_overrides(info.inputs, info.num_classes, info.heads)  # ValueError: cannot read them
    differ = [f"{path}: the model has {have!r}, the task needs {want!r}"
              for path, want, have in _leaves(expected, model.config) if have != want]
    if differ:
        raise UserError(f"task {info.name!r} does not fit this run's {model.config.model_type!r} model ("
                        f"{'; '.join(differ)}): score it on a task with the same inputs, or train a model for it")


def _leaves(expected: dict, config, prefix: str = ""):
    """``(key path, wanted value, the config's value)`` for every leaf of ``expected``."""
    for key, want in expected.items():
        if key in _MAY_DIFFER:
            continue
        have = getattr(config, key, None)
        if isinstance(want, dict) and have is not None and not isinstance(have, dict):
            yield from _leaves(want, have, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", want, have


def output_dir(path: str | os.PathLike) -> Path:
    """Create the analysis output directory ``path``; one clear error when it cannot be."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # the path, or a parent of it, is a file
        raise UserError(f"output directory {out}: expected a directory (or a path to create), but it or a "
                        f"parent is a file") from None
    except OSError as e:
        raise UserError(f"output directory {out} cannot be created: {e.strerror or e}") from None
    return out


# What an override may change when a trained run is scored: its data, device and precision, and
# the model's evaluation options (``model.overrides.<field>`` for a field in the model's
# ``eval_options``, e.g. AiT's ``eval_memory_forward``). The model, optimizer and schedule come
# from the checkpoint, so other keys would be ignored.
_EVAL_KEYS = ("data.", "device", "precision", "model.overrides.")


def _check_eval_overrides(overrides: Sequence[str]) -> None:
    for item in overrides:
        key = _key(item)
        if not any(key == k or (k.endswith(".") and key.startswith(k)) for k in _EVAL_KEYS):
            raise UserError(f"override {item!r}: scoring a trained run takes only data.*, device, precision and "
                            f"model.overrides.<evaluation option> overrides, got {key!r} (the model and its "
                            f"training settings come from the checkpoint)")


def _key(item: str) -> str:
    return item.split("=", 1)[0].removesuffix(":").strip()


def apply_eval_options(model, cfg, overrides: Sequence[str]) -> None:
    """``model.overrides.<field>=value`` overrides: evaluation options of the loaded model
    (``model.eval_options``; e.g. AiT Tables 7-8's evaluation without the memory forward)."""
    fields = [_key(o).removeprefix("model.overrides.") for o in overrides if _key(o).startswith("model.overrides.")]
    allowed = model.eval_options if isinstance(model, EvalOptions) else ()
    bad = [f for f in fields if f not in allowed]
    if bad:
        raise UserError(f"override model.overrides.{bad[0]}: a trained {model.config.model_type!r} model takes only "
                        f"its evaluation options as model overrides ({list(allowed) or 'none'}); the rest of "
                        f"the model comes from the checkpoint")
    if fields:
        model.set_eval_options(**{f: cfg.model.overrides[f] for f in fields})


@dataclass
class AnalyzedRun:
    """One loaded run. ``kind``: the model's ``model_type``; ``num_modules``: ``U`` of its
    per-module axis (NAC processor modules, Perceiver IO latents; ``noun`` says which);
    ``has_graph``: link probabilities ``P`` over that axis exist (a NAC with a kernel)."""

    path: Path
    name: str
    cfg: Any
    model: torch.nn.Module
    info: Any
    dataset: Any
    kind: str
    num_modules: int
    has_graph: bool
    noun: str = "modules"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.cfg.model.name})"


def other_analyses(model: torch.nn.Module) -> str:
    """What a model without module surgery can be analysed with: the analyses of
    :data:`~modwire.analysis.catalog.ANALYSES` its declared capabilities give it, its evaluation
    options, ``modwire eval``."""
    from .catalog import applicable

    found = ["modwire analyze RUN (without --baseline, --drop, --edges): the task's metrics"
             + "".join(f"; {a.name}: {a.shows}" for a in applicable(model))]
    if isinstance(model, EvalOptions) and model.eval_options:
        found.append(f"modwire eval RUN --set model.overrides.<option>=… for {list(model.eval_options)}")
    found.append("modwire eval RUN (--task, --split, --occlusion)")
    return "; ".join(found)


def run_model_class(path: str | os.PathLike) -> type | None:
    """The model class of the checkpoint :func:`load_run` would load (the ``model_type`` of its
    ``config.json``), or None when there is none to read (:func:`load_run` then says what is wrong)."""
    import json

    from ..models.base import CONFIG_FILE, MODEL_TYPES
    from ..training.checkpoint import resolve_checkpoint

    try:
        data = json.loads((resolve_checkpoint(Path(path)) / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return MODEL_TYPES.get(data.get("model_type")) if isinstance(data, dict) else None


def open_run(path, overrides, split, max_samples, names: set[str], weights: str | None = None) -> AnalyzedRun:
    """:func:`load_run`, its split cut to ``max_samples``, named uniquely among ``names``."""
    cfg, model, info, dataset = load_run(path, overrides, split=split, weights=weights)
    if not isinstance(model, ModuleSurgery):
        raise UserTypeError(f"{path}: modwire analyze drops modules and edges (NAC App. F), which needs a model "
                            f"that describes its modules (NAC, Perceiver IO, Neural Interpreter); this run's "
                            f"{model.config.model_type!r} model does not. What applies to it: "
                            f"{other_analyses(model)}")
    axis = module_axis(model)
    if max_samples is not None and max_samples < len(dataset):
        dataset = FirstN(dataset, max_samples)
    if len(dataset) == 0:
        raise UserError(f"{path}: the {split or cfg.data.val_split} split is empty")
    name = Path(path).resolve().name
    base, i = name, 2
    while name in names:
        name, i = f"{base}_{i}", i + 1
    names.add(name)
    return AnalyzedRun(Path(path), name, cfg, model, info, dataset, model.config.model_type, axis.size, axis.link_probs,
               axis.noun)


def evaluate_run(run: AnalyzedRun, model, batch_size: int | None = None) -> dict[str, float]:
    """Every metric of the run's task for ``model`` (the run's model or a copy) on its split."""
    from ..training import evaluate, make_loader

    cfg = run.cfg
    loader = make_loader(run.dataset, batch_size or cfg.data.batch_size, None, run.info, cfg.data.num_workers,
                         drop_last=False)
    device = next(model.parameters()).device
    return evaluate(model, loader, run.info, device, cfg.precision)


def timing_batch(run: AnalyzedRun, batch: int, device) -> torch.Tensor:
    """The first ``batch`` samples of the split (cycled if it is smaller), collated like the loader."""
    from ..training import make_loader, to_device

    idx = [i % len(run.dataset) for i in range(batch)]
    loader = make_loader(torch.utils.data.Subset(run.dataset, idx), batch, None, run.info, 0, drop_last=False)
    x = next(iter(loader))[0]
    return to_device(x, device)


def forward(model, x, device, precision):
    """One inference forward as the trainer runs it (its autocast and input handling)."""
    from ..training import autocast, call_model

    with autocast(device, precision):
        return call_model(model, x)
