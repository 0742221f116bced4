"""NAC Table 1 at CPU scale: from Perceiver IO to NAC one design element at a time, in and
out of distribution, with a learning-rate / warm-up sweep (NAC §3 "Ablations", Table 1).

The paper starts from a Perceiver IO and cumulatively adds ModFC, a frozen sparse graph, then
a learned graph with each graph prior, on Tiny-ImageNet (IID) and Tiny-ImageNet-R (OOD). This
runs the same ladder on what a CPU trains in minutes, every row with the same budget:

* ``listops``: built-in ListOps with short expressions (depth ≤ 3, ≤ 64 tokens; the ``modwire.demo
  --race`` setup). OOD: expressions whose operators nest deeper than any in training (3-5
  levels against at most 2), same length range.
* ``fashion_mnist``: Fashion-MNIST (Debian's ``dataset-fashion-mnist``; scikit-learn's digits
  when it is missing). OOD: the test images rotated by 30° (a shift the model never saw, as
  ImageNet-R's renditions are for Tiny-ImageNet).

Between the paper's rows it inserts the steps that separate what NAC adds to Perceiver IO
(initial states from an MLP of the code, several confidence-weighted output modules, ModFC,
the kernel, sampled vs expected kernel in training), and ``--sweep`` trains both models at
several peak learning rates and warm-up lengths (the paper tunes them separately, Table 4:
NAC 3e-4, Perceiver IO 5e-4 at batch 512).

Each training run is one job (row, task, seed, lr, warm-up), run in a pool of single-threaded
worker processes; finished jobs are appended to ``OUT/results.jsonl`` at once, and a rerun skips
them, so an interrupted study resumes where it stopped. The table (mean ± std over seeds, next
to the paper's Table 1) is printed and written to ``OUT/table.md``, the plot to ``OUT/ladder.png``,
the study run's record to ``OUT/study.json`` (:mod:`modwire.experiments.common`).

Run: ``python -m modwire.experiments.table1_ladder`` (the default set: Table 1's four rungs, Perceiver IO,
+ ModFC, + frozen sparse graph, NAC with the scale-free prior, on both tasks with 3 seeds; about
40 minutes on 2 cores); ``--rows`` picks rows (e.g. the in-between ones), ``--full`` runs every
row with 5 seeds (about 4 hours); ``--sweep`` adds the learning-rate sweep (30 minutes a task);
``--quick`` is a smoke test. ``--report`` reprints the table from ``OUT/results.jsonl`` and rebuilds
``OUT/study.json`` from it (no training). ``experiments/results/table1_ladder/`` holds the study reported
in the README (``--report --out experiments/results/table1_ladder``; ``modwire reproduce table1_ladder``).
"""
from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from modwire.experiments import common
from modwire.files import atomic_write_text

# ----------------------------------------------------------------------------- the ladder

MO = "model.overrides."


@dataclass(frozen=True)
class Row:
    """One rung: a model preset and its config values (``load_config(values=...)``: mostly ``model.overrides``)."""

    key: str
    label: str
    model: str
    sets: Mapping[str, Any] = field(default_factory=dict)
    paper: str | None = None        # the Table 1 row it reproduces (None: an in-between step)


PIO_LIKE = {MO + "modulation": "none", MO + "kernel.enabled": False, MO + "num_output_modules": 1,
            MO + "initial_state": "code"}
NO_QV_BIAS = {MO + "qv_bias": False}   # the Perceiver IO's (the authors'); NAC Eq. 1 prints a bias b


def _pio_like_but(key: str) -> dict:
    """:data:`PIO_LIKE` without its ``key`` (that part of the NAC kept)."""
    return {k: v for k, v in PIO_LIKE.items() if k != MO + key}


def _prior(name: str, params: dict, weight: float = 5e-3) -> dict:
    return {MO + "graph_prior": {"name": name, "params": params}, "aux_loss_weights.graph": weight}


