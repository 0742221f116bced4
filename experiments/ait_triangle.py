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
  ("W/O memory" is the ViT with the preset's classifier: the authors' flattened one, Table 1's;
  with ``classifier="mean"`` it is tested equal to ``ViT`` with the same weights);
* one budget of optimizer steps for every row (``--steps``), AdamW (weight decay 0.01), lr 1e-3
  with 100 warm-up steps and a cosine decay to 1e-6, the balance loss at σ = 0.01 (AiT §5.1).

Each row is one resumable training run (``modwire.training.train``) in a pool of
single-threaded worker processes; finished rows go to ``OUT/results.jsonl`` and are skipped by
a rerun. The best checkpoint (validation on 2000 images) is scored on the 10k test images. The
table (next to the paper's) goes to ``OUT/table.md``, the validation curves to ``OUT/curves.png``.

Run: ``python experiments/ait_triangle.py`` (rows ``ait,vit,without_bottleneck``);
``--rows all`` for all of Table 2; ``--quick`` is a smoke test; ``--report`` reprints the table.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "experiments" / "results" / "ait_triangle"
DEFAULT_ROWS = ("ait", "vit", "without_bottleneck")

# Table 1 / Table 2, Triangle column (AiT-Small and its ablations), test accuracy %.
PAPER = {"ait": 99.47, "reset_memory": 99.46, "without_hopfield": 99.44, "vit": 99.47, "dense_networks": 99.46,
         "without_bottleneck": 93.33, "without_self_attention": 99.46, "without_ffn": 97.61}
LABELS = {"ait": "AiT (full)", "reset_memory": "Reset memory", "without_hopfield": "W/O Hopfield",
          "vit": "W/O memory (ViT)", "dense_networks": "Dense networks", "without_bottleneck": "W/O bottleneck",
          "without_self_attention": "W/O SA", "without_ffn": "W/O FF"}
ABLATION_OF = {"vit": "without_memory"}           # our row name → modwire.models.ait.ABLATIONS key
# Rows with the two options that keep the memory slots apart (modwire.nn.workspace, "Memory
# collapse"; not in the paper): "<row>_no_collapse".
for _row in ("ait", "without_bottleneck"):
    LABELS[f"{_row}_no_collapse"] = f"{LABELS[_row]}, no-collapse options"
    PAPER[f"{_row}_no_collapse"] = PAPER[_row]


def ablation(row: str) -> dict:
    """The row's config overrides: a Table 2 row of ``ABLATIONS``, plus ``NO_COLLAPSE`` for a
    ``*_no_collapse`` row."""
    from modwire.models.ait import ABLATIONS, NO_COLLAPSE

    base = row.removesuffix("_no_collapse")
    return {**ABLATIONS[ABLATION_OF.get(base, base)], **(NO_COLLAPSE if row != base else {})}

# The CPU-sized AiT-Small (module docstring); Table 6's workspace is the preset's.
BASE = {"model.name": "ait_small_triangle", "model.overrides.d_model": 128, "model.overrides.num_heads": 4,
        "model.overrides.ffn_hidden": 256,
        "model.overrides.embed": "{kind: patches, image_size: 64, in_channels: 1, patch_size: 16}",
        "data.task": "triangle", "data.params.size": "{train: 50000, val: 2000, test: 10000}",
        "data.batch_size": 128, "optim.name": "adamw", "optim.lr": 1e-3, "optim.weight_decay": 0.01,
        "optim.warmup_steps": 100, "optim.min_lr": 1e-6, "epochs": 1000, "checkpoint_every": 200,
        "log_every": 50, "progress": "false"}


def run_name(row: str, seed: int) -> str:
    """A run's directory and results key: the row (seed 0) or ``<row>-seed<s>``."""
    return row if seed == 0 else f"{row}-seed{seed}"


def row_overrides(row: str, steps: int, out: Path, *, quick: bool = False, seed: int = 0) -> list[str]:
    """The ``--set`` overrides of one row's training run (``seed``: initialisation and data order)."""
    sets = dict(BASE)
    for key, value in ablation(row).items():
        sets[f"model.overrides.{key}"] = str(value).lower() if isinstance(value, bool) else value
    if ablation(row).get("workspace", True):
        sets["aux_loss_weights.balance"] = 0.01      # σ of AiT §4.2
    if quick:
        sets.update({"data.params.size": "{train: 512, val: 128, test: 128}", "data.batch_size": 64,
                     "optim.warmup_steps": 2, "checkpoint_every": 0})
    sets.update({"max_steps": steps, "seed": seed, "out_dir": json.dumps(str(out / run_name(row, seed)))})
    return [f"{k}={v}" for k, v in sets.items()]


def run_row(job: tuple[str, int, str, bool, int]) -> dict:
    """Train one row (resuming an interrupted run), then score its best checkpoint on the test split."""
    row, steps, out, quick, seed = job
    key = run_name(row, seed)
    try:
        import torch

        torch.set_num_threads(1)          # two single-threaded workers beat one two-threaded on 2 cores
        from modwire.training import load_config, train

        start = time.perf_counter()
        cfg = load_config(None, row_overrides(row, steps, Path(out), quick=quick, seed=seed))
        run_dir = Path(out) / key
        resume = (run_dir / "checkpoints" / "last").exists()
        result = train(cfg, resume=resume, overwrite=not resume)
        if result["status"] != "finished":
            raise RuntimeError(f"interrupted at step {result['step']} of {steps}; rerun to resume")
        test = score_test(run_dir)
        return {"key": key, "row": row, "seed": seed, "steps": steps, "quick": quick, "val": result["best"], "test": test,
                "parameters": sum(p.numel() for p in result["model"].parameters()),
                "seconds": round(time.perf_counter() - start, 1)}
    except Exception as e:                # reported by the parent with the row; the others go on
        return {"key": key, "error": f"{type(e).__name__}: {e}"}


def score_test(run_dir: Path) -> dict:
    """``modwire eval``'s metrics of the best checkpoint on the test split."""
    from modwire.cli import main

    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        code = main(["eval", str(run_dir), "--split", "test"])
    if code != 0:
        raise RuntimeError(f"modwire eval {run_dir} --split test exited {code}")
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def run_rows(rows: list[str], steps: int, out: Path, workers: int, quick: bool, seeds: int = 1) -> list[str]:
    """Train the (row, seed) runs not yet in ``out/results.jsonl``; returns the failures."""
    from modwire.analysis.results_log import load_results, run_jobs

    path = out / "results.jsonl"
    done = load_results(path, keep=lambda r: r.get("quick", False) == quick and r.get("steps") == steps)
    jobs = [(r, steps, str(out), quick, s) for s in range(seeds) for r in rows]
    todo = [j for j in jobs if run_name(j[0], j[4]) not in done]
    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} already in {path}, {len(todo)} to train")
    if not todo:
        return []
    return run_jobs(run_row, todo, path, workers=workers, describe=lambda r: f"test top-1 {r['test']['top1']:.4f}")


