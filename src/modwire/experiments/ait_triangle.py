"""AiT Tables 1-2 on Triangle at CPU scale: AiT vs ViT, and the ablations of Table 2.

The paper trains AiT-Small and ViT-Small (2 blocks, 768-d, 12 heads, MLP 3072) on Triangle
(64×64 one-channel images, 50k train / 10k test, "equilateral or not"; AiT App. A.1) for 100
epochs at batch 512, patch 32, with a workspace of 32 slots × 32-d, 8 bottleneck heads and a
bottleneck of k = 64 patches out of a pool of 2.0k (Table 6), AdamW (weight decay 0.01), cosine
schedule with warm-up (§5.1). Table 1: AiT-Small 99.47 %, ViT-Small 99.47 %; Table 2's Triangle
column: W/O bottleneck 93.33 %, every other ablation 97.6-99.5 %.

This runs the same comparison in a CPU budget (:data:`BASE`):

* the blocks are narrowed to 128-d, 4 heads, MLP 256, and the image is cut into 16×16 patches
  (16 tokens) at batch 128, so the pool is the paper's 2048 patches with the paper's workspace
  (32 slots × 32-d, 8 heads, k = 64): what the CPU cannot afford is the width, not the
  mechanism;
* every row of Table 2 is the same preset with :data:`modwire.models.ait.ABLATIONS`'s overrides
  ("W/O memory" is the AiT paper's ViT, the authors' ViT: tested equal to ``ViT`` with the same
  weights); ``ait`` is modwire's defaults (the paper's write, top-k and end-to-end gradient, the
  authors' block); ``ait_authors`` is the network the authors released
  (:data:`modwire.models.ait.AUTHORS_AIT`: their residual write, renormalised top-k, detached write);
* one budget of optimizer steps for every row (``--steps``), AdamW (weight decay 0.01), lr 1e-3
  with 100 warm-up steps and a cosine decay to 1e-6, the balance loss at σ = 0.01 (AiT §5.1).

Each row is one resumable training run (``modwire.training.train``) in a pool of
single-threaded worker processes; finished rows go to ``OUT/results.jsonl`` and are skipped by
a rerun. The best checkpoint (validation on 2000 images) is scored on the 10k test images. The
table (next to the paper's) goes to ``OUT/table.md``, the validation curves to ``OUT/curves.png``,
the study run's record to ``OUT/study.json`` (:mod:`modwire.experiments.common`).

Run: ``python -m modwire.experiments.ait_triangle`` (rows ``ait,vit,without_bottleneck,ait_authors``);
``--rows all`` for all of Table 2 and ``ait_authors``; the rows ``ait_no_collapse`` and
``without_bottleneck_no_collapse`` (:data:`modwire.models.ait.NO_COLLAPSE`, in neither the paper nor
the authors' code) are kept for the committed runs of earlier code that have them, and run only
when named; so do ``ait_positions`` and ``vit_positions`` (learned absolute positions added to the
patch tokens, which the authors' embedding does not have: they measure that choice) and
``ait_conv_embedding`` / ``vit_conv_embedding`` (modwire's former embedding: a strided conv without the
patch LayerNorms, and learned positions) and ``vit_pre35`` (the ViT row as it ran before issue 35: that
embedding, query / value biases, no weight decay on biases and norms); ``--quick`` is a smoke test; ``--report`` reprints the table and
rebuilds ``OUT/study.json`` from ``OUT/results.jsonl`` (no training; a record of an early run without a
``seed`` is seed 0, as the table counts it).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from modwire.experiments import common
from modwire.files import atomic_write_text

DEFAULT_ROWS = ("ait", "vit", "without_bottleneck", "ait_authors")

# Table 1 / Table 2, Triangle column (AiT-Small and its ablations), test accuracy %.
PAPER = {"ait": 99.47, "reset_memory": 99.46, "without_hopfield": 99.44, "vit": 99.47, "dense_networks": 99.46,
         "without_bottleneck": 93.33, "without_self_attention": 99.46, "without_ffn": 97.61}
LABELS = {"ait": "AiT (full)", "reset_memory": "Reset memory", "without_hopfield": "W/O Hopfield",
          "vit": "W/O memory (ViT)", "dense_networks": "Dense networks", "without_bottleneck": "W/O bottleneck",
          "without_self_attention": "W/O SA", "without_ffn": "W/O FF"}
ABLATION_OF = {"vit": "without_memory"}           # our row name → modwire.models.ait.ABLATIONS key
LABELS["ait_authors"], PAPER["ait_authors"] = "AiT, the authors' released network", PAPER["ait"]
ALL_ROWS = tuple(LABELS)                          # --rows all
# Rows with the two options once offered against the memory collapse (NO_COLLAPSE; in neither the paper
# nor the authors' code): "<row>_no_collapse", in the committed runs of earlier code.
for _row in ("ait", "without_bottleneck"):
    LABELS[f"{_row}_no_collapse"] = f"{LABELS[_row]}, no-collapse options"
    PAPER[f"{_row}_no_collapse"] = PAPER[_row]
# Rows that measure the patch embedding's one departure from a standard ViT: the authors' embedding has no
# positions (docs/ait.md); "<row>_positions" adds learned absolute positions to the patch tokens.
# "<row>_conv_embedding": modwire's former embedding (before issue 35), a strided conv (no patch
# LayerNorms) and learned positions: with "_positions" it separates the positions from the LayerNorms.
EMBEDDINGS = {"_positions": {"tokenizer.positions": "absolute"},
              "_conv_embedding": {"tokenizer.positions": "absolute", "tokenizer.patch_norm": False}}
# "vit_pre35": the ViT row as it ran before issue 35 (that embedding, query / value biases, no weight
# decay on biases and norms), to tell whether anything else changed since.
FORMER_VIT = {**EMBEDDINGS["_conv_embedding"], "qv_bias": True}
LABELS["vit_pre35"], PAPER["vit_pre35"] = "W/O memory (ViT) as before issue 35", PAPER["vit"]
for _row in ("ait", "vit"):
    LABELS[f"{_row}_positions"] = f"{LABELS[_row]}, learned positions"
    LABELS[f"{_row}_conv_embedding"] = f"{LABELS[_row]}, conv embedding and positions"
    PAPER[f"{_row}_positions"] = PAPER[f"{_row}_conv_embedding"] = PAPER[_row]


def ablation(row: str) -> dict:
    """The row's config overrides: a Table 2 row of ``ABLATIONS``, ``AUTHORS_AIT`` for ``ait_authors``,
    plus ``NO_COLLAPSE`` for a ``*_no_collapse`` row."""
    from modwire.models.ait import ABLATIONS, AUTHORS_AIT, NO_COLLAPSE

    if row == "ait_authors":
        return dict(AUTHORS_AIT)
    if row == "vit_pre35":
        return {**ABLATIONS["without_memory"], **FORMER_VIT}
    for suffix, embedding in EMBEDDINGS.items():
        if row.endswith(suffix):
            base = row.removesuffix(suffix)
            return {**ABLATIONS[ABLATION_OF.get(base, base)], **embedding}
    base = row.removesuffix("_no_collapse")
    return {**ABLATIONS[ABLATION_OF.get(base, base)], **(NO_COLLAPSE if row != base else {})}

# The CPU-sized AiT-Small (module docstring); Table 6's workspace is the preset's.
BASE = {"model.name": "ait_small_triangle", "model.overrides.d_model": 128, "model.overrides.num_heads": 4,
        "model.overrides.ffn_hidden": 256,
        "model.overrides.tokenizer": {"kind": "patches", "image_size": 64, "in_channels": 1, "patch_size": 16},
        "data.task": "triangle", "data.params.size": {"train": 50000, "val": 2000, "test": 10000},
        "data.batch_size": 128, "optim.name": "adamw", "optim.lr": 1e-3, "optim.weight_decay": 0.01,
        "optim.filter_bias_and_norm": False,                  # the AiT authors' AdamW decays every parameter
        "optim.warmup_steps": 100, "optim.min_lr": 1e-6, "epochs": 1000, "checkpoint_every": 200,
        "log_every": 50, "progress": False}


def run_name(row: str, seed: int) -> str:
    """A run's directory and results key: the row (seed 0) or ``<row>-seed<s>``."""
    return row if seed == 0 else f"{row}-seed{seed}"