ROWS = [
    Row("pio", "Perceiver IO", "perceiver_io_small", paper="Perceiver IO"),
    Row("nac_as_pio", "NAC with everything off (= Perceiver IO)", "nac_small", {**PIO_LIKE, **NO_QV_BIAS}),
    Row("mlp_states", "Perceiver IO + initial states MLP(code) only", "nac_small",
        {**_pio_like_but("initial_state"), MO + "initial_state": "mlp", **NO_QV_BIAS}),
    Row("outputs", "Perceiver IO + 8 confidence-weighted outputs only", "nac_small",
        {**_pio_like_but("num_output_modules"), **NO_QV_BIAS}),
    Row("modfc_only", "Perceiver IO + ModFC only", "nac_small", {**_pio_like_but("modulation"), **NO_QV_BIAS}),
    Row("modfc", "+ ModFC (NAC without kernel)", "nac_small", {MO + "kernel.enabled": False}, paper="+ ModFC"),
    Row("frozen", "+ Sparse graph (not learnable)", "nac_small",
        {MO + "frozen_graph": {"name": "scale_free", "params": {"beta": 0.5}, "seed": 0}},
        paper="+ Sparse graph (not learnable)"),
    Row("nac_noprior", "NAC, no graph prior", "nac_small"),
    Row("nac_expected", "NAC, no prior, expected kernel in training", "nac_small",
        {MO + "kernel.train_mode": "expected"}),
    Row("nac_code", "NAC, no prior, states = code (free latents)", "nac_small", {MO + "initial_state": "code"}),
    Row("nac_scale_free", "NAC with Scale-Free Prior", "nac_small", _prior("scale_free", {"beta": 0.5}),
        paper="NAC with Scale-Free Prior"),
    Row("nac_planted", "NAC with Planted-Partition Prior", "nac_small",
        _prior("planted_partition", {"num_clusters": 8, "p_in": 0.9, "p_out": 0.05}),
        paper="NAC with Planted-Partition Prior"),
    Row("nac_ring", "NAC with Ring-of-Cliques Prior", "nac_small",
        _prior("ring_of_cliques", {"num_cliques": 8}), paper="NAC with Ring-of-Cliques Prior"),
    Row("nac_erdos_renyi", "NAC with Erdos-Renyi Prior", "nac_small", _prior("erdos_renyi", {"p": 0.2}),
        paper="NAC with Erdos-Renyi Prior"),
    # the LayerNorm before the read-out that both models had before issue 35 (neither the paper nor the
    # authors' final configs): how much of the ladder it moves
    Row("pio_read_out_norm", "Perceiver IO + LayerNorm before the read-out", "perceiver_io_small",
        {MO + "read_out_norm": True}),
    Row("nac_scale_free_read_out_norm", "NAC with Scale-Free Prior + LayerNorm before the read-out", "nac_small",
        {**_prior("scale_free", {"beta": 0.5}), MO + "read_out_norm": True}),
]
ROW = {r.key: r for r in ROWS}
DEFAULT_ROWS = ("pio", "modfc", "frozen", "nac_scale_free")      # NAC Table 1's ladder; ~40 min on 2 cores

# NAC Table 1 (Tiny-ImageNet val / Tiny-ImageNet-R, Acc@1), the numbers the table is printed next to.
PAPER = {"Perceiver IO": (58.89, 17.57), "+ ModFC": (58.91, 18.01), "+ Sparse graph (not learnable)": (58.31, 18.50),
         "NAC with Scale-Free Prior": (60.76, 19.52), "NAC with Planted-Partition Prior": (60.71, 19.42),
         "NAC with Ring-of-Cliques Prior": (60.54, 20.03), "NAC with Erdos-Renyi Prior": (60.33, 19.83)}


# ----------------------------------------------------------------------------- the tasks

CONFIGS = common.CONFIGS / "cpu"


@dataclass(frozen=True)
class Task:
    """A task of the ladder: each model's CPU config (``configs/cpu``), the budget every row
    gets, and how its out-of-distribution split is built (``ood``, a description)."""

    key: str
    configs: dict[str, str]             # model family → config file; "nac" also serves the in-between rows
    sets: Mapping[str, Any]             # config values of every row
    ood: str


