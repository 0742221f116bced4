"""NFM Table 6 (and Table 7) on Sort-of-CLEVR at CPU scale: NFM(CNN) vs the CNN_MLP baseline.

The paper (NFM §4.3) extends Santoro et al.'s CNN_MLP (4 conv layers 3×3 stride 2, 24 channels,
ReLU, BatchNorm (the authors' order; ``--block-order conv_bn_relu`` the other); flatten ⊕ question
→ MLP) with NFM over its conv blocks, two passes, top-k k = 5, and reports the mean test accuracy
over three trials (Table 6):

=====================  ==============  ==============
question kind          CNN             NFM(CNN)
=====================  ==============  ==============
relational             68.26 ± 0.61    74.95 ± 1.58
non-relational         71.78 ± 9.3     79.37 ± 2
=====================  ==============  ==============

Table 7 trains without ``N`` colour-shape combinations and tests on all 12 (``--holdout N``; the
task's ``holdout`` parameter, :mod:`modwire.tasks.synthetic.sort_of_clevr`).

This runs the same comparison in a CPU budget (:func:`row_overrides`): presets
``cnn_mlp_sort_of_clevr`` and ``nfm_cnn_mlp_sort_of_clevr`` on task ``sort_of_clevr_image``, the
same optimizer budget for both (``--steps`` Adam steps at ``--batch``, lr 1e-3 with a short warm-up
and a cosine decay; the paper's schedule is in its Appendix C, which we do not have), training
images ``--train-images`` (20 questions each), the best validation checkpoint (200 images) scored on
``--test-images`` test images. ``--stem L`` runs the first ``L`` conv blocks before the NFM
(``CNNMLPConfig.stem_layers``; 0 = the NFM wraps all four, as the paper describes).

Each (row, seed) is one resumable training run (``modwire.training.train``) in a pool of
single-threaded workers; finished runs go to ``OUT/results.jsonl`` (``modwire.analysis.results_log``)
and a rerun skips them. ``OUT/table.md`` holds the table next to Table 6, ``OUT/accuracy.png`` the
bar plot, ``OUT/study.json`` the study run's record (:mod:`modwire.experiments.common`). Run directories
(checkpoints) stay under ``OUT/runs/`` (not meant to be committed).

Run: ``python -m modwire.experiments.nfm_sort_of_clevr`` (3 seeds of both rows); ``--quick`` is a smoke
test; ``--report`` reprints the table and rebuilds ``OUT/study.json`` from ``OUT/results.jsonl`` (with
the same size arguments; no training). The committed results
(``experiments/results/nfm_sort_of_clevr/``) come from::

    python -m modwire.experiments.nfm_sort_of_clevr --rows nfm,cnn --seeds 3 --steps 1600 --batch 32 \
        --train-images 2500 --val-images 100 --test-images 200 --stem 2 --lr 2e-3 --workers 2

(``--block-order`` is part of a result's sizes: results of the earlier Conv → BN → ReLU blocks,
which carry no ``block_order``, are not reused for the default Conv → ReLU → BN.)

i.e. 51k training questions per run (about one epoch of 2,500 images; the paper trains on 9,800
images for many epochs), with the NFM over the last two conv blocks (``--stem 2``: the readers at
the 75×75 and 38×38 resolutions make a step several times slower on a CPU) — a budget check of
the mechanism, not of the paper's numbers (``notes.md`` there says which NFM core trained what).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from modwire.experiments import common

PRESETS = {"cnn": "cnn_mlp_sort_of_clevr", "nfm": "nfm_cnn_mlp_sort_of_clevr",
           "nfm_one_pass": "nfm_cnn_mlp_sort_of_clevr"}
LABELS = {"cnn": "CNN", "nfm": "NFM(CNN)", "nfm_one_pass": "NFM(CNN), one pass (§4.7)"}
ROW_OVERRIDES = {"nfm_one_pass": {"nfm.passes": 1}}
KINDS = ("relational", "non_relational")
# Table 6 (mean ± std over 3 trials, test %); §4.7: one pass 73.07 ± 1.17 relational.
PAPER = {("cnn", "relational"): (68.26, 0.61), ("nfm", "relational"): (74.95, 1.58),
         ("cnn", "non_relational"): (71.78, 9.3), ("nfm", "non_relational"): (79.37, 2.0),
         ("nfm_one_pass", "relational"): (73.07, 1.17)}
# Table 7: N held-out combinations → (CNN, NFM(CNN)) mean test % per question kind.
PAPER_HOLDOUT = {1: {"relational": (57.67, 54.67), "non_relational": (57.0, 59.0)},
                 2: {"relational": (47.0, 46.0), "non_relational": (54.33, 57.0)},
                 3: {"relational": (20.66, 38.33), "non_relational": (42.33, 49.67)}}


def run_name(row: str, seed: int, holdout: int = 0) -> str:
    """A run's directory and results key: ``<row>[-holdout<N>]-seed<s>``."""
    return f"{row}{f'-holdout{holdout}' if holdout else ''}-seed{seed}"