def row_overrides(row: str, steps: int, out: Path, *, quick: bool = False, seed: int = 0) -> dict:
    """The config values of one row's training run (``load_config(values=...)``; ``seed``:
    initialisation and data order)."""
    sets = dict(BASE)
    for key, value in ablation(row).items():
        sets[f"model.overrides.{key}"] = value
    if ablation(row).get("workspace", True):
        sets["aux_loss_weights.balance"] = 0.01      # σ of AiT §4.2
    if quick:
        sets.update({"data.params.size": {"train": 512, "val": 128, "test": 128}, "data.batch_size": 64,
                     "optim.warmup_steps": 2, "checkpoint_every": 0})
    if row == "vit_pre35":
        sets["optim.filter_bias_and_norm"] = True
    return {**sets, "max_steps": steps, "seed": seed, "out_dir": out / run_name(row, seed)}


@common.worker(lambda job: run_name(job[0], job[4]))
def run_row(job: tuple[str, int, str, bool, int]) -> dict:
    """Train one row (resuming an interrupted run), then score its best checkpoint on the test split."""
    row, steps, out, quick, seed = job
    from modwire.training import load_config

    result = common.train_or_resume(load_config(values=row_overrides(row, steps, Path(out), quick=quick, seed=seed)))
    return {"key": run_name(row, seed), "row": row, "seed": seed, "steps": steps, "quick": quick,
            "val": result["best"], "test": common.eval_run(Path(out) / run_name(row, seed)),
            "parameters": sum(p.numel() for p in result["model"].parameters())}


