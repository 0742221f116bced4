"""The ``modwire`` command.

    modwire train CONFIG.yaml [--set key=value ...] [--resume] [--allow-change KEYS] [--overwrite]
    modwire train --resume RUN_DIR [--set key=value ...] [--allow-change KEYS]
    modwire eval RUN_DIR_OR_CHECKPOINT [--task NAME] [--split SPLIT] [--max-samples N] [--occlusion SIZE]
                 [--weights live|ema] [--set key=value ...]
    modwire finetune RUN --task T [--train SETS] [--shots K --ways N] [--seeds 0,1,2] [--epochs E] [--lr LR]
                     [--batch-size B] [--out DIR] [--weights live|ema] [--set key=value ...]
    modwire list models|tasks
    modwire analyze RUN_DIR [--baseline RUN_DIR ...] [--out DIR] [--drop FRACTIONS] [--draws N] [--edges FRACTIONS] [--block-size N]
                    [--split SPLIT] [--batch N] [--max-samples N] [--weights live|ema] [--set key=value ...] [--no-plots]
    modwire reproduce NAME [--quick] [--out DIR] [--dry-run]    |    modwire reproduce --list
    modwire results [--write FILE | --check FILE | --rebuild [NAME ...]]

``reproduce`` and ``results`` run the studies of :mod:`modwire.experiments` (its ``registry`` and
``report``); they read configs and results from a clone of the repository
(:mod:`modwire.experiments.paths`; ``reproduce --list`` needs none).

Also ``python -m modwire ...`` and ``torchrun --nproc-per-node N -m modwire train ...``.
Misuse exits with code 2 and a usage message; bad configs, names and files exit 2
with a message naming what was expected. A command exits 1 when a write fails (a full
disk, a read-only directory: one line naming the file and what is free; what was written
before is kept) and ``train`` when its run directory is locked by another run, 130 after SIGINT and 143 after
SIGTERM (a ``last`` checkpoint is written first; resume with ``--resume RUN_DIR``).
A command whose output is piped into a reader that quits early (``| head``) stops quietly
with 141, as a Unix tool stopped by SIGPIPE does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Callable

from .errors import UserError

SIGPIPE_EXIT = 141   # stdout closed by its reader (`| head`): quiet, with the status of a Unix tool stopped by SIGPIPE


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="modwire",
                                 description="Modular attention networks: train, evaluate, fine-tune, list, analyze; "
                                             "reproduce the papers' studies and their results table.")
    sub = ap.add_subparsers(dest="command", required=True,
                            metavar="{train,eval,finetune,list,analyze,data,reproduce,results}")
    t = sub.add_parser("train", help="train a model on a task from a YAML config")
    t.add_argument("config", nargs="?", help="YAML file (see configs/); omitted: defaults + --set")
    t.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override config keys, e.g. --set optim.lr=1e-3 model.overrides.num_layers=4")
    t.add_argument("--resume", nargs="?", const=True, default=None, metavar="RUN_DIR",
                   help="continue a run from its checkpoints/last with the run's own config.yaml: "
                        "`--resume RUN_DIR`, or `CONFIG --resume` (CONFIG must match the run's config)")
    t.add_argument("--allow-change", default="", metavar="KEYS",
                   help="on resume, let these harmless keys differ from the run's config (comma-separated; "
                        "epochs, max_steps, log_every, progress, checkpoint_every, data.num_workers, device, "
                        "compile); recorded in RUN_DIR/resumes.jsonl")
    t.add_argument("--overwrite", action="store_true",
                   help="start afresh in an out_dir that holds an earlier run, discarding its checkpoints")
    e = sub.add_parser("eval", help="evaluate a saved run or checkpoint")
    e.add_argument("path", help="run directory (uses its best, else last checkpoint) or checkpoint directory")
    e.add_argument("--task", help="task name (default: the run's task)")
    e.add_argument("--split", help="split (default: the run's validation split)")
    e.add_argument("--max-samples", type=int, metavar="N",
                   help="score the first N samples of the split only (same as --set data.max_samples=N)")
    e.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="data.* overrides, e.g. data.params.root=/data/tiny-imagenet")
    e.add_argument("--occlusion", type=int, metavar="SIZE",
                   help="one SIZE×SIZE Cutout box per image, set to 0 (NFM §4.4: 16; modwire.analysis.occlusion)")
    e.add_argument("--occlusion-seed", type=int, default=0, metavar="S", help="seed of the boxes (default 0)")
    _weights_argument(e)
    _finetune_parser(sub)
    d = sub.add_parser("data", help="check a dataset's files before training: list every unreadable one")
    d.add_argument("action", choices=["check"])
    d.add_argument("config", nargs="?", help="a training config YAML (its data.task and data.params)")
    d.add_argument("--task", help="the task (default: the config's data.task)")
    d.add_argument("--split", action="append", help="a split to check (repeatable; default: every split of the task)")
    d.add_argument("--mode", default="decode", choices=["decode", "verify", "items"],
                   help="decode every image fully (default, as training does), verify (faster, structure "
                        "only: a truncated JPEG passes), or read every item through the dataset")
    d.add_argument("--workers", type=int, default=None, help="threads for image files (default min(8, CPUs))")
    d.add_argument("--json", action="store_true", help="print the reports as JSON")
    d.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set data.params.root=/data/tiny-imagenet-200 (repeatable)")
    l = sub.add_parser("list", help="list model presets or tasks")
    l.add_argument("what", choices=["models", "tasks"])
    a = sub.add_parser("analyze", help="what applies to a trained run's model: drop modules / eliminate edges (NAC, "
                       "Perceiver IO, NI: NAC Fig. 5, 8, 10, 15), circuits of a conditional NAC (Fig. 6), an AiT's "
                       "workspace (AiT Fig. 2, 7, 10, 11), an NFM model's read map (NFM Fig. 1); always the metrics",
                       description="Analyses of a trained run, chosen by what its model declares: inference-time "
                                   "sparsification (accuracy, throughput and GFLOPs as modules (NAC) or latents "
                                   "(Perceiver IO) are dropped, accuracy as edges are eliminated (NAC), pictures of "
                                   "the learned graph); for other models the checkpoint's metrics on the split, an "
                                   "AiT's workspace analyses and an NFM model's read map.")
    a.add_argument("path", help="run directory (uses its best, else last checkpoint) or checkpoint directory")
    a.add_argument("--baseline", nargs="+", action="extend", default=[], metavar="RUN_DIR",
                   help="runs to compare with (e.g. the Perceiver IO of NAC Fig. 5/15); module-dropping runs only")
    a.add_argument("--out", help="output directory (default: RUN_DIR/analysis)")
    a.add_argument("--drop", metavar="FRACTIONS",
                   help="comma-separated fractions of modules to drop, each in [0, 1) "
                        "(default 0,.25,.5,.625,.75,.8125,.875,.9375); module-dropping runs only")
    a.add_argument("--draws", type=int, default=0, metavar="N",
                   help="also drop N random subsets per fraction (N >= 2; the same subsets for every run with as "
                        "many modules) and write their mean and std; module-dropping runs only (default 0: each "
                        "model's own order only)")
    a.add_argument("--draw-seed", type=int, default=0, help="seed of the random subsets of --draws (default 0)")
    a.add_argument("--edges", metavar="FRACTIONS",
                   help="comma-separated fractions of edges to remove, each in [0, 1]; NAC runs only "
                        "(default for a NAC: 0,.5,.8,.9,.92,.94,.96,.98,1)")
    a.add_argument("--split", help="split (default: the run's validation split)")
    a.add_argument("--batch", type=int, default=None, help="batch of the throughput and FLOP measurements (default 64)")
    a.add_argument("--iters", type=int, default=None, help="timed batches per model, median kept (default 3)")
    a.add_argument("--block-size", type=int, default=None,
                   help="block size of the block-sparse propagators timed for --edges (default: the prior's "
                        "cluster size, else modules / 8)")
    a.add_argument("--max-samples", type=int, help="evaluate on the first N samples of the split only")
    a.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="config overrides for every run, e.g. data.params.root=/data/tiny-imagenet")
    a.add_argument("--no-plots", action="store_true", help="write CSV/JSON only (no matplotlib needed)")
    _weights_argument(a)
    _reproduce_parsers(sub)
    return ap


def _weights_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", choices=["live", "ema"], default=None,
                   help="which weights of a run that kept an EMA (ema_decay > 0): default, the ones its validation "
                        "scored and 'best' was chosen by (the EMA's); live: the weights the optimizer trained")


def _reproduce_parsers(sub) -> None:
    r = sub.add_parser("reproduce", help="run a study of modwire.experiments at CPU scale (--list: which there are)",
                       description="Run one study of modwire.experiments (its registry) at CPU scale, or its "
                                   "minutes-long --quick version; it writes OUT/study.json (and its plot), which "
                                   "`modwire results` reads from experiments/results/NAME/. Needs a clone of the "
                                   "repository.")
    r.add_argument("name", nargs="?", help="the study (modwire reproduce --list)")
    r.add_argument("--list", action="store_true", help="list the studies: the paper claim, CPU-scale and quick time")
    r.add_argument("--quick", action="store_true", help="the minutes-long version (default out: runs/reproduce/NAME)")
    r.add_argument("--out", help="output folder (default experiments/results/NAME, where the report reads it)")
    r.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    sub.add_parser("results", add_help=False, help="the README's results table from experiments/results/*/study.json "
                                                   "(print; --write FILE; --check FILE; modwire results --help)")


FINETUNE_HELP = """\
For each seed, one training run (checkpointed, resumable: run the same command again to skip
finished seeds and resume an interrupted one) into OUT/seed-<s>, starting from RUN's weights
(its best, else last checkpoint) with new task outputs (CLS tokens / head; --set
finetune.new_task=false keeps them). Prints the task's first metric on the validation split per
seed with mean ± std (sample std) and writes OUT/summary.json.

