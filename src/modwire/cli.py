"""The ``modwire`` command.

    modwire train CONFIG.yaml [--set key=value ...] [--resume]
    modwire eval RUN_DIR_OR_CHECKPOINT [--task NAME] [--split SPLIT]
    modwire list models|tasks

Also ``python -m modwire ...`` and ``torchrun --nproc-per-node N -m modwire train ...``.
Misuse exits with code 2 and a usage message; bad configs, names and files exit 2
with a message naming what was expected.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="modwire", description="Modular attention networks: train, evaluate, list.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{train,eval,list}")
    t = sub.add_parser("train", help="train a model on a task from a YAML config")
    t.add_argument("config", nargs="?", help="YAML file (see configs/); omitted: defaults + --set")
    t.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override config keys, e.g. --set optim.lr=1e-3 model.overrides.num_layers=4")
    t.add_argument("--resume", action="store_true", help="continue from OUT_DIR/checkpoints/last")
    e = sub.add_parser("eval", help="evaluate a saved run or checkpoint")
    e.add_argument("path", help="run directory (uses its best, else last checkpoint) or checkpoint directory")
    e.add_argument("--task", help="task name (default: the run's task)")
    e.add_argument("--split", help="split (default: the run's validation split)")
    e.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="data.* overrides, e.g. data.params.root=/data/tiny-imagenet")
    l = sub.add_parser("list", help="list model presets or tasks")
    l.add_argument("what", choices=["models", "tasks"])
    return ap


def cmd_train(args) -> int:
    from .training import load_config, train

    cfg = load_config(args.config, args.overrides)
    result = train(cfg, resume=args.resume)
    print(json.dumps({k: result[k] for k in ("status", "step", "val", "best", "run_dir")}))
    return 130 if result["status"] == "interrupted" else 0


def cmd_eval(args) -> int:
    import torch

    from .models import from_pretrained
    from .tasks import build_dataset, get_task
    from .training import load_config
    from .training.checkpoint import resolve_checkpoint
    from .training.trainer import apply_augmentation, evaluate, make_loader

    ckpt = resolve_checkpoint(args.path)
    run_cfg = next((p / "config.yaml" for p in (Path(args.path), ckpt.parent.parent) if (p / "config.yaml").is_file()),
                   None)
    cfg = load_config(str(run_cfg) if run_cfg else None, args.overrides)
    task = args.task or cfg.data.task
    info = get_task(task)
    params = cfg.data.params if task == cfg.data.task else {}
    dataset = build_dataset(task, args.split or cfg.data.val_split, **params)
    model = from_pretrained(ckpt)
    _, dataset, _ = apply_augmentation(cfg, model, info, dataset, dataset)  # the run's eval transform, if any
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu")
    loader = make_loader(dataset, cfg.data.batch_size, None, info, cfg.data.num_workers, drop_last=False)
    metrics = evaluate(model.to(device), loader, info, device, cfg.precision)
    print(json.dumps({"checkpoint": str(ckpt), "task": task, "split": args.split or cfg.data.val_split, **metrics}))
    return 0


def cmd_list(args) -> int:
    if args.what == "models":
        from .models import list_models, model_source

        for name in list_models():
            print(f"{name:<32}{model_source(name)}")
    else:
        from .tasks import get_task, list_tasks

        for name in list_tasks():
            info = get_task(name)
            print(f"{name:<24}{info.kind:<11}{info.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        return {"train": cmd_train, "eval": cmd_eval, "list": cmd_list}[args.command](args)
    except (KeyError, ValueError, FileNotFoundError, TypeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"modwire {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
