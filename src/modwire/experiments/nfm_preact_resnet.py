"""NFM Table 2 (§4.4) at CPU scale: a PreActResNet classifier with and without NFM, and §4.4's
robustness to one 16×16 occluding box.

The paper (NFM §4.4, Table 2) wraps PreActResNet-18 / 34 / 50 in NFM (two passes, top-k k = 5,
d_k = d_v = 16, 4 heads), trains both with Input Mixup (α = 1) and Verma et al.'s procedure (2000
epochs, GPU), and reports % test accuracy, e.g. CIFAR-10 PreActResNet-18 96.27 ± 0.2 vs NFM
96.56 ± 0.09 (:data:`PAPER`); on CIFAR-10 with one 16×16 Cutout box per test image, never seen in
training, 82.46 % vs 84.11 % (§4.4, :data:`PAPER_OCCLUSION`).

This runs the same comparison in a CPU budget, with the committed CPU recipe
(``configs/cpu/nfm_preact_resnet_fashion_mnist.yaml`` and its base
``configs/cpu/preact_resnet_fashion_mnist.yaml``: the CIFAR stem, 3 stages of one block at 8 / 16 /
32 channels, NFM as in Table 2, Input Mixup α 1, SGD lr 0.05 with warm-up and cosine decay, batch 64):

* data: Fashion-MNIST padded to 32×32 (Debian's ``dataset-fashion-mnist``, or ``--data-root DIR``
  holding the four idx files), not CIFAR: only the base-vs-NFM comparison is comparable, not the
  absolute numbers;
* rows: ``base`` (PreActResNet) and ``nfm`` (NFM(PreActResNet)), ``--seeds`` seeds each; the seed
  sets the initialisation, the stratified draw of the training images, their order and the Mixup
  draws, and the last three do not depend on the model, so both rows of a seed see the same data;
* one budget: ``--steps`` SGD steps (200) of batch 64 over ``--samples`` training images
  (``data.max_samples``; default ``max(64 × steps, 10000)``, so one epoch covers the steps), with
  ``epochs: 1``. ``data.max_samples`` also cuts the test split, which is whole (10,000 images)
  from 10,000 on;
* the test score is that of the LAST checkpoint: the recipe validates on the test split
  (``val_split: test``), so a run of one epoch validates exactly once, at its last step, and no
  checkpoint is ever selected on the test split (:func:`run_job` checks that the one validation is
  at the last step; ``test`` is that validation);
* occlusion (``--occlusion 16``; 0: off): the last checkpoint scored on the same test images, each
  with one Cutout box (``modwire.analysis.occlusion``, as ``modwire eval RUN --occlusion 16``: box
  seed 0, the same boxes for every model and seed). The box sets pixels to 0, Fashion-MNIST's black
  background (CIFAR's Cutout zeroes the normalised image, i.e. the mean); a 16×16 box on a 32×32
  image covers the same fraction as on CIFAR.

Each (model, seed) is one resumable training run (``modwire.training.train``) in a pool of
single-threaded workers; finished runs go to ``OUT/results.jsonl`` (one record per (model, seed):
``{"model", "seed", "test": {"top1", ...}, "occluded": {"top1", ...}, "parameters", "seconds", ...}``)
and a rerun skips them; the table next to the paper's goes to ``OUT/table.md``, the study run's
record to ``OUT/study.json`` (:mod:`modwire.experiments.common`). Run directories (checkpoints) stay under
``OUT/runs/`` (not committed).

Run: ``python -m modwire.experiments.nfm_preact_resnet`` (3 seeds of both rows, 200 steps, 2 workers);
``--quick`` is a smoke test; ``--report`` reprints the table and rebuilds ``OUT/study.json`` from
``OUT/results.jsonl`` (with the same size arguments; no training). The committed results
(``experiments/results/nfm_preact_resnet/study.json``) come from
``python -m modwire.experiments.nfm_preact_resnet --seeds 3 --workers 2`` (each run's wall time is the
``seconds`` of its record; the NFM's readers dominate it at this width).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from modwire.experiments import common
from modwire.files import atomic_write_text

CONFIGS = {"base": common.CONFIGS / "cpu" / "preact_resnet_fashion_mnist.yaml",
           "nfm": common.CONFIGS / "cpu" / "nfm_preact_resnet_fashion_mnist.yaml"}
LABELS = {"base": "PreActResNet", "nfm": "NFM(PreActResNet)"}
TEST_IMAGES = 10_000                         # Fashion-MNIST's test split
# NFM Table 2, % test accuracy, as printed: (dataset, base architecture, baseline, NFM).
PAPER = (("CIFAR-10", "PreResNet18", "96.27 ± 0.2", "96.56 ± 0.09"),
         ("CIFAR-10", "PreResNet34", "96.79 ± 0.1", "97.05 ± 0.1"),
         ("CIFAR-10", "PreResNet50", "97.31 ± 0.1", "97.58 ± 0.2"),
         ("CIFAR-100", "PreResNet18", "78.15 ± 0.1", "78.66 ± 0.3"),
         ("CIFAR-100", "PreResNet34", "80.13 ± 0.3", "80.77 ± 0.1"),
         ("Tiny-Imagenet", "PreResNet18", "57.12 ± 0.3", "58.32 ± 0.2"),
         ("Imagenet", "PreResNet18", "76.72", "77.1"))
# NFM §4.4: CIFAR-10, PreActResNet-18, one 16×16 occlusion box per test image (baseline, NFM).
PAPER_OCCLUSION = ("CIFAR-10, one 16×16 box (§4.4)", "PreResNet18", "82.46", "84.11")


def run_name(model: str, seed: int) -> str:
    """A run's directory (under ``OUT/runs``) and results key: ``<model>-seed<s>``."""
    return f"{model}-seed{seed}"