def row_overrides(row: str, a: argparse.Namespace, seed: int, out: Path) -> dict:
    """The config values of one (row, seed) training run (``load_config(values=...)``); ``a`` holds
    the sizes (:func:`parse`)."""
    steps_per_epoch = max(1, 20 * a.train_images // a.batch)
    sets = {"model.name": PRESETS[row], "data.task": "sort_of_clevr_image",
            "data.params.size": {"train": a.train_images, "val": a.val_images, "test": a.test_images},
            "data.params.holdout": a.holdout, "data.batch_size": a.batch,
            "optim.name": "adamw", "optim.lr": a.lr, "optim.weight_decay": 0.0, "optim.grad_clip": 0.0,
            "optim.warmup_steps": max(1, a.steps // 20), "optim.min_lr": a.lr / 100,
            "epochs": max(1, -(-a.steps // steps_per_epoch)), "max_steps": a.steps, "seed": seed,
            "checkpoint_every": 0 if a.quick else 250, "log_every": 50, "progress": False,
            "out_dir": out / "runs" / run_name(row, seed, a.holdout),
            "model.overrides.block_order": a.block_order}
    if row != "cnn":
        sets["model.overrides.stem_layers"] = a.stem
    for key, value in ROW_OVERRIDES.get(row, {}).items():
        sets[f"model.overrides.{key}"] = value
    if a.quick:
        sets["model.overrides.hidden"] = 32
    return sets


@common.worker(lambda job: run_name(job[0], job[1], job[2]["holdout"]))
def run_job(job: tuple[str, int, dict]) -> dict:
    """Train one (row, seed) run (resuming an interrupted one), then score its best checkpoint on test."""
    row, seed, args = job
    a = argparse.Namespace(**args)
    from modwire.training import load_config

    key = run_name(row, seed, a.holdout)
    result = common.train_or_resume(load_config(values=row_overrides(row, a, seed, Path(a.out))))
    test = common.eval_run(Path(a.out) / "runs" / key)
    test["checkpoint"] = Path(test["checkpoint"]).relative_to(a.out).as_posix()    # no absolute paths
    return {"key": key, "row": row, "seed": seed, "holdout": a.holdout, "sizes": sizes(a), "val": result["best"],
            "test": test, "parameters": sum(p.numel() for p in result["model"].parameters())}


def sizes(a: argparse.Namespace) -> dict:
    """What makes two results comparable (a rerun with other sizes trains again)."""
    return {"steps": a.steps, "batch": a.batch, "train_images": a.train_images, "test_images": a.test_images,
            "lr": a.lr, "stem": a.stem, "quick": a.quick, "block_order": a.block_order}


def comparable(a: argparse.Namespace):
    """Which records of the results log were trained with ``a``'s sizes and holdout. A record from
    before ``block_order`` was recorded trained the Conv → BN → ReLU blocks of that time."""
    def keep(r: dict) -> bool:
        got = r.get("sizes")
        got = {**got, "block_order": got.get("block_order", "conv_bn_relu")} if isinstance(got, dict) else got
        return got == sizes(a) and r.get("holdout", 0) == a.holdout
    return keep


def load(a: argparse.Namespace) -> dict[str, dict]:
    from modwire.analysis.results_log import load_results

    return load_results(a.out / "results.jsonl", keep=comparable(a))


def run_all(a: argparse.Namespace) -> list[str]:
    """Train the (row, seed) runs not yet in ``OUT/results.jsonl``; returns the failures."""
    args = {**vars(a), "out": str(a.out)}
    jobs = [(row, s, args) for row in a.rows for s in range(a.seeds)]   # the slow rows first: --rows nfm,cnn
    return common.run_grid(run_job, jobs, a.out / "results.jsonl", key=lambda j: run_name(j[0], j[1], a.holdout),
                           workers=a.workers, keep=comparable(a),
                           describe=lambda r: (
                               f"test relational {r['test'].get('top1_relational', float('nan')):.4f}, "
                               f"non-relational {r['test'].get('top1_non_relational', float('nan')):.4f}"))


def summary(results: dict[str, dict], row: str) -> dict[str, list[float]]:
    """Test accuracy % per question kind, one value per seed (in seed order)."""
    runs = sorted((r for r in results.values() if r["row"] == row), key=lambda r: r["seed"])
    return {kind: [100 * r["test"][f"top1_{kind}"] for r in runs] for kind in KINDS}


def paper_cell(row: str, kind: str, holdout: int) -> str:
    if holdout:
        got = PAPER_HOLDOUT.get(holdout, {}).get(kind)
        return f"{got[row == 'nfm']:.2f}" if got and row in ("cnn", "nfm") else "n/a"
    got = PAPER.get((row, kind))
    return f"{got[0]:.2f} ± {got[1]:.2f}" if got else "n/a"


def format_table(results: dict[str, dict], a: argparse.Namespace) -> str:
    """Per row and question kind: the paper's Table 6 (or Table 7 with ``--holdout``) cell, our
    mean ± std over seeds, each seed, parameters and minutes per run."""
    which = f"Table 7, N = {a.holdout}" if a.holdout else "Table 6"
    lines = []
    for row in a.rows:
        got = summary(results, row)
        runs = [r for r in results.values() if r["row"] == row]
        extra = ([f"{runs[0]['parameters'] / 1e3:.0f} k", f"{sum(r['seconds'] for r in runs) / len(runs) / 60:.1f}"]
                 if runs else ["", ""])
        lines += [[LABELS[row], kind.replace("_", "-"), paper_cell(row, kind, a.holdout),
                   common.format_mean_std(got[kind], n=True), " / ".join(f"{v:.2f}" for v in got[kind]), *extra]
                  for kind in KINDS]
    return common.markdown_table(["model", "question kind", f"paper ({which}), %", "here: test % (mean ± std)",
                                  "per seed", "params", "minutes per run"], lines)


def plot(results: dict[str, dict], a: argparse.Namespace, path: Path) -> Path | None:
    """Bars: mean test accuracy per model and question kind (error bars: std over seeds), the
    paper's values (NFM Table 6 / 7) as black markers."""
    def draw(fig, ax):
        width = 0.8 / max(1, len(a.rows))
        for j, row in enumerate(a.rows):
            got = summary(results, row)
            for i, kind in enumerate(KINDS):
                x = i + (j - (len(a.rows) - 1) / 2) * width
                if got[kind]:
                    m, s = common.mean_std(got[kind])
                    ax.bar(x, m, width, yerr=s, color=f"C{j}", label=LABELS[row] if i == 0 else None, capsize=3)
                cell = paper_cell(row, kind, a.holdout)
                if cell != "n/a":
                    ax.plot(x, float(cell.split(" ")[0]), "k_", ms=18, mew=2,
                            label="paper" if (i, j) == (0, 0) else None)
        ax.set_xticks(range(len(KINDS)), ["relational", "non-relational"])
        ax.set(ylabel="test accuracy %", ylim=(0, 100),
               title=f"Sort-of-CLEVR, CPU-sized (NFM {'Table 7, N = %d' % a.holdout if a.holdout else 'Table 6'})")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return common.save_figure(path, draw)


def report(a: argparse.Namespace) -> str:
    results = load(a)
    table = format_table(results, a)
    suffix = f"_holdout{a.holdout}" if a.holdout else ""
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"table{suffix}.md").write_text(table + "\n")
    plot(results, a, a.out / f"accuracy{suffix}.png")
    return table


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = common.parser(__doc__, None, "tiny data, few steps", workers=2,
                       report="only print the table of finished runs", results="nfm_sort_of_clevr")
    ap.add_argument("--rows", default="cnn,nfm", help=f"comma-separated rows ({', '.join(LABELS)})")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per row (0, 1, ...)")
    ap.add_argument("--steps", type=int, default=1500, help="optimizer steps per run")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--train-images", type=int, default=2400, help="training images (20 questions each)")
    ap.add_argument("--val-images", type=int, default=100)
    ap.add_argument("--test-images", type=int, default=200)
    ap.add_argument("--stem", type=int, default=0, help="conv blocks before the NFM (stem_layers)")
    ap.add_argument("--block-order", default="conv_relu_bn", choices=["conv_relu_bn", "conv_bn_relu"],
                    help="conv block order (CNNMLPConfig.block_order; default: the authors' Conv → ReLU → BN)")
    ap.add_argument("--holdout", type=int, default=0, help="Table 7: colour-shape pairs held out of training")
    a = ap.parse_args(argv)
    a.rows = [r for r in a.rows.split(",") if r]
    unknown = [r for r in a.rows if r not in LABELS]
    if unknown:
        ap.error(f"unknown row(s) {unknown}; choose from {list(LABELS)}")
    if a.quick:
        a.steps, a.batch, a.train_images, a.val_images, a.test_images = min(a.steps, 4), 8, 2, 1, 2
        a.stem = max(a.stem, 2)                # the 75×75 and 38×38 readers are the slow ones on a CPU
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    started = time.perf_counter()
    failed = [] if a.report else run_all(a)
    print(report(a))
    results = [r for r in load(a).values() if r["row"] in a.rows]
    seeds = common.seeds_of(results) if a.report else range(a.seeds)
    common.finish_study(a.out, "nfm_sort_of_clevr", results, args=a, started=started, seeds=seeds,
                        logs=[a.out / "results.jsonl"], script=__file__, argv=argv)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