Paper protocols:
  NI Table 1 (fuzzy Boolean, App. B Table 3): --task fuzzy_boolean_adapt --epochs 3 --lr 0.05
      with --train cls | cls,type_inference | all
  NI Fig. 5a (K-MNIST few-shot, App. C.2.2): --shots K --seeds 0,1,2,3,4,5 (10 epochs, batch 128,
      RAdam at a constant lr: 0.05 NI, 0.03 ViT; the seed also draws the subset)
  NI Fig. 5b (capacity extension): --set finetune.add_functions=N --train signatures_codes
      (or new_functions: the added pairs only)
  NAC Fig. 4 (few-shot NAC vs Perceiver IO): --ways 8 --shots K for K in 1..16, --train all
"""


def _finetune_parser(sub) -> None:
    f = sub.add_parser("finetune", help="fine-tune a trained run on a task over several seeds (NI Table 1, "
                       "Fig. 5; NAC Fig. 4)", description=FINETUNE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("path", metavar="RUN", help="pretrained run directory (its best, else last checkpoint) or "
                                               "checkpoint directory")
    f.add_argument("--task", required=True, help="the task to fine-tune on (modwire list tasks)")
    f.add_argument("--train", default="all", metavar="SETS",
                   help="comma-separated parameter sets that train, the rest frozen (NI Table 1: cls, "
                        "cls,type_inference, all; NI Fig. 5b: signatures_codes; NAC/PIO: head, readout, all); "
                        "default all")
    f.add_argument("--shots", type=int, default=0, metavar="K",
                   help="K training samples per class, drawn by the seed (NI Fig. 5a, NAC Fig. 4); default all")
    f.add_argument("--ways", type=int, default=0, metavar="N",
                   help="N classes drawn by the seed, labels renumbered 0..N-1 (NAC Fig. 4: 8); default all")
    f.add_argument("--seeds", default="0,1,2,3,4,5", help="comma-separated seeds; default 0-5 (NI App. C.2.2: 6)")
    f.add_argument("--epochs", type=int, default=10, help="default 10 (NI App. C.2.2; Table 1 used 3)")
    f.add_argument("--lr", type=float, default=None,
                   help="constant RAdam learning rate; default 0.05 (NI), 0.03 for a ViT (NI App. C.2.2); "
                        "NAC/PIO get 0.05 too (NAC Fig. 4 gives no fine-tuning lr: sweep it)")
    f.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="default 128 (NI App. C.2.2), cut to K·N for a smaller few-shot set")
    f.add_argument("--out", help="output directory (default RUN/finetune/<task>-<sets>[-<K>shot][-<N>way])")
    f.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="training-config overrides for every seed, e.g. optim.grad_clip=1 data.params.root=/data")
    _weights_argument(f)


def cmd_train(args) -> int:
    from .training import load_config, train
    from .training.divergence import TrainingDiverged
    from .training.feedback import dumps
    from .training.lock import RunLockedError
    from .training.resume import run_config

    resume, config = args.resume, args.config
    if isinstance(resume, str) and Path(resume).is_file() and config is None:
        config, resume = resume, True           # `train --resume CONFIG.yaml`: the config form
    if isinstance(resume, str):
        if config is not None:
            raise UserError(f"give either CONFIG --resume or --resume RUN_DIR, not both ({config}, {resume})")
        cfg = run_config(resume, args.overrides)
    else:
        cfg = load_config(config, args.overrides)
    allow = [k.strip() for k in args.allow_change.split(",") if k.strip()]
    if allow and not resume:
        raise UserError("--allow-change only applies with --resume")
    try:
        result = train(cfg, resume=bool(resume), allow_change=allow, overwrite=args.overwrite)
    except (RunLockedError, TrainingDiverged) as e:     # a failed write: _dispatch
        print(f"modwire train: error: {e}", file=sys.stderr)
        return 1
    print(dumps({k: result[k] for k in ("status", "step", "val", "best", "run_dir")}))
    return result["exit_code"]


def cmd_finetune(args) -> int:
    from .training import load_config
    from .training.divergence import TrainingDiverged
    from .training.finetune import default_out_dir, finetune_overrides, finetune_seeds, summary_table
    from .training.lock import RunLockedError

    from .training.kinds import kind_of_run

    kind = kind_of_run(args.path)                        # the run-kind table (training/kinds.py)
    if not kind.task_outputs:
        raise UserError(f"{args.path} is a {kind.noun} run: it has no task outputs to fine-tune. {kind.instead}")
    seeds = _int_list(args.seeds, "--seeds")
    train = [t.strip() for t in args.train.split(",") if t.strip()]
    if not train:
        raise UserError(f"--train: expected comma-separated parameter-set names such as all or cls,type_inference, "
                        f"got {args.train!r}")
    for flag, value, low in (("--shots", args.shots, 0), ("--ways", args.ways, 0), ("--epochs", args.epochs, 1),
                             ("--batch-size", args.batch_size, 1)):
        if value is not None and value < low:
            raise UserError(f"{flag}: expected an integer >= {low}, got {value}")
    if args.lr is not None and not args.lr > 0:
        raise UserError(f"--lr: expected a positive number, got {args.lr}")
    base, meta = finetune_overrides(args.path, args.task, train=train, shots=args.shots, ways=args.ways,
                                    epochs=args.epochs, lr=args.lr, batch_size=args.batch_size)
    base += [f"finetune.weights={args.weights}"] if args.weights else []
    out = Path(args.out) if args.out else default_out_dir(args.path, args.task, train, args.shots, args.ways)

    def config_for(seed: int, run_dir: Path):
        return load_config(None, [*base, *args.overrides, f"seed={seed}", f"out_dir={json.dumps(str(run_dir))}"])

    for seed in seeds[:1]:
        config_for(seed, out / f"seed-{seed}")   # a bad --set or flag fails before anything is written
    try:
        summary, code = finetune_seeds(config_for, seeds, out, meta={**meta, "seeds": seeds},
                                       log=lambda s: print(f"modwire finetune: {s}", file=sys.stderr))
    except (RunLockedError, TrainingDiverged) as e:     # a failed write: _dispatch
        print(f"modwire finetune: error: {e}", file=sys.stderr)
        return 1
    print(summary_table(summary))
    print(f"summary: {out / 'summary.json'}")
    return code


def _int_list(text: str, flag: str) -> list[int]:
    """``"0,1,2"`` → ``[0, 1, 2]``: distinct non-negative integers."""
    try:
        values = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        values = []
    if not values or min(values) < 0 or len(set(values)) != len(values):
        raise UserError(f"{flag}: expected distinct non-negative integers separated by commas, e.g. 0,1,2; "
                        f"got {text!r}")
    return values


def cmd_data(args) -> int:
    """``modwire data check [CONFIG] [--task T] [--split S]``: every unreadable file of each split
    (:func:`modwire.tasks.check.check_dataset`); exit 1 when any is found."""
    from .analysis.runs import task_params
    from .tasks import get_task
    from .tasks.check import check_dataset
    from .training import load_config

    cfg = load_config(args.config, args.overrides)
    task = args.task or cfg.data.task
    params = task_params(cfg, task, args.overrides)
    splits = args.split or list(get_task(task).splits)
    live = not args.json and sys.stderr.isatty()
    progress = (lambda done, total: print(f"\r  {done:,} / {total:,} checked", end="", file=sys.stderr)) if live else None
    reports, missing = {}, {}
    for split in splits:
        try:
            reports[split] = check_dataset(task, split, params, mode=args.mode, workers=args.workers,
                                           progress=progress)
        except (UserError, OSError) as e:      # the split's own error: a missing folder is an OSError
            if args.split:                     # a split asked for by name must exist
                raise
            missing[split] = str(e).splitlines()[0]   # e.g. a dataset without a test split
            continue
        finally:
            if live:
                print("\r", end="", file=sys.stderr)
        if not args.json:
            print(reports[split].summary())
    for split, why in missing.items():
        if not args.json:
            print(f"task {task!r}, split {split!r}: not checked: {why}")
    if args.json:
        print(json.dumps({"reports": {s: r.to_dict() for s, r in reports.items()}, "not_checked": missing}, indent=1))
    if not reports:
        raise UserError(f"task {task!r}: no split could be built: " + "; ".join(f"{s}: {w}" for s, w in missing.items()))
    return max(r.exit_code for r in reports.values())


def cmd_eval(args) -> int:
    import torch

    from .analysis.report import load_run
    from .training import evaluate, make_loader
    from .training.checkpoint import checkpoint_step, choose_checkpoint
    from .training.ema import weight_files, weights_note
    from .training.feedback import dumps

    from .training.kinds import kind_of_run

    kind = kind_of_run(args.path)           # the run-kind table (training/kinds.py)
    if kind.score is not None:              # a kind scored its own way (a GAN: FID of its samples)
        return _score_run(kind, args)
    ckpt, why = choose_checkpoint(args.path)
    tag, step = ckpt.name.split("-", 1)[0], checkpoint_step(ckpt)
    weights = args.weights or weight_files(ckpt)[1]
    print(f"modwire eval: scoring checkpoint {tag!r} (step {step}) at {ckpt}: {why}; weights: "
          f"{weights_note(ckpt, args.weights)}", file=sys.stderr)
    overrides = [*args.overrides, *([f"data.max_samples={args.max_samples}"] if args.max_samples is not None else [])]
    cfg, model, info, dataset = load_run(args.path, overrides, task=args.task, split=args.split, weights=args.weights)
    extra = {}
    if args.occlusion is not None:  # NFM §4.4: one Cutout box per test image
        from .analysis.occlusion import OccludedDataset

        kind = info.inputs["x"].kind if isinstance(info.inputs, dict) and "x" in info.inputs else \
            getattr(info.inputs, "kind", "several inputs")
        if kind != "image":
            raise UserError(f"--occlusion puts a Cutout box on images (NFM §4.4); task "
                            f"{args.task or cfg.data.task!r} gives {kind} inputs")
        dataset = OccludedDataset(dataset, args.occlusion, seed=args.occlusion_seed)
        extra = {"occlusion": {"size": args.occlusion, "seed": args.occlusion_seed}}
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu")
    loader = make_loader(dataset, cfg.data.batch_size, None, info, cfg.data.num_workers, drop_last=False)
    metrics = evaluate(model.to(device), loader, info, device, cfg.precision)
    print(dumps({"checkpoint": str(ckpt), "tag": tag, "step": step, "weights": weights,
                 "task": args.task or cfg.data.task, "split": args.split or cfg.data.val_split,
                 "samples": len(dataset), **extra, **metrics}))
    return 0


def _score_run(kind, args) -> int:
    """``modwire eval`` of a run whose kind scores it (``RunKind.score``): the task flags do not apply."""
    from .training.feedback import dumps

    given = [flag for flag, value in (("--task", args.task), ("--split", args.split), ("--occlusion", args.occlusion),
                                      ("--max-samples", args.max_samples), ("--weights", args.weights))
             if value is not None]
    if given:
        raise UserError(f"{args.path} is a {kind.noun} run: eval scores {kind.scores}, {', '.join(given)} "
                        f"{'does' if len(given) == 1 else 'do'} not apply to it")
    print(dumps(kind.score(args.path, args.overrides)))
    return 0


def cmd_analyze(args) -> int:
    from .analysis.report import analyze, parse_fractions

    drop = parse_fractions(args.drop, "--drop", closed=False) if args.drop is not None else None
    edges = parse_fractions(args.edges, "--edges", closed=True) if args.edges is not None else None
    try:
        analyze(args.path, args.baseline, out_dir=args.out, drop=drop, edges=edges, split=args.split,
                batch=args.batch, max_samples=args.max_samples, overrides=args.overrides,
                plots=not args.no_plots, iters=args.iters, block_size=args.block_size, draws=args.draws,
                draw_seed=args.draw_seed, weights=args.weights)
    except ImportError as e:  # matplotlib / networkx missing: say which extra to install
        if "modwire[analysis]" not in str(e):
            raise
        print(f"modwire analyze: error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_list(args) -> int:
    if args.what == "models":
        from .models.capabilities import capabilities
        from .models.registry import get_preset, list_models

        names = list_models()
        width = max(32, 2 + max(map(len, names), default=0))   # a long name never runs into its source
        for name in names:
            cls, _, source = get_preset(name)
            print(f"{name:<{width}}{source}  [{', '.join(capabilities(cls)) or 'no optional capability'}]")
    else:
        from .tasks import get_task, list_tasks

        names = list_tasks()
        width = max(24, 2 + max(map(len, names), default=0))   # a long name never runs into its kind
        for name in names:
            info = get_task(name)
            print(f"{name:<{width}}{info.kind:<11}{info.description}")
    return 0


# ----------------------------------------------------------------------------- reproduce, results

def cmd_results(args, rest: list[str]) -> int:
    """``modwire results ...``: :mod:`modwire.experiments.report` with the same arguments."""
    from .experiments import report

    return report.main(rest, prog="modwire results")


def cmd_reproduce(args) -> int:
    """Run a study's commands (:data:`modwire.experiments.registry.STUDIES`) from the clone's root
    with this Python."""
    import shlex
    import subprocess

    from .experiments import registry
    from .experiments.paths import require_checkout

    if args.list:
        print(reproduce_list(registry))
        return 0
    known = ", ".join(registry.STUDY)
    if not args.name:
        raise UserError(f"give the NAME of a study (one of {known}) or --list")
    study = registry.STUDY.get(args.name)
    if study is None:
        raise UserError(f"unknown study {args.name!r}; the studies are: {known} (modwire reproduce --list)")
    root = require_checkout(f"modwire reproduce {study.name}")   # its configs/, its experiments/results/
    default = Path("runs", "reproduce", study.name) if args.quick else Path("experiments", "results", study.results)
    out = Path(args.out).resolve() if args.out else root / default
    if not args.quick and not args.out and (out / "study.json").is_file():
        print(f"modwire reproduce: {out} holds a committed result: the study resumes from its logs (finished runs "
              f"are not trained again); --out DIR trains afresh", file=sys.stderr)
    for step in study.quick if args.quick else study.steps:
        argv = [a.replace(registry.OUT, str(out)) for a in step]
        print(f"modwire reproduce {study.name}: {shlex.join(['python', *argv])}", file=sys.stderr, flush=True)
        if not args.dry_run and (code := subprocess.run([sys.executable, *argv], cwd=root).returncode):
            print(f"modwire reproduce: error: the step above exited {code}; rerun the same command to resume",
                  file=sys.stderr)
            return 1
    if not args.dry_run:
        print(f"result: {out / 'study.json'}")
    return 0


def reproduce_list(registry) -> str:
    """One line per study: its name, the paper claim, the CPU-scale and quick times."""
    width = max(map(len, registry.STUDY)) + 2
    lines = [f"{'study':<{width}}paper claim; CPU-scale time (2 cores); --quick time"]
    for s in registry.STUDIES:
        lines.append(f"{s.name:<{width}}{s.claim}\n{'':<{width}}full: {s.time}; quick: {s.quick_time}")
    return "\n".join(lines)


def _one_line_warnings() -> None:
    """A :class:`~modwire.errors.ConfigWarning` as one line (``modwire: warning: ...``), not Python's
    ``file:line: category`` form; other warnings as Python shows them."""
    import warnings

    from .errors import ConfigWarning

    shown = warnings.showwarning
    if getattr(shown, "modwire", False):   # installed by an earlier main() in this process
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ConfigWarning):
            print(f"modwire: warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    show.modwire = True
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args, rest = ap.parse_known_args(argv)
    if rest and args.command != "results":       # only `results` passes its arguments on
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    return run_command(args.command, lambda: _dispatch(args, rest))


def _dispatch(args, rest: list[str] | None = None) -> int:
    if args.command == "results":
        return cmd_results(args, rest or [])
    return {"train": cmd_train, "eval": cmd_eval, "finetune": cmd_finetune, "list": cmd_list,
            "analyze": cmd_analyze, "data": cmd_data, "reproduce": cmd_reproduce}[args.command](args)


def run_command(command: str, run: Callable[[], int]) -> int:
    """Run one command as every modwire command ends (``modwire ...`` and ``python -m modwire.demo``):
    a mistake in what the user gave is one line and exit 2; a failed write (full disk, read-only) one
    line and exit 1; a closed stdout (``| head``) quiet, 141; anything else a bug in modwire, shown with
    its traceback and a line saying so, exit 1. A :class:`~modwire.errors.ConfigWarning` is one line."""
    _one_line_warnings()
    try:
        try:
            code = run()
        except BrokenPipeError:                      # stdout's reader has gone: below
            raise
        except (UserError, FileNotFoundError) as e:  # what the user gave
            print(f"modwire {command}: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:                         # a failed write
            from .files import write_error

            why = write_error(e)
            if why is None:
                return _bug(command)
            print(f"modwire {command}: error: {why}", file=sys.stderr)
            return 1
        except Exception:                            # anything else is modwire's fault: say so
            return _bug(command)
        sys.stdout.flush()                # output that fit the buffer meets a closed pipe here, not at exit
        return code
    except BrokenPipeError:               # `modwire list models | head`: the reader has gone, not an error
        _drop_stdout()
        return SIGPIPE_EXIT


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered has no reader, and flushing it at exit would
    raise again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):          # a stdout without a file descriptor (captured, replaced)
        sys.stdout = open(os.devnull, "w")


def _bug(command: str) -> int:
    """The exception being handled is a bug in modwire: its traceback, and a sentence that says so."""
    traceback.print_exc()
    print(f"modwire {command}: internal error: the traceback above is a bug in modwire, not a mistake in "
          f"your command or config; please report it with the command you ran", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