def sizes(a: argparse.Namespace) -> dict:
    """What makes two results comparable (a rerun with other sizes trains again)."""
    return {"steps": a.steps, "batch": a.batch, "samples": a.samples, "occlusion": a.occlusion, "quick": a.quick}


def overrides(model: str, seed: int, a: argparse.Namespace) -> dict:
    """The config values of one (model, seed) run on top of :data:`CONFIGS` ``[model]``
    (``load_config(values=...)``): one epoch of ``a.samples`` images that holds all ``a.steps`` steps
    (one validation, at the end)."""
    sets = {"max_steps": a.steps, "epochs": 1, "data.max_samples": a.samples, "data.batch_size": a.batch,
            "seed": seed, "progress": False, "checkpoint_every": 0 if a.quick else 100, "log_every": 25,
            "out_dir": Path(a.out) / "runs" / run_name(model, seed)}
    if a.data_root is not None:
        sets["data.params.root"] = str(a.data_root)
    if a.quick:
        sets["optim.warmup_steps"] = 1
    return sets


def eval_set(cfg):
    """The run's validation set as it trained on it (the test split, ``data.max_samples`` of it drawn
    by the run's seed, the run's eval transform) and the task's description."""
    from modwire.tasks import build_dataset, describe_task, get_task
    from modwire.training import apply_augmentation

    d = cfg.data
    dataset = build_dataset(d.task, d.val_split, max_samples=d.max_samples, sample_seed=cfg.seed, **d.params)
    _, dataset, _ = apply_augmentation(cfg, get_task(d.task), dataset, dataset)
    return dataset, describe_task(d.task, d.params)


def score_last(run_dir: Path, occlusion: int = 0, box_seed: int = 0) -> dict:
    """Loss and top-1 of the run's LAST checkpoint on its test images, each with one
    ``occlusion``×``occlusion`` Cutout box (NFM §4.4; boxes drawn from ``(box_seed, index)``), or clean (0)."""
    import torch

    from modwire.analysis.occlusion import OccludedDataset
    from modwire.analysis.runs import load_run
    from modwire.training import evaluate, make_loader
    from modwire.training.checkpoint import checkpoint_step

    last = (Path(run_dir) / "checkpoints" / "last").resolve()
    cfg, model, _, _ = load_run(last)
    dataset, info = eval_set(cfg)
    extra = {}
    if occlusion:
        dataset = OccludedDataset(dataset, occlusion, seed=box_seed)
        extra = {"size": occlusion, "box_seed": box_seed}
    loader = make_loader(dataset, cfg.data.batch_size, None, info, 0, drop_last=False)
    metrics = evaluate(model, loader, info, torch.device("cpu"))
    return {**metrics, "split": cfg.data.val_split, "samples": len(dataset), "step": checkpoint_step(last),
            "checkpoint": "last", **extra}


