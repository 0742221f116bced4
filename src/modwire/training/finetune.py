"""Fine-tuning on the trainer: trained weights, named parameter sets, few-shot subsets, seeds.

``modwire finetune RUN --task T`` runs, for each seed, one ordinary training run
(:func:`~modwire.training.trainer.train`: checkpointed, locked, resumable after SIGKILL /
SIGTERM) whose config says where the weights come from and what trains (the trainer builds
each piece with :mod:`modwire.training.finetune_setup`):

- ``finetune.init``: a run directory (its best, else last checkpoint, as ``modwire eval``
  chooses) or a checkpoint directory; the architecture is its ``config.json``
  (:func:`~modwire.training.finetune_setup.pretrained_model`);
- ``finetune.new_task``: fresh task-specific outputs, ``model.new_task(num_classes, heads)``
  (NI §4.1: "we always instantiate and train 10 new CLS tokens"; NAC Fig. 4: a new 8-way head);
- ``finetune.add_functions``: new (signature, code) pairs first, ``model.add_functions(n)``
  (NI §4.2 capacity extension, Fig. 5b);
- ``finetune.train``: the parameter sets that train, named by ``model.parameter_sets()``; the
  rest get ``requires_grad=False`` and stay out of the optimizer
  (:func:`~modwire.training.finetune_setup.select_trainable`);
- ``data.few_shot``: ``{shots: k, ways: n}``, a k-shot n-way subset drawn by the run's seed
  (:func:`~modwire.training.finetune_setup.few_shot_splits`; NI App. C.2.2: "the random seed
  also determines the subset").

Which paper protocol each piece serves:

- **NI Table 1** (fuzzy Boolean adaptation, App. B Table 3): new CLS tokens for the 10 new
  functions, trained alone (``--train cls``), with type inference (``cls,type_inference``) or
  with everything (``all``); 3 epochs, RAdam, lr 0.05.
- **NI Fig. 5a** (K-MNIST, App. C.2.2): ``--shots k``, 10 epochs, batch 128, RAdam at a constant
  lr (0.05 NI, 0.03 ViT, found by grid search), 6 seeds. **NI Fig. 5b**: ``--train
  signatures_codes`` (after ``add_functions``).
- **NAC Fig. 4** (few-shot adaptation of a pretrained NAC vs Perceiver IO): ``--ways 8 --shots k``
  for k = 1 … 16, a new 8-way head; the paper gives no fine-tuning optimizer, so the NI defaults
  apply unless overridden.

:func:`finetune_seeds` runs the seeds into ``OUT/seed-<s>`` (a finished seed is skipped, an
interrupted one resumed) and writes ``OUT/summary.json``: the task's first metric on the
validation split per seed, its mean and sample standard deviation.
"""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from torch.utils.data import Dataset

from .config import TrainConfig
from .finetune_setup import draw_few_shot, same_classes
from ..errors import UserError

__all__ = ["default_out_dir", "few_shot_eval_set", "finetune_overrides", "finetune_seeds", "source_run", "summarize",
           "summary_table"]

RESULT_NAME, SUMMARY_NAME = "result.json", "summary.json"


# ----------------------------------------------------------------------------- few-shot evaluation

def few_shot_eval_set(cfg: TrainConfig, info, dataset: Dataset, split: str) -> Dataset:
    """``dataset`` (a split of the run's task) cut to the classes a few-shot run drew and
    renumbered as in training, so ``modwire eval`` scores what the run validated on."""
    from ..tasks import build_dataset

    d = cfg.data
    _, classes = draw_few_shot(cfg, info, build_dataset(d.task, d.train_split, max_samples=d.max_samples, **d.params))
    return same_classes(dataset, classes, split)


# ----------------------------------------------------------------------------- several seeds

def summarize(values: dict[int, float]) -> dict[str, Any]:
    """Mean and sample standard deviation (n - 1 in the denominator; None for one seed) over seeds."""
    xs = list(values.values())
    return {"n": len(xs), "mean": statistics.fmean(xs) if xs else None,
            "std": statistics.stdev(xs) if len(xs) > 1 else None}


