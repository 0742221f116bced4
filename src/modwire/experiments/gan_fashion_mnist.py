"""NFM in a GAN's generator at CPU scale: the micro ResNet GAN with and without NFM (NFM §4.1, Table 4).

The paper puts NFM into InfoMax-GAN's generator (Mimicry's code, its default hyperparameters) and
reports CIFAR-10 FID 13.15 ± 0.06 against InfoMax-GAN's 15.12 ± 0.10 (Table 4; lower is better).
This trains the CPU demo of ``configs/gan/cpu/``: ``gan_resnet_micro`` and ``nfm_gan_resnet_micro``
(16×16 Fashion-MNIST, 400 generator steps, 2 discriminator steps each, hinge + InfoMax, Adam 2e-4,
β = (0, 0.9)) for ``--seeds`` seeds, and reads each run's classifier-FID (``val_classifier_fid`` in
its ``metrics.jsonl``: the Fréchet distance in the features of a small CNN classifier the run trains
on its own data; NOT Inception FID, so compare it only between these runs) at every evaluation step.

Each (model, seed) is one resumable training run (``modwire.training.train``) in a pool of
single-threaded workers; a finished run (its record in ``OUT/results.jsonl``) is skipped by a
rerun. Run directories: ``OUT/<model>`` for seed 0, ``OUT/<model>-seed<s>`` for the others; the
table goes to ``OUT/table.md`` and the study's record to ``OUT/study.json`` (:mod:`modwire.experiments.common`).
``--report`` reads the runs' ``metrics.jsonl``, prints the table and rebuilds ``OUT/study.json`` (no
training; ``OUT/table.md`` is left as it is). ``experiments/results/gan_fashion_mnist/`` holds one
seed of each, trained with the former ``modwire gan`` loop (its ``metrics.jsonl`` name the score
``classifier_fid``; its ``table.md`` also holds notes on the run that no log records).

Run: ``python -m modwire.experiments.gan_fashion_mnist`` (about 1 + 2 minutes of CPU time per seed, one core
each); ``--quick`` is a smoke test (scikit-learn's digits at 16×16, 4 steps; no Fashion-MNIST needed).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from modwire.experiments import common
from modwire.files import atomic_write_text

CONFIGS = {"gan": common.CONFIGS / "gan" / "cpu" / "gan_fashion_mnist.yaml",
           "nfm_gan": common.CONFIGS / "gan" / "cpu" / "nfm_gan_fashion_mnist.yaml"}
LABELS = {"gan": "ResNet GAN (InfoMax)", "nfm_gan": "NFM ResNet GAN (InfoMax)"}
PAPER = {"gan": (15.12, 0.10), "nfm_gan": (13.15, 0.06)}     # NFM Table 4, CIFAR-10 FID (Inception)
# --quick: the micro GAN on scikit-learn's digits, a few steps, a small scorer (tests/training/test_gan_training.py)
QUICK = {"data.task": "digits", "data.params:": {"size": 16}, "data.max_samples": 96, "data.batch_size": 8,
         "max_steps": 4, "checkpoint_every": 2, "log_every": 1, "gan.eval.every": 2, "gan.eval.num_samples": 64,
         "gan.eval.real_samples": 64, "gan.eval.batch_size": 32, "gan.eval.classifier_epochs": 1,
         "gan.sample_every": 0, "gan.grid_size": 3}                 # "data.params:": replaced, not merged


def run_name(model: str, seed: int) -> str:
    return model if seed == 0 else f"{model}-seed{seed}"


def config(model: str, seed: int, out: Path, quick: bool):
    from modwire.training import load_config

    sets = {"seed": seed, "out_dir": out / run_name(model, seed), "progress": False, **(QUICK if quick else {})}
    return load_config(CONFIGS[model], values=sets)


@common.worker(lambda job: run_name(job[0], job[1]))
def run_job(job: tuple) -> dict:
    """Train one (model, seed) run, resuming an interrupted one; its record from its metrics."""
    model, seed, out, quick = job
    common.train_or_resume(config(model, seed, Path(out), quick))
    return {**read_run(Path(out), model, seed), "quick": quick}


def read_run(out: Path, model: str, seed: int) -> dict | None:
    """A run's record from its ``metrics.jsonl``: classifier-FID by generator step (``None``: no log)."""
    from modwire.files import read_lines

    log = out / run_name(model, seed) / "metrics.jsonl"
    if not log.is_file():
        return None
    records = [json.loads(line) for line in read_lines(log)]
    fid = {}
    for r in records:
        value = r.get("val_classifier_fid", r.get("classifier_fid"))    # the former `modwire gan` loop's name
        if value is not None:
            fid[int(r["step"])] = value
    steps = max((int(r["step"]) for r in records if "step" in r), default=0)
    return {"key": run_name(model, seed), "model": model, "seed": seed, "steps": steps, "classifier_fid": fid,
            "final_classifier_fid": fid[max(fid)] if fid else None}


def load(out: Path, models: list[str], seeds: int) -> list[dict]:
    """The records of the runs that have a log, model by model, seed by seed."""
    return [r for m in models for s in range(seeds) if (r := read_run(out, m, s)) is not None]


def format_table(results: list[dict]) -> str:
    """Per model: classifier-FID at each evaluation step (mean ± std over seeds), next to Table 4."""
    steps = sorted({s for r in results for s in r["classifier_fid"]})
    rows = []
    for model in LABELS:
        runs = [r for r in results if r["model"] == model]
        if runs:
            rows.append([LABELS[model], f"{PAPER[model][0]:.2f} ± {PAPER[model][1]:.2f}", len(runs),
                         *(common.format_mean_std([r["classifier_fid"][s] for r in runs if s in r["classifier_fid"]])
                           for s in steps)])
    return common.markdown_table(["model", "paper: CIFAR-10 FID (Table 4)", "seeds",
                                  *(f"step {s}" for s in steps)], rows)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = common.parser(__doc__, None, "scikit-learn's digits, 4 steps", workers=2,
                       report="reprint the table from the runs' metrics.jsonl and rebuild OUT/study.json",
                       results="gan_fashion_mnist")
    ap.add_argument("--models", default="gan,nfm_gan", help=f"comma-separated ({', '.join(LABELS)})")
    ap.add_argument("--seeds", type=common.positive, default=3)
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in LABELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(LABELS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started, failed = time.perf_counter(), []
    if not args.report:
        jobs = [(m, s, str(args.out), args.quick) for s in range(args.seeds) for m in args.models]
        failed = common.run_grid(run_job, jobs, args.out / "results.jsonl", key=lambda j: run_name(j[0], j[1]),
                                 workers=args.workers, keep=lambda r: r.get("quick", False) == args.quick,
                                 describe=lambda r: f"classifier-FID {r['final_classifier_fid']}")
    results = load(args.out, args.models, args.seeds)
    table = format_table(results)
    if not args.report:      # the committed table.md also holds notes on the run that no log records: kept
        atomic_write_text(args.out / "table.md", table + "\n")
    print(table)
    logs = [args.out / run_name(r["model"], r["seed"]) / "metrics.jsonl" for r in results]
    common.finish_study(args.out, "gan_fashion_mnist", results, args=args, started=started,
                        seeds=common.seeds_of(results), logs=logs, script=__file__, argv=argv)
    for f in failed:
        print("FAILED", f)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