@common.worker(lambda job: run_name(job[0], job[1]))
def run_job(job: tuple[str, int, dict]) -> dict:
    """Train one (model, seed) run (resuming an interrupted one); its test score is its one validation,
    at the last step; then the last checkpoint under one occluding box."""
    model, seed, args = job
    a = argparse.Namespace(**args)
    from modwire.training import load_config

    start = time.perf_counter()
    cfg = load_config(CONFIGS[model], values=overrides(model, seed, a))
    result = common.train_or_resume(cfg)
    train_seconds = time.perf_counter() - start
    if result["step"] != a.steps or (result["best"] or {}).get("step") != a.steps:
        raise RuntimeError(f"expected one validation at step {a.steps}, the run ended at step {result['step']} "
                           f"with its best validation at {result['best']}: --samples too few for --steps?")
    run_dir = Path(a.out) / "runs" / run_name(model, seed)
    test = {**result["val"], "split": "test", "samples": len(eval_set(cfg)[0]),
            "step": result["step"], "checkpoint": "last"}
    occluded = score_last(run_dir, a.occlusion) if a.occlusion else None
    return {"key": run_name(model, seed), "model": model, "seed": seed, "sizes": sizes(a), "test": test,
            "occluded": occluded, "parameters": sum(p.numel() for p in result["model"].parameters()),
            "train_seconds": round(train_seconds, 1)}


def comparable(a: argparse.Namespace):
    return lambda r: r.get("sizes") == sizes(a)


def load(a: argparse.Namespace) -> dict[str, dict]:
    """The finished runs of ``OUT/results.jsonl`` trained with ``a``'s sizes."""
    from modwire.analysis.results_log import load_results

    return load_results(Path(a.out) / "results.jsonl", keep=comparable(a))


def run_all(a: argparse.Namespace) -> list[str]:
    """Train the (model, seed) runs not yet in ``OUT/results.jsonl`` (NFM first: the slow row); returns
    the failures."""
    args = {**vars(a), "out": str(a.out), "data_root": None if a.data_root is None else str(a.data_root)}
    jobs = [(m, s, args) for m in sorted(a.models, key=lambda m: m != "nfm") for s in range(a.seeds)]
    return common.run_grid(run_job, jobs, Path(a.out) / "results.jsonl", key=lambda j: run_name(j[0], j[1]),
                           workers=a.workers, keep=comparable(a), describe=describe)


def describe(r: dict) -> str:
    occluded = f", occluded {100 * r['occluded']['top1']:.2f} %" if r.get("occluded") else ""
    return f"test top-1 {100 * r['test']['top1']:.2f} %{occluded} ({r['train_seconds'] / 60:.1f} min training)"


def per_seed(results: dict[str, dict], model: str, field: str) -> list[float]:
    """``field``'s top-1 % of ``model``'s runs, in seed order (runs without it left out)."""
    runs = sorted((r for r in results.values() if r["model"] == model and r.get(field)), key=lambda r: r["seed"])
    return [100 * r[field]["top1"] for r in runs]


def paired(results: dict[str, dict], field: str) -> list[float]:
    """NFM − base top-1 % per seed that both rows ran (same data and steps)."""
    by = {(r["model"], r["seed"]): r for r in results.values() if r.get(field)}
    seeds = sorted(s for m, s in by if m == "nfm" and ("base", s) in by)
    return [100 * (by["nfm", s][field]["top1"] - by["base", s][field]["top1"]) for s in seeds]


def format_table(results: dict[str, dict], a: argparse.Namespace) -> str:
    """Per model: parameters, test top-1 % and top-1 % under one occluding box (mean ± std over seeds,
    and each seed), minutes per run; then NFM − base paired by seed."""
    lines = []
    for m in a.models:
        runs = [r for r in results.values() if r["model"] == m]
        clean, occluded = per_seed(results, m, "test"), per_seed(results, m, "occluded")
        extra = ([f"{runs[0]['parameters'] / 1e3:.1f} k", f"{sum(r['seconds'] for r in runs) / len(runs) / 60:.1f}"]
                 if runs else ["", ""])
        lines.append([LABELS[m], extra[0], common.format_mean_std(clean, n=True), " / ".join(f"{v:.2f}" for v in clean),
                      common.format_mean_std(occluded, n=True), " / ".join(f"{v:.2f}" for v in occluded), extra[1]])
    box = f"one {a.occlusion}×{a.occlusion} box" if a.occlusion else "occluded (off)"
    table = common.markdown_table(["model", "parameters", "test top-1 % (mean ± std)", "per seed",
                                   f"{box}: test top-1 %", "per seed", "minutes per run"], lines)
    diffs = [f"{name} {common.format_mean_std(paired(results, field), n=True, empty='n/a')}"
             for name, field in (("clean", "test"), ("occluded", "occluded"))]
    return table + "\n\nNFM − base, points of top-1, paired by seed (same data and steps): " + "; ".join(diffs) + "."