def finetune_seeds(config_for: Callable[[int, Path], TrainConfig], seeds: Sequence[int], out_dir: str | os.PathLike,
                   *, meta: dict[str, Any] | None = None,
                   log: Callable[[str], None] = print) -> tuple[dict[str, Any], int]:
    """Train ``config_for(seed, OUT/seed-<s>)`` for each seed in turn and summarise.

    A seed whose ``result.json`` exists (and whose saved config equals the new one) is not
    trained again; one with a ``last`` checkpoint is resumed; others start. An interrupted seed
    (SIGINT / SIGTERM) stops the sweep. Returns ``(summary, exit code)``; the summary, also in
    ``OUT/summary.json``, holds the per-seed values of the task's first metric on the validation
    split (at the end of training), their mean and std, the settings as trained and ``meta``."""
    from .resume import CONFIG_NAME, saved_config_changes
    from .trainer import train

    out = Path(out_dir)
    results: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        cfg = config_for(seed, out / f"seed-{seed}")
        run_dir = Path(cfg.out_dir)
        done = run_dir / RESULT_NAME
        if done.is_file() and (run_dir / CONFIG_NAME).is_file():
            differ = saved_config_changes(run_dir, cfg)
            if differ:
                raise UserError(f"{run_dir} holds a finished fine-tuning run with other settings (differing keys: "
                                f"{', '.join(differ)}): choose another --out")
            results[seed] = _read_result(done)
            log(f"seed {seed}: finished earlier ({run_dir})")
            continue
        resume = (run_dir / "checkpoints" / "last" / "state.pt").is_file()
        log(f"seed {seed}: {'resuming' if resume else 'training'} in {run_dir}")
        try:
            result = train(cfg, resume=resume)
        except Exception:
            _remove_if_empty(out)                 # a run refused before it began leaves no directory behind
                                                  # (its own directory: removed by its run lock)
            raise
        if result["status"] != "finished":
            log(f"seed {seed}: interrupted at step {result['step']}; run the same command again to resume")
            return _write_summary(out, cfg, results, meta), result["exit_code"]
        results[seed] = {"seed": seed, "step": result["step"], "val": result["val"], "best": result["best"]}
        _write_json(done, results[seed])
    return _write_summary(out, cfg, results, meta), 0


def _remove_if_empty(out: Path) -> None:
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def _read_result(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        data["val"], data["seed"]          # noqa: B018  (the keys a result must have)
        return data
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a fine-tuning result ({type(e).__name__}: {e}); delete it to retrain "
                        f"that seed") from None


def _write_summary(out: Path, cfg: TrainConfig, results: dict[int, dict[str, Any]],
                   meta: dict[str, Any] | None) -> dict[str, Any]:
    from ..tasks import get_task

    metric = get_task(cfg.data.task).metrics[0]
    values = {s: r["val"][metric] for s, r in results.items() if r.get("val") and metric in r["val"]}
    settings = {"init": cfg.finetune.init, "new_task": cfg.finetune.new_task, "train": list(cfg.finetune.train),
                "shots": cfg.data.few_shot.shots, "ways": cfg.data.few_shot.ways, "epochs": cfg.epochs,
                "optimizer": cfg.optim.name, "lr": cfg.optim.lr, "min_lr": cfg.optim.min_lr,
                "batch_size": cfg.data.batch_size}                 # as trained, --set overrides included
    summary = {**settings, **(meta or {}), "task": cfg.data.task, "split": cfg.data.val_split, "metric": metric,
               "values": {str(s): v for s, v in values.items()}, **summarize(values),
               "std_kind": "sample (n - 1)", "seed_runs": {str(s): str(out / f"seed-{s}") for s in results}}
    _write_json(out / SUMMARY_NAME, summary)
    return summary


def _write_json(path: Path, value: Any) -> None:
    from ..files import atomic_write_text
    from .feedback import dumps

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, dumps(value) + "\n")