def format_table(results: dict[str, dict], rows: list[str]) -> str:
    """One line per row: test top-1 of each seed and their mean ± std (sample std over seeds)."""
    lines = ["| row | paper (Triangle, %) | here: test top-1 % (mean ± std) | per seed | best val top-1 % | "
             "params | minutes per run |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        runs = sorted((r for r in results.values() if r.get("row", r["key"]) == row), key=lambda r: r.get("seed", 0))
        if not runs:
            lines.append(f"| {LABELS[row]} | {PAPER[row]:.2f} | not run | | | | |")
            continue
        tests = [100 * r["test"]["top1"] for r in runs]
        mean = sum(tests) / len(tests)
        std = (sum((t - mean) ** 2 for t in tests) / (len(tests) - 1)) ** 0.5 if len(tests) > 1 else 0.0
        vals = " / ".join(f"{100 * r['val']['top1']:.2f}" for r in runs)
        minutes = sum(r["seconds"] for r in runs) / len(runs) / 60
        lines.append(f"| {LABELS[row]} | {PAPER[row]:.2f} | {mean:.2f} ± {std:.2f} (n = {len(tests)}) | "
                     f"{' / '.join(f'{t:.2f}' for t in tests)} | {vals} | {runs[0]['parameters'] / 1e3:.0f} k | "
                     f"{minutes:.1f} |")
    return "\n".join(lines)


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
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for row, pts in curves(out, rows).items():
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, label=LABELS[row])
    ax.set(xlabel="optimizer step", ylabel="validation top-1", title="Triangle, CPU-sized AiT-Small (AiT Table 2)")
    ax.grid(alpha=0.3)
    ax.legend()
    path = out / "curves.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def report(out: Path, rows: list[str], steps: int, quick: bool = False) -> str:
    from modwire.analysis.results_log import load_results

    results = load_results(out / "results.jsonl", keep=lambda r: r.get("quick", False) == quick
                           and r.get("steps") == steps)
    table = format_table(results, rows)
    (out / "table.md").write_text(table + "\n")
    plot(out, rows)
    return table


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                    help=f"comma-separated rows, or 'all' ({', '.join(LABELS)})")
    ap.add_argument("--steps", type=int, default=3000, help="optimizer steps per row (batch 128)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per row (0, 1, ...)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (0: in this process)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny data, few steps")
    ap.add_argument("--report", action="store_true", help="only print the table of finished rows")
    args = ap.parse_args(argv)
    args.rows = list(LABELS) if args.rows == "all" else [r for r in args.rows.split(",") if r]
    unknown = [r for r in args.rows if r not in LABELS]
    if unknown:
        ap.error(f"unknown row(s) {unknown}; choose from {list(LABELS)}")
    if args.quick:
        args.steps = min(args.steps, 8)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    failed = [] if args.report else run_rows(args.rows, args.steps, args.out, args.workers, args.quick, args.seeds)
    print(report(args.out, args.rows, args.steps, args.quick))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