def format_paper() -> str:
    """NFM Table 2 and the §4.4 occlusion numbers, as the paper prints them."""
    return common.markdown_table(["Methods", "Base Arch.", "Baseline", "NFM"], [*PAPER, PAPER_OCCLUSION])


def header(a: argparse.Namespace, results: dict[str, dict]) -> str:
    counts = sorted({r["test"].get("samples") for r in results.values()} - {None})
    images = " / ".join(f"{n:,}" for n in counts) or "the"
    return (f"NFM Table 2 at CPU scale{' (quick smoke run)' if a.quick else ''}: Fashion-MNIST 32×32, "
            f"PreActResNet with 3 stages of one block (8 / 16 / 32 channels) with and without NFM (two passes, "
            f"k 5, 4 heads × 16), Input Mixup α 1, {a.steps} SGD steps of batch {a.batch} (one epoch of "
            f"{a.samples:,} training images); test top-1 % of the last checkpoint on {images} test images, "
            f"mean ± std over seeds.")


def report(a: argparse.Namespace) -> str:
    """``OUT/table.md``: our rows, then the paper's Table 2 as printed."""
    results = load(a)
    text = "\n\n".join([header(a, results), format_table(results, a),
                        "NFM Table 2 (% test accuracy, as printed; CIFAR / Tiny-ImageNet / ImageNet, full-size "
                        "networks, 2000 epochs on GPUs: our data and scale differ, compare only the sign and "
                        "size of the NFM − base gap):", format_paper()])
    Path(a.out).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(a.out) / "table.md", text + "\n")
    return text


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = common.parser(__doc__, None, "4 steps of batch 16 on 64 images (and 64 test images)", workers=2,
                       report="only print the table of finished runs and rebuild OUT/study.json (no training)",
                       results="nfm_preact_resnet")
    ap.add_argument("--models", default="base,nfm", help=f"comma-separated rows ({', '.join(LABELS)})")
    ap.add_argument("--seeds", type=common.positive, default=3, help="seeds per row (0, 1, ...)")
    ap.add_argument("--steps", type=common.positive, default=200, help="SGD steps per run")
    ap.add_argument("--batch", type=common.positive, default=64)
    ap.add_argument("--samples", type=common.positive, default=None,
                    help="data.max_samples: training images (and test images below 10,000); default "
                         "max(batch × steps, 10000)")
    ap.add_argument("--occlusion", type=int, default=16, help="side of the one occluding box per test image (0: off)")
    ap.add_argument("--data-root", type=Path, default=None,
                    help="the directory of Fashion-MNIST's four idx files (default: where Debian's "
                         "dataset-fashion-mnist installs them)")
    a = ap.parse_args(argv)
    a.models = [m for m in a.models.split(",") if m]
    unknown = [m for m in a.models if m not in LABELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(LABELS)}")
    if a.occlusion < 0:
        ap.error(f"--occlusion {a.occlusion}: the side of a box in pixels, or 0 for none")
    if a.quick:
        a.steps, a.batch, a.samples = min(a.steps, 4), 16, 64
    a.samples = a.samples or max(a.batch * a.steps, TEST_IMAGES)
    if a.samples // a.batch < a.steps:
        ap.error(f"--samples {a.samples} makes {a.samples // a.batch} steps of batch {a.batch}, fewer than --steps "
                 f"{a.steps}: a run trains one epoch so that its one validation is at its last step")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    started = time.perf_counter()
    failed = [] if a.report else run_all(a)
    print(report(a))
    for f in failed:
        print("FAILED", f)
    results = sorted((r for r in load(a).values() if r["model"] in a.models), key=lambda r: (r["model"], r["seed"]))
    seeds = common.seeds_of(results) if a.report else range(a.seeds)
    common.finish_study(Path(a.out), "nfm_preact_resnet", results, args=a, started=started, seeds=seeds,
                        logs=[Path(a.out) / "results.jsonl"], script=__file__, argv=argv)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