TASKS = {
    "listops": Task("listops", {"nac": "nac_listops.yaml", "pio": "perceiver_io_listops.yaml"},
                    {"data.params.size": {"train": 48000, "val": 2000, "test": 10}},
                    "deeper expressions: operators nested 3-5 deep (training: at most 2), same lengths"),
    "fashion_mnist": Task("fashion_mnist", {"nac": "nac_fashion_mnist.yaml", "pio": "perceiver_io_fashion_mnist.yaml"},
                          {"data.val_split": "test"}, "test images rotated by 30 degrees"),
}
STEPS = {"listops": 600, "fashion_mnist": 200}      # the same for every row (`--steps-scale` scales both)
# each task's OOD split, recorded with each result: results of an earlier definition are retrained, not mixed in
OOD_SPLITS = {"listops": "nested3plus", "fashion_mnist": "rotated30"}


def listops_ood(params: dict, n: int = 4000):
    """ListOps test expressions that nest operators deeper than any training expression."""
    import torch

    from modwire.tasks import build_dataset
    from modwire.tasks.synthetic.listops import nesting_depth

    train_depth = params["max_depth"] - 1
    size = {**params["size"], "test": n}
    pool = build_dataset("listops", "test", **{**params, "size": size, "max_depth": 6})
    keep = [i for i in range(len(pool)) if nesting_depth(pool[i][0]) > train_depth]
    return torch.utils.data.Subset(pool, keep)


ROTATION_DEGREES = 30.0


def image_ood(task: str, params: dict):
    """The test images rotated by 30° (a shift the training images never show, as ImageNet-R's
    renditions are for Tiny-ImageNet; inverting them instead leaves every model below chance)."""
    from modwire.tasks import build_dataset
    from modwire.tasks.augment.rand_augment import rotate

    return build_dataset(task, "test", **{**params, "transform": functools.partial(rotate, degrees=ROTATION_DEGREES)})


def ood_dataset(cfg):
    if cfg.data.task == "listops":
        return listops_ood(dict(cfg.data.params))
    return image_ood(cfg.data.task, dict(cfg.data.params))


def image_task() -> str:
    """Fashion-MNIST when its files are installed, else scikit-learn's digits (as `make demo`)."""
    from modwire.tasks import build_dataset

    try:
        build_dataset("fashion_mnist", "test")
        return "fashion_mnist"
    except (FileNotFoundError, OSError, ValueError):
        return "digits"


# ----------------------------------------------------------------------------- the jobs