def summary_table(summary: dict[str, Any]) -> str:
    """The per-seed values and mean ± std as a small text table."""
    metric, rows = summary["metric"], summary["values"]
    lines = [f"{'seed':>6}  {metric} ({summary['split']})"]
    lines += [f"{s:>6}  {v:.4f}" for s, v in rows.items()]
    mean, std = summary["mean"], summary["std"]
    spread = "n/a (one seed)" if std is None else f"{std:.4f}"
    lines.append(f"{'mean':>6}  {'n/a' if mean is None else f'{mean:.4f}'} ± {spread}  (n = {summary['n']})")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command's config

#: NI App. C.2.2's constant fine-tuning learning rates, found by grid search: 0.03 for the
#: ViT, 0.05 for the Neural Interpreter (also NI Table 3's fine-tuning lr); 0.05 for others.
DEFAULT_LR = {"vit": 0.03}
NI_LR = 0.05


def source_run(path: str | os.PathLike) -> tuple[Path, Path | None, Any]:
    """``(checkpoint, run directory or None, the run's TrainConfig or None)`` of ``RUN``: a run
    directory (its best, else last checkpoint, as ``modwire eval`` chooses) or a checkpoint directory."""
    from .checkpoint import choose_checkpoint
    from .config import load_config

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no run directory or checkpoint at {p}: expected a run directory (with "
                                f"checkpoints/best/ or checkpoints/last/) or a checkpoint directory")
    ckpt, _ = choose_checkpoint(p)
    run_dir = next((q for q in (p, ckpt.parent.parent) if (q / "config.yaml").is_file()), None)
    return ckpt, run_dir, load_config(str(run_dir / "config.yaml")) if run_dir else None


def finetune_overrides(run: str | os.PathLike, task: str, *, train: Sequence[str], shots: int, ways: int,
                       epochs: int, lr: float | None, batch_size: int | None) -> tuple[list[str], dict[str, Any]]:
    """The ``--set`` overrides of one seed's training config (before the user's own), and what
    ``summary.json`` records besides the config (the source run directory). Defaults per NI App. C.2.2: RAdam at a constant lr (no
    warm-up, min_lr = lr), no weight decay or clipping (the papers name none), 10 epochs, batch 128
    (cut to the k·n samples of a smaller few-shot set), new task outputs."""
    from ..models.base import CONFIG_FILE
    from ..tasks import describe_task

    ckpt, run_dir, run_cfg = source_run(run)
    model_type = json.loads((ckpt / CONFIG_FILE).read_text()).get("model_type", "model")
    lr = DEFAULT_LR.get(model_type, NI_LR) if lr is None else lr
    info = describe_task(task, run_cfg.data.params if run_cfg and run_cfg.data.task == task else {})
    if batch_size is None:
        batch_size = min(128, shots * (ways or info.num_classes)) if shots else 128
    overrides = [f"model.name={run_cfg.model.name if run_cfg else model_type}", f"data.task={task}",
                 f"finetune.init={json.dumps(str(ckpt))}", "finetune.new_task=true",
                 f"finetune.train=[{','.join(train)}]", f"data.few_shot.shots={shots}", f"data.few_shot.ways={ways}",
                 "optim.name=radam", f"optim.lr={lr!r}", f"optim.min_lr={lr!r}", "optim.warmup_steps=0",
                 "optim.weight_decay=0", "optim.grad_clip=0", f"epochs={epochs}", f"data.batch_size={batch_size}"]
    if run_cfg is not None and run_cfg.data.task == task and run_cfg.data.params:
        overrides.append(f"data.params={json.dumps(dict(run_cfg.data.params))}")   # the run's own task as trained
    return overrides, {"run": str(run_dir) if run_dir else None}


def default_out_dir(run: str | os.PathLike, task: str, train: Sequence[str], shots: int, ways: int) -> Path:
    """``RUN/finetune/<task>-<sets>[-<k>shot][-<n>way]`` for a run (or a checkpoint inside one)."""
    _, run_dir, _ = source_run(run)
    if run_dir is None:
        raise UserError(f"{run} is a checkpoint outside a run directory: give the output directory with --out")
    name = "-".join([task, "+".join(train), *([f"{shots}shot"] if shots else []), *([f"{ways}way"] if ways else [])])
    return run_dir / "finetune" / name