def budget(steps: int, quick: bool):
    """Which records of the results log were trained with this budget (a rerun with another trains again)."""
    return lambda r: r.get("quick", False) == quick and r.get("steps") == steps


def load(out: Path, steps: int, quick: bool = False) -> dict[str, dict]:
    """The finished runs in ``out/results.jsonl`` of this budget."""
    from modwire.analysis.results_log import load_results

    return load_results(out / "results.jsonl", keep=budget(steps, quick))


def run_rows(rows: list[str], steps: int, out: Path, workers: int, quick: bool, seeds: int = 1) -> list[str]:
    """Train the (row, seed) runs not yet in ``out/results.jsonl``; returns the failures."""
    jobs = [(r, steps, str(out), quick, s) for s in range(seeds) for r in rows]
    return common.run_grid(run_row, jobs, out / "results.jsonl", key=lambda j: run_name(j[0], j[4]), workers=workers,
                           keep=budget(steps, quick),
                           describe=lambda r: f"test top-1 {r['test']['top1']:.4f}")


def format_table(results: dict[str, dict], rows: list[str]) -> str:
    """One line per row: test top-1 of each seed and their mean ± std (sample std over seeds), next
    to AiT Table 1 / Table 2's Triangle column."""
    lines = []
    for row in rows:
        runs = sorted((r for r in results.values() if r.get("row", r["key"]) == row), key=lambda r: r.get("seed", 0))
        if not runs:
            lines.append([LABELS[row], f"{PAPER[row]:.2f}", "not run", "", "", "", ""])
            continue
        tests = [100 * r["test"]["top1"] for r in runs]
        lines.append([LABELS[row], f"{PAPER[row]:.2f}", common.format_mean_std(tests, n=True),
                      " / ".join(f"{t:.2f}" for t in tests), " / ".join(f"{100 * r['val']['top1']:.2f}" for r in runs),
                      f"{runs[0]['parameters'] / 1e3:.0f} k", f"{sum(r['seconds'] for r in runs) / len(runs) / 60:.1f}"])
    return common.markdown_table(["row", "paper (Triangle, %)", "here: test top-1 % (mean ± std)", "per seed",
                                  "best val top-1 %", "params", "minutes per run"], lines)


def curves(out: Path, rows: list[str]) -> dict[str, list[tuple[int, float]]]:
    """Validation top-1 over steps, per row, from each run's ``metrics.jsonl``."""
    got = {}
    for row in rows:
        log = out / row / "metrics.jsonl"
        if log.is_file():
            recs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            got[row] = [(r["step"], r["val_top1"]) for r in recs if "val_top1" in r]
    return got


def plot(out: Path, rows: list[str]) -> Path | None:
    """Validation curves of each row's seed-0 run (AiT Table 2's rows)."""
    def draw(fig, ax):
        for row, pts in curves(out, rows).items():
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=LABELS[row])
        ax.set(xlabel="optimizer step", ylabel="validation top-1", title="Triangle, CPU-sized AiT-Small (AiT Table 2)")
        ax.grid(alpha=0.3)
        ax.legend()
    return common.save_figure(out / "curves.png", draw)


def report(out: Path, rows: list[str], steps: int, quick: bool = False) -> str:
    table = format_table(load(out, steps, quick), rows)
    atomic_write_text(out / "table.md", table + "\n")
    plot(out, rows)
    return table


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = common.parser(__doc__, None, "tiny data, few steps", workers=2,
                       report="only print the table of finished rows", results="ait_triangle")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                    help=f"comma-separated rows ({', '.join(LABELS)}), or 'all' ({', '.join(ALL_ROWS)})")
    ap.add_argument("--steps", type=int, default=3000, help="optimizer steps per row (batch 128)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per row (0, 1, ...)")
    args = ap.parse_args(argv)
    args.rows = list(ALL_ROWS) if args.rows == "all" else [r for r in args.rows.split(",") if r]
    unknown = [r for r in args.rows if r not in LABELS]
    if unknown:
        ap.error(f"unknown row(s) {unknown}; choose from {list(LABELS)}")
    if args.quick:
        args.steps = min(args.steps, 8)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    failed = [] if args.report else run_rows(args.rows, args.steps, args.out, args.workers, args.quick, args.seeds)
    print(report(args.out, args.rows, args.steps, args.quick))
    results = [{"seed": 0, **r} for r in load(args.out, args.steps, args.quick).values() if r.get("row") in args.rows]
    seeds = common.seeds_of(results) if args.report else range(args.seeds)
    common.finish_study(args.out, "ait_triangle", results, args=args, started=started, seeds=seeds,
                        logs=[args.out / "results.jsonl"], script=__file__, argv=argv)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