@dataclass(frozen=True)
class Job:
    """One training run: a row of the ladder on a task with one seed, peak lr and warm-up."""

    row: str
    task: str
    seed: int
    steps: int
    lr: float
    warmup: int
    image_task: str = "fashion_mnist"   # what "fashion_mnist" runs on (digits when missing)
    max_samples: int = 0                # > 0: cap every split (smoke tests)

    @property
    def key(self) -> str:
        return f"{self.task}/{self.row}_lr{self.lr:g}_w{self.warmup}/steps{self.steps}/seed{self.seed}"

    def config(self, out: Path):
        from modwire.training import load_config

        row, task = ROW[self.row], TASKS[self.task]
        sets = {**task.sets, "model.name": row.model, **row.sets, "seed": self.seed, "max_steps": self.steps,
                "epochs": 100, "progress": False, "log_every": max(self.steps // 4, 1), "out_dir": out / self.key,
                "optim.lr": self.lr, "optim.warmup_steps": self.warmup}
        if self.task == "fashion_mnist" and self.image_task != "fashion_mnist":
            sets["data.task"] = self.image_task
        if self.max_samples:
            sets["data.max_samples"] = self.max_samples
        return load_config(CONFIGS / task.configs[family(row)], values=sets)


def family(row: Row) -> str:
    return "pio" if row.model.startswith("perceiver") else "nac"


def config_setting(row: str, task: str) -> tuple[float, int]:
    """The (peak lr, warm-up) of the row's model in its CPU config: the ladder's setting."""
    from modwire.training import load_config

    optim = load_config(CONFIGS / TASKS[task].configs[family(ROW[row])]).optim
    return float(optim.lr), int(optim.warmup_steps)


@common.worker(lambda job_and_out: job_and_out[0].key)
def run_job(job_and_out: tuple[Job, str]) -> dict:
    """Train one job in this (worker) process; its IID and OOD metrics, or ``{"key", "error"}``."""
    import torch

    from modwire.tasks import get_task
    from modwire.training import evaluate, train
    from modwire.training.runtime import make_loader

    job, out = job_and_out
    cfg = job.config(Path(out))
    result = train(cfg, overwrite=True)
    if result["step"] < job.steps:      # stopped by a signal: not a result (a rerun trains it again)
        raise RuntimeError(f"interrupted at step {result['step']} of {job.steps}")
    info, ood_set = get_task(cfg.data.task), ood_dataset(cfg)
    if job.max_samples:
        ood_set = torch.utils.data.Subset(ood_set, range(min(job.max_samples, len(ood_set))))
    ood = evaluate(result["model"], make_loader(ood_set, 256, None, info, 0, drop_last=False),
                   info, torch.device("cpu"))
    shutil.rmtree(Path(cfg.out_dir) / "checkpoints", ignore_errors=True)   # 12 MB a run; metrics stay
    return {**asdict(job), "key": job.key, "iid": result["val"]["top1"], "ood": ood["top1"],
            "ood_split": OOD_SPLITS[job.task], "iid_loss": result["val"]["loss"], "steps_done": result["step"]}


def load_results(path: Path) -> dict[str, dict]:
    """Finished runs by key (``modwire.analysis.results_log``), those of the current OOD splits only:
    a result of an earlier split definition is trained again, not mixed in."""
    from modwire.analysis.results_log import load_results as read

    return read(path, keep=current_split)


def current_split(record: dict) -> bool:
    """Whether a result was scored on its task's current OOD split."""
    return record.get("ood_split") == OOD_SPLITS.get(record["task"])


def run_jobs(jobs: list[Job], out: Path, workers: int, log: Callable[[str], None] = print) -> list[str]:
    """Run the jobs not yet in ``out/results.jsonl`` on ``workers`` processes, appending each
    result as it finishes (an interrupted study resumes from there). Returns the failures."""
    return common.run_grid(run_job, [(j, str(out)) for j in jobs], out / "results.jsonl", key=lambda a: a[0].key,
                           keep=current_split, workers=workers,
                           describe=lambda r: f"IID {r['iid']:.3f}, OOD {r['ood']:.3f}", log=log)


# ----------------------------------------------------------------------------- the report

SWEEP_LRS = (2.5e-4, 5e-4, 1e-3, 2e-3)
SWEEP_WARMUPS = (50, 200)
SWEEP_ROWS = ("pio", "nac_scale_free")


def aggregate(results: Iterable[dict]) -> dict[tuple, dict]:
    """Results grouped by (task, row, lr, warm-up, steps): IID / OOD mean, std and seeds."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["task"], r["row"], r["lr"], r["warmup"], r["steps"]), []).append(r)
    out = {}
    for k, rs in groups.items():
        (im, isd), (om, osd) = common.mean_std(r["iid"] for r in rs), common.mean_std(r["ood"] for r in rs)
        out[k] = {"iid": im, "iid_std": isd, "ood": om, "ood_std": osd, "seeds": len(rs),
                  "image_task": rs[0]["image_task"]}
    return out


def _cell(m: float, s: float, n: int) -> str:
    return f"{100 * m:5.1f} ± {100 * s:3.1f}" if n > 1 else f"{100 * m:5.1f}      "


def ladder_groups(groups: dict[tuple, dict], task: str) -> list[tuple[tuple, dict]]:
    """The ladder of ``task``: each row's results at its model's current config setting, in order."""
    out = []
    for row in ROWS:
        setting = config_setting(row.key, task)
        out += sorted(((k, g) for k, g in groups.items()
                       if k[0] == task and k[1] == row.key and (k[2], k[3]) == setting), key=lambda kg: kg[0][4])
    return out


def _line(label: str, key: tuple, g: dict, paper: tuple = ("", "")) -> list:
    _, _, lr, warm, steps = key
    return [label, f"{lr:g}", warm, steps, g["seeds"], _cell(g["iid"], g["iid_std"], g["seeds"]),
            _cell(g["ood"], g["ood_std"], g["seeds"]), *(f"{v:.2f}" if v != "" else "" for v in paper)]


def format_table(groups: dict[tuple, dict], tasks: Iterable[str]) -> str:
    """Markdown: per task, the ladder (each model at its config's lr) next to the paper's Table 1,
    then the lr / warm-up sweep (``*``: each model's best IID setting)."""
    lines = []
    head = ["row", "lr", "warm-up", "steps", "seeds", "IID", "OOD", "paper IID (Tiny-ImageNet)", "paper OOD (-R)"]
    for task in tasks:
        mine = {k: v for k, v in groups.items() if k[0] == task}
        if not mine:
            continue
        name = next(iter(mine.values()))["image_task"] if task == "fashion_mnist" else task
        lines += [f"\n### {name} (IID) and OOD: {TASKS[task].ood}; top-1 %, mean ± std over seeds\n",
                  common.markdown_table(head, [_line(ROW[k[1]].label, k, g, PAPER.get(ROW[k[1]].paper or "", ("", "")))
                                               for k, g in ladder_groups(groups, task)])]
        sweep = sorted(((k, g) for k, g in mine.items() if k[1] in SWEEP_ROWS), key=lambda kg: (kg[0][1], kg[0][2:]))
        if any(len({k[2:4] for k, _ in sweep if k[1] == row}) > 1 for row in SWEEP_ROWS):
            best = {row: max((g["iid"], k) for k, g in sweep if k[1] == row)[1] for row in {k[1] for k, _ in sweep}}
            lines += [f"\nlearning-rate / warm-up sweep ({name}; * = the model's best IID):\n",
                      common.markdown_table(head, [_line(ROW[k[1]].label + (" *" if best[k[1]] == k else ""), k, g)
                                                   for k, g in sweep])]
    return "\n".join(lines)


def plot(groups: dict[tuple, dict], tasks: list[str], path: Path) -> Path | None:
    """Bar chart of the ladder per task and split (NAC Table 1's rows), error bars = std over seeds."""
    ladders = {t: [k for k, _ in ladder_groups(groups, t)] for t in tasks}
    tasks = [t for t in tasks if ladders[t]]
    if not tasks:
        return None

    def draw(fig, axes):
        for ax_row, task in zip(axes, tasks):
            keys = ladders[task]
            for ax, split in zip(ax_row, ("iid", "ood")):
                vals = [100 * groups[k][split] for k in keys]
                errs = [100 * groups[k][split + "_std"] for k in keys]
                ax.barh(range(len(keys)), vals, xerr=errs, color=["C1" if k[1] == "pio" else "C0" for k in keys])
                ax.set_yticks(range(len(keys)), [ROW[k[1]].label for k in keys], fontsize=8)
                ax.invert_yaxis()
                ax.set_xlim(max(0.0, min(v - e for v, e in zip(vals, errs)) - 5),
                            max(v + e for v, e in zip(vals, errs)) + 2)
                ax.set_title(f"{task} {split.upper()} top-1 (%)", fontsize=9)
        fig.tight_layout()
    return common.save_figure(path, draw, figsize=(12, 3.2 * len(tasks) + 1), nrows=len(tasks), ncols=2,
                              squeeze=False)


# ----------------------------------------------------------------------------- the command

def plan(args: argparse.Namespace, image: str) -> list[Job]:
    """The jobs the arguments ask for: the ladder (``--rows``) and/or the sweep (``--sweep``)."""
    tasks, sweep_tasks, rows = args.tasks.split(","), args.sweep_tasks.split(","), args.rows.split(",")
    unknown = [t for t in tasks + sweep_tasks if t not in TASKS] + [r for r in rows if r not in ROW]
    if unknown:
        raise SystemExit(f"table1_ladder.py: unknown task or row {unknown}; tasks: {list(TASKS)}, rows: {list(ROW)}")
    cap = 160 if args.quick else 0
    steps = {t: 3 if args.quick else max(1, round(STEPS[t] * args.steps_scale)) for t in {*tasks, *sweep_tasks}}
    jobs = [] if args.sweep_only else [
        Job(row, t, seed, steps[t], *config_setting(row, t), image, cap)
        for seed in range(args.seeds) for t in tasks for row in rows]
    if args.sweep or args.sweep_only:
        jobs += [Job(row, t, seed, steps[t], lr, warm, image, cap)
                 for seed, t, row, lr, warm in itertools.product(range(args.sweep_seeds), sweep_tasks, SWEEP_ROWS,
                                                                 SWEEP_LRS, SWEEP_WARMUPS)]
    unique = {j.key: j for j in jobs}
    return sorted(unique.values(), key=lambda j: j.seed)   # every row's first seed first: a cut-short study is balanced


def report(out: Path, tasks: list[str]) -> str:
    groups = aggregate(load_results(out / "results.jsonl").values())
    table = format_table(groups, tasks)
    atomic_write_text(out / "table.md", "# NAC Table 1 at CPU scale (modwire.experiments.table1_ladder)\n" + table + "\n")
    figure = plot(groups, tasks, out / "ladder.png")
    return table + f"\n\ntable: {out / 'table.md'}" + (f", plot: {figure}" if figure else " (no matplotlib: no plot)")


def scale(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = common.parser(__doc__, "runs/experiments/table1_ladder", "3 steps on 160 samples per split",
                       report="print the table of what OUT/results.jsonl holds")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"comma-separated, of {list(ROW)}")
    ap.add_argument("--tasks", default="listops,fashion_mnist")
    ap.add_argument("--seeds", type=common.positive, default=3)
    ap.add_argument("--steps-scale", type=scale, default=1.0,
                    help=f"training steps x this (default {STEPS})")
    ap.add_argument("--full", action="store_true", help="every row, 5 seeds (about 4 hours on 2 cores)")
    ap.add_argument("--sweep", action="store_true",
                    help=f"also lr {SWEEP_LRS} x warm-up {SWEEP_WARMUPS} for {SWEEP_ROWS} (30 minutes a task)")
    ap.add_argument("--sweep-only", action="store_true", help="the sweep without the ladder")
    ap.add_argument("--sweep-seeds", type=common.positive, default=1)
    ap.add_argument("--sweep-tasks", default="listops", help="the tasks the sweep trains on")
    ap.add_argument("--workers", type=common.positive, default=max(1, min(2, os.cpu_count() or 1)))
    args = ap.parse_args(argv)
    if args.full:
        args.rows, args.seeds = ",".join(ROW), max(args.seeds, 5)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    out, tasks, failed = args.out, args.tasks.split(","), []
    if not args.report:
        image = image_task() if "fashion_mnist" in tasks else "fashion_mnist"
        if image != "fashion_mnist":
            print("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist): "
                  "the image task runs on scikit-learn's digits")
        failed = run_jobs(plan(args, image), out, args.workers)
        print(f"trained in {(time.perf_counter() - started) / 60:.1f} minutes")
    print(report(out, tasks))
    results = [r for r in load_results(out / "results.jsonl").values() if r["task"] in tasks]
    common.finish_study(out, "table1_ladder", results, args=args, started=started, seeds=common.seeds_of(results),
                        logs=[out / "results.jsonl"], script=__file__, argv=argv)
    if failed:
        print(f"{len(failed)} runs failed (not in the table):\n  " + "\n  ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
