"""``make demo``: what NAC is for. Train a CPU-sized NAC and a Perceiver IO of the same
dimensions on images, then drop 0-94% of their processor modules (NAC) / latents
(Perceiver IO) at inference time and print the accuracy of every copy side by side, next
to the paper's claim (NAC §3 "Effect of Dropping Modules", Fig. 5a / 15).

Which modules go: for each drop level, ``--draws`` (default 5) random subsets, **the same
index subsets for both models** (both have 64 modules / latents; seeded by ``--draw-seed``);
the table prints the mean ± std over the draws, and beside it each model's own order (the
NAC's least connected modules first, NAC App. F, which is the paper's Fig. 5 protocol; the
Perceiver IO's last latents). The headline sentence and the verdict on the paper's claim are
computed from the random draws (:func:`headline`, which states its criterion).

The dropping, evaluation, FLOP counting and plots are :func:`modwire.analysis.analyze`
(``modwire analyze``, with ``draws``); this module only picks the data, trains the two runs,
prints, and writes its result file ``OUT/study.json`` (:func:`modwire.analysis.study.write_study`).

Data: Fashion-MNIST from Debian's package ``dataset-fashion-mnist`` when it is installed
(``make demo`` installs it when it can); otherwise scikit-learn's 8×8 digits, which need
no system package. The demo says which one it used and why.

``--race`` runs the previous demo instead (both models trained for 700 steps on short
ListOps, each at its own learning rate, accuracy and speed printed), and
``--forward`` times the inference forward of the NAC Table 4 models.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import create_model, get_config, list_models, model_source
from .errors import UserError
from .files import atomic_write_text

MODELS = ["nac_small", "perceiver_io_small"]
DROP = (0.0, 0.25, 0.5, 0.75, 0.875, 0.9375)   # fractions of modules / latents dropped (0: the full model)
DRAWS = 5                                     # random drop subsets per level, the same for both models
CLAIM_LEVEL = 0.875                           # the paper's claim is at 87.5% dropped ("8x speedup")
NAC_LOSS_LIMIT = 0.03                         # "losing less than 3% performance", read as accuracy points

# The paper's claim next to which the table is printed (NAC abstract and §3, Fig. 5a / 15;
# Tiny-ImageNet at full scale, not this CPU-sized run).
PAPER_CLAIM = ("NAC paper (§3, Fig. 5a / 15; Tiny-ImageNet, full scale, modules dropped least connected first): "
               "with 87.5% of\nits modules dropped at inference a NAC loses less than 3% of its accuracy (abstract: "
               "\"8x speedup at\ninference time while losing less than 3% performance\"), while a Perceiver IO with "
               "its latents dropped\ndegrades much faster.")


@dataclass(frozen=True)
class DemoData:
    """The data of the demo's main job and its training budget (``key=value`` overrides)."""

    task: str
    why: str
    train: tuple[str, ...]          # config overrides shared by both runs
    nac: tuple[str, ...] = ()       # NAC only (the graph prior)


# configs/cpu/nac_fashion_mnist_prior.yaml and perceiver_io_fashion_mnist.yaml, cut from one
# epoch (469 steps) to 200 steps of 128 images so that both runs and the analysis fit in
# 5 minutes on 2 cores (the demo prints its total time; a measured run: docs/demo.md).
FASHION_TRAIN = ("data.task=fashion_mnist", "data.val_split=test", "data.batch_size=128", "max_steps=200",
                 "optim.lr=1e-3", "optim.warmup_steps=50", "optim.weight_decay=0.05", "log_every=40")
# NAC's planted-partition graph prior (App. A): the model reports L_graph as its auxiliary loss "graph"
PRIOR = ("model.overrides.graph_prior={name: planted_partition, params: {num_clusters: 8, p_in: 0.9, p_out: 0.05}}",
         "aux_loss_weights.graph=5e-3")
# scikit-learn's digits: 1,437 training images; 15 epochs of 64 (330 steps), at lr 1e-3
# (at 2e-3 the NAC learned far more slowly than the Perceiver IO).
DIGITS_TRAIN = ("data.task=digits", "data.val_split=test", "data.batch_size=64", "epochs=15", "max_steps=0",
                "optim.lr=1e-3", "optim.warmup_steps=30", "optim.weight_decay=0.05", "log_every=44")


MARKER = ".modwire-demo"   # marks a directory the demo owns (and may empty on the next run)


def fresh_out_dir(out_dir: str, parts: tuple[str, ...]) -> None:
    """Each demo starts fresh: ``parts`` (the demo's runs and analysis) of an ``out_dir`` the
    demo made before (it holds ``MARKER``) are removed; any other non-empty ``out_dir`` is
    refused, so nothing that is not the demo's is ever deleted."""
    path = Path(out_dir)
    if path.is_dir() and any(path.iterdir()) and not (path / MARKER).is_file():
        raise UserError(f"--out-dir {out_dir} is not empty and was not made by the demo (no {MARKER} file): "
                        f"choose another --out-dir")
    if path.exists() and not path.is_dir():
        raise UserError(f"--out-dir {out_dir} is a file, expected a directory")
    for part in parts:
        target = path / part
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path / MARKER, "written by python -m modwire.demo, which replaces its runs here on each start\n")


def pick_data(choice: str = "auto") -> DemoData:
    """Fashion-MNIST if its files are readable (``choice`` ``auto`` or ``fashion_mnist``),
    else scikit-learn's digits; ``why`` says which and why."""
    from .tasks import build_dataset
    from .tasks.loaders.mnist import debian_fashion_mnist

    if choice == "digits":
        return DemoData("digits", "scikit-learn's 8x8 digits, as asked (--dataset digits)", DIGITS_TRAIN, PRIOR)
    try:
        build_dataset("fashion_mnist", "test")
    except (FileNotFoundError, ValueError) as exc:
        if choice == "fashion_mnist":
            raise
        reason = str(exc).splitlines()[0]
        return DemoData("digits", f"scikit-learn's 8x8 digits (no system package needed), because Fashion-MNIST "
                        f"is not readable ({reason}); to use it: apt-get install dataset-fashion-mnist, "
                        f"which installs {debian_fashion_mnist()}", DIGITS_TRAIN, PRIOR)
    return DemoData("fashion_mnist", f"Fashion-MNIST from {debian_fashion_mnist()} (Debian package "
                    f"dataset-fashion-mnist)", FASHION_TRAIN, PRIOR)


class Eta:
    """Progress of ``what`` on stderr with an ETA from the rate so far: ``eta(done, total)``
    prints at most every ``every`` seconds, and at the end."""

    def __init__(self, what: str, every: float = 5.0) -> None:
        self.what, self.every = what, every
        self.start = self.shown = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if done < total and now - self.shown < self.every:
            return
        self.shown, elapsed = now, now - self.start
        print(f"{self.what}: {done}/{total} in {elapsed:.0f} s, ETA {elapsed / max(done, 1) * (total - done):.0f} s",
              file=sys.stderr, flush=True)


def train_pair(data: DemoData, overrides: list[str], out_dir: str, progress: bool) -> dict[str, dict]:
    """Train ``nac_small`` and ``perceiver_io_small`` on ``data``; ``{model: row}``. The trainer
    shows each run's progress (a bar with its ETA on a terminal, a line every ``log_every``
    steps otherwise); after the first run the demo prints an ETA for the second."""
    from .training import load_config, train

    rows = {}
    for i, name in enumerate(MODELS):
        extra = data.nac if name.startswith("nac") else ()
        run_dir = os.path.join(out_dir, name)
        cfg = load_config(None, [*data.train, *extra, f"model.name={name}", f"out_dir={run_dir}",
                                 f"progress={str(progress).lower()}", *overrides])
        start = time.perf_counter()
        result = train(cfg)
        seconds = time.perf_counter() - start
        if result["status"] != "finished":   # SIGINT / SIGTERM: the trainer saved its run; the demo stops here
            print(f"modwire demo: {name} interrupted at step {result['step']}; stopping", file=sys.stderr)
            raise SystemExit(result["exit_code"])
        rows[name] = {"run_dir": run_dir, "seed": cfg.seed, "steps": result["step"], "seconds": seconds,
                      "params": result["model"].num_parameters(), "val": result["val"]}
        if i + 1 < len(MODELS):   # the next run has as many steps: its time at this one's rate
            print(f"modwire demo: {name} trained in {seconds:.0f} s; ETA of the training: about "
                  f"{seconds * (len(MODELS) - i - 1):.0f} s more", file=sys.stderr, flush=True)
    return rows


# ----------------------------------------------------------------------------- the table and its headline

def level_table(summary: dict) -> dict[float, dict[str, dict[str, Any]]]:
    """``{fraction: {model: {kept, gflops, mean, std, draws, own, order}}}`` from ``analyze``'s
    summary: the metric's mean / std over the random draws and its value in the model's own order."""
    metric, table = summary["metric"], {}
    for s in summary["modules_dropped_stats"]:
        table.setdefault(s["fraction_dropped"], {})[s["model"]] = {
            "kept": s["modules_kept"], "mean": s[f"{metric}_mean"], "std": s[f"{metric}_std"], "draws": s["draws"]}
    for r in summary["modules_dropped"]:
        if r["order"] != "random":
            table[r["fraction_dropped"]][r["model"]] |= {"own": r[metric], "order": r["order"],
                                                         "gflops": r["gflops_per_sample"]}
    return dict(sorted(table.items()))


def headline(table: dict[float, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The demo's headline, computed from ``table`` (:func:`level_table`) at 87.5% dropped (else the
    largest level): per model the points lost over the random draws, ``full - mean ± std`` (the full
    model is one number: every draw drops nothing at 0%), and the verdict on the paper's claim.

    Criterion: the pattern holds when the NAC loses under 3 points on average AND the Perceiver IO
    loses more than the NAC by more than the sum of the two standard deviations over the draws."""
    if 0.0 not in table:
        raise UserError("the demo's headline compares with the full model: --drop must include 0")
    level = CLAIM_LEVEL if CLAIM_LEVEL in table else max(table)
    nac, pio = MODELS
    lost = {m: {"full": table[0.0][m]["mean"], "mean": table[level][m]["mean"], "own": table[level][m]["own"],
                "order": table[level][m]["order"], "lost": table[0.0][m]["mean"] - table[level][m]["mean"],
                "lost_std": table[level][m]["std"], "lost_own": table[0.0][m]["mean"] - table[level][m]["own"]}
            for m in MODELS}
    gap, spread = lost[pio]["lost"] - lost[nac]["lost"], lost[nac]["lost_std"] + lost[pio]["lost_std"]
    small = lost[nac]["lost"] < NAC_LOSS_LIMIT
    faster = gap > spread
    if small and faster:
        verdict = "holds in this run"
    elif faster:
        verdict = f"holds only in part: the Perceiver IO loses more, but the NAC loses {NAC_LOSS_LIMIT:.0%} or more"
    elif gap < -spread:
        verdict = "does NOT hold in this run: the Perceiver IO loses less than the NAC"
    else:
        verdict = ("does NOT hold in this run: the two losses differ by less than their spread over the draws"
                   + (" (the NAC does lose under 3 points)" if small else ""))
    return {"fraction_dropped": level, "draws": table[level][nac]["draws"], "models": lost, "gap": gap,
            "spread": spread, "nac_under_limit": small, "pio_loses_more": faster, "verdict": verdict,
            "criterion": f"NAC loses < {100 * NAC_LOSS_LIMIT:g} points (mean over the draws) and the Perceiver IO "
                         f"loses more than the NAC by more than std(NAC) + std(PIO)"}


def headline_text(h: dict[str, Any], summary: dict, runs: dict[str, dict]) -> str:
    """The headline sentence of :func:`headline`'s numbers (points = percentage points of the metric)."""
    nac, pio = (h["models"][m] for m in MODELS)
    pts = lambda x: f"{100 * x:.1f}"   # noqa: E731
    return (f"this run ({summary['task']}, {summary['num_samples']} {summary['split']} images; "
            f"{runs[MODELS[0]]['steps']} / {runs[MODELS[1]]['steps']} training steps; one training seed):\n"
            f"with {h['fraction_dropped']:.2%} dropped ({h['draws']} random subsets, the same for both models), "
            f"the NAC loses {pts(nac['lost'])} ± {pts(nac['lost_std'])} points ({pts(nac['full'])}% → "
            f"{pts(nac['mean'])}%),\nthe Perceiver IO {pts(pio['lost'])} ± {pts(pio['lost_std'])} points "
            f"({pts(pio['full'])}% → {pts(pio['mean'])}%); the gap is {pts(h['gap'])} points against a spread of "
            f"{pts(h['spread'])}.\nIn its own order ({nac['order']}: least connected first, the paper's) the NAC "
            f"loses {pts(nac['lost_own'])} points; the Perceiver IO ({pio['order']} latents first) "
            f"{pts(pio['lost_own'])}.")


def print_drop_table(summary: dict, runs: dict[str, dict]) -> dict[str, Any]:
    """The drop levels, NAC and Perceiver IO side by side (mean ± std over the random draws, and
    each model's own order), then the headline, the paper's claim and the verdict; returns the headline."""
    table = level_table(summary)
    metric, draws = summary["metric"], table[min(table)][MODELS[0]]["draws"]
    print(f"\n{summary['split']} {metric} (%) of each copy; random: mean ± std over the same {draws} random subsets "
          f"for both models;\nown order: the NAC's least connected modules first (the paper's), the Perceiver IO's "
          f"last latents first")
    print(f"{'dropped':>8} | {'NAC kept':>8} {'GFLOP':>7} {'random':>13} {'own order':>9} | "
          f"{'PIO kept':>8} {'GFLOP':>7} {'random':>13} {'own order':>9}")
    for f, row in table.items():
        cells = [f"{c['kept']:>8} {c['gflops']:>7.4f} {100 * c['mean']:>6.1f} ± {100 * c['std']:>4.1f} "
                 f"{100 * c['own']:>9.1f}" for c in (row[m] for m in MODELS)]
        print(f"{f:>8.2%} | {cells[0]} | {cells[1]}")
    h = headline(table)
    print("\n" + headline_text(h, summary, runs))
    print(PAPER_CLAIM)
    print(f"→ the pattern {h['verdict']}.\n  (criterion: {h['criterion']})")
    return h


# ----------------------------------------------------------------------------- the main job

def dropping_demo(args: argparse.Namespace) -> dict:
    """Main job: pick data, train both, ``analyze`` the NAC with the Perceiver IO as baseline
    (random draws), print the table and headline, write ``OUT/study.json``."""
    from .analysis import analyze

    start, load_start = time.perf_counter(), os.getloadavg()
    data = pick_data(args.dataset)
    print(f"modwire demo: dataset {data.task}: {data.why}", flush=True)
    overrides = list(args.overrides) + ([f"max_steps={args.steps}"] if args.steps else [])
    runs = train_pair(data, overrides, args.out_dir, not args.no_progress)
    nac, pio = (runs[m]["run_dir"] for m in MODELS)
    print(f"modwire.analysis.analyze: dropping {', '.join(f'{f:g}' for f in args.drop)} of the modules / "
          f"latents ({args.draws} random subsets per level, seed {args.draw_seed}, and each model's own order),\n"
          f"scoring each copy on up to {args.max_samples} test images", flush=True)
    summary = analyze(nac, [pio], out_dir=os.path.join(args.out_dir, "analysis"), drop=args.drop, edges=[0.0],
                      max_samples=args.max_samples, batch=32, iters=1, plots=not args.no_plots,
                      draws=args.draws, draw_seed=args.draw_seed,
                      progress=None if args.no_progress else Eta("modwire demo: dropped copies scored"), log=None)
    h = print_drop_table(summary, runs)
    for m in MODELS:
        print(f"{m}: {runs[m]['params']:,} parameters, {runs[m]['steps']} steps in {runs[m]['seconds']:.0f} s, "
              f"run {runs[m]['run_dir']}")
    plot = next((p for p in summary["files"] if p.endswith("accuracy_vs_modules_dropped.png")), None)
    print(f"plot: {plot}" if plot else "plot: none (--no-plots)")
    total = time.perf_counter() - start
    path = write_result(args, data, runs, summary, h, started=start, load=(load_start, os.getloadavg()))
    print(f"result: {path}; all files: {os.path.join(args.out_dir, 'analysis')}\n"
          f"total {total:.0f} s with {torch.get_num_threads()} CPU threads (load average at start "
          f"{load_start[0]:.2f}, at end {os.getloadavg()[0]:.2f})")
    return summary


def write_result(args: argparse.Namespace, data: DemoData, runs: dict[str, dict], summary: dict,
                 h: dict[str, Any], *, started: float, load: tuple) -> Path:
    """``OUT/study.json`` (:func:`modwire.analysis.study.write_study`): the runs, every dropped
    copy (its draw and dropped indices), the mean / std per level and model, and the headline."""
    from .analysis.study import write_study

    metric = summary["metric"]
    results: list[dict[str, Any]] = [
        {"record": "setup", "task": data.task, "data": data.why, "split": summary["split"],
         "test_images": summary["num_samples"], "metric": metric, "torch_threads": torch.get_num_threads(),
         "load_average_start": list(load[0]), "load_average_end": list(load[1])}]
    results += [{"record": "training", "model": m, "seed": r["seed"], "steps": r["steps"],
                 "seconds": round(r["seconds"], 1),
                 "params": r["params"], "val": r["val"]} for m, r in runs.items()]
    results += [{"record": "dropped_copy", "model": r["model"], "fraction_dropped": r["fraction_dropped"],
                 "modules_kept": r["modules_kept"], "order": r["order"], "draw": r["draw"], metric: r[metric],
                 "loss": r.get("loss"), "gflops_per_sample": r["gflops_per_sample"],
                 "dropped": " ".join(map(str, r["dropped"]))} for r in summary["modules_dropped"]]
    results += [{"record": "drop_level", "model": m, "fraction_dropped": f, **cell}
                for f, row in level_table(summary).items() for m, cell in row.items()]
    results.append({"record": "headline", **h})
    config = {k: v for k, v in vars(args).items() if k not in ("race", "forward", "models", "batch", "iters")}
    return write_study(Path(args.out_dir), "demo", results, config={**config, "train": list(data.train)},
                       seeds=sorted({r["seed"] for r in runs.values()}), started=started)


# ----------------------------------------------------------------------------- --race, --forward

# The race (``--race``): ListOps (NAC Table 3) with short expressions (depth ≤ 3, at most
# 64 tokens; the race prints each model's train steps/s); chance is 10%. configs/cpu/nac_listops.yaml
# and perceiver_io_listops.yaml hold the same settings. Each model trains at its best peak
# learning rate and warm-up from modwire.experiments.table1_ladder's sweep (the paper, too, tunes them
# separately, NAC Table 4): at Perceiver IO's setting the NAC stays on the label-prior plateau,
# because its initial states, an MLP of the codes (§2.2), take far larger Adam steps than free
# latents, and its kernel makes it more sensitive still.
RACE = [
    "data.task=listops", "data.params.size={train: 48000, val: 1000, test: 1000}", "data.params.min_len=5",
    "data.params.max_len=64", "data.params.max_depth=3", "model.overrides.tokenizer.max_len=64",
    "model.overrides.tokenizer.token_dim=96", "data.batch_size=64", "epochs=1", "max_steps=700",
    "optim.weight_decay=0.05", "log_every=50",
]
# (peak lr, warm-up steps) by model family (a preset's model_type)
RACE_OPTIM = {"perceiver_io": (1e-3, 50), "nac": (5e-4, 200)}


def race(models: list[str], overrides: list[str], out_dir: str, progress: bool) -> list[dict]:
    """Train each model on the race's ListOps budget; print accuracy, parameters and speed."""
    from .training import load_config, train

    rows = []
    for name in models:
        lr, warmup = RACE_OPTIM.get(get_config(name).model_type, (5e-4, 200))
        cfg = load_config(None, [*RACE, f"model.name={name}", f"optim.lr={lr}", f"optim.warmup_steps={warmup}",
                                 f"out_dir={out_dir}/{name}",
                                 f"progress={str(progress).lower()}", *overrides])
        start = time.perf_counter()
        result = train(cfg)
        elapsed = time.perf_counter() - start
        rows.append({"model": name, "params": result["model"].num_parameters(), "task": cfg.data.task,
                     **result["val"], "steps": result["step"], "steps_per_s": result["step"] / elapsed})
    metric = next(k for k in rows[0] if k not in ("model", "params", "task", "loss"))
    print(f"\nmodwire demo --race: {rows[0]['task']}, {rows[0]['steps']} training steps per model, "
          f"{torch.get_num_threads()} CPU threads")
    print(f"{'model':<24}{'params':>12}{'val ' + metric:>12}{'val loss':>10}{'train steps/s':>15}")
    for r in rows:
        print(f"{r['model']:<24}{r['params']:>12,}{r[metric]:>12.3f}{r['loss']:>10.3f}{r['steps_per_s']:>15.2f}")
    print(json.dumps(rows))
    return rows


def forward_throughput(model: torch.nn.Module, x: torch.Tensor, iters: int) -> tuple[float, torch.Tensor]:
    """Samples per second of an inference forward (after one warm-up call)."""
    model.eval()
    with torch.inference_mode():
        out = model(x)
        start = time.perf_counter()
        for _ in range(iters):
            out = model(x)
        elapsed = time.perf_counter() - start
    return x.shape[0] * iters / elapsed, out


def forward_demo(models: list[str], batch: int, iters: int) -> None:
    """``--forward``: parameters, logits shape and inference images/s of image presets."""
    print(f"inference forward on a batch of {batch} images, {torch.get_num_threads()} CPU threads")
    print(f"{'model':<30}{'source':<20}{'params':>12}{'logits':>14}{'img/s':>10}")
    rates = {}
    for name in models:
        model = create_model(name)
        c = model.config
        x = torch.randn(batch, c.tokenizer.in_channels, c.tokenizer.image_size, c.tokenizer.image_size)
        rate, out = forward_throughput(model, x, iters)
        if not torch.isfinite(out).all():
            raise RuntimeError(f"{name} produced non-finite logits")
        rates[name] = rate
        print(f"{name:<30}{model_source(name):<20}{model.num_parameters():>12,}"
              f"{str(list(out.shape)):>14}{rate:>10.1f}")
    if len(rates) == 2:
        (a, ra), (b, rb) = rates.items()
        print(f"throughput ratio {a} / {b}: {ra / rb:.2f}")


# ----------------------------------------------------------------------------- command line

def _fractions(text: str) -> list[float]:
    from .analysis.report import parse_fractions

    try:
        return parse_fractions(text, "--drop", closed=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m modwire.demo", description=(
        "make demo: train a CPU-sized NAC and Perceiver IO, drop 0-94% of their modules / latents at "
        "inference and print the accuracy table next to the paper's claim (NAC Fig. 5a / 15)"))
    ap.add_argument("--dataset", choices=["auto", "fashion_mnist", "digits"], default="auto",
                    help="main job's data: auto = Fashion-MNIST if installed, else scikit-learn's digits")
    ap.add_argument("--steps", type=int, default=0, help="training steps per model (0: the demo's budget)")
    ap.add_argument("--drop", type=_fractions, default=list(DROP), metavar="F,F,...",
                    help=f"fractions of modules / latents to drop, 0 included (default {','.join(map(str, DROP))})")
    ap.add_argument("--draws", type=int, default=DRAWS,
                    help=f"random drop subsets per level, the same for both models (default {DRAWS}, at least 2)")
    ap.add_argument("--draw-seed", type=int, default=0, help="seed of the random drop subsets")
    ap.add_argument("--max-samples", type=int, default=1000, help="test images scored per dropped copy")
    ap.add_argument("--no-plots", action="store_true", help="write the CSV / JSON files only")
    ap.add_argument("--race", action="store_true", help="the ListOps race of NAC vs Perceiver IO instead")
    ap.add_argument("--forward", action="store_true", help="time the NAC Table 4 inference forward instead")
    ap.add_argument("--models", nargs="+", default=None, choices=list_models(), metavar="MODEL",
                    help=f"with --race / --forward: presets, any of {list_models()}")
    ap.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="training-config overrides applied to both runs")
    ap.add_argument("--out-dir", default="runs/demo")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--batch", type=int, default=16, help="with --forward")
    ap.add_argument("--iters", type=int, default=2, help="with --forward")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.steps < 0 or args.max_samples < 1:
        parser().error(f"--steps must be >= 0 and --max-samples >= 1, got {args.steps} and {args.max_samples}")
    if not (args.forward or args.race) and (args.draws < 2 or 0.0 not in args.drop):
        parser().error(f"the table compares mean ± std over random draws with the full model: --draws must be "
                       f">= 2 and --drop must include 0, got --draws {args.draws} and --drop "
                       f"{','.join(f'{f:g}' for f in args.drop)}")
    torch.manual_seed(0)
    if args.forward:
        forward_demo(args.models or ["nac_tiny_imagenet", "perceiver_io_tiny_imagenet"], args.batch, args.iters)
    elif args.race:
        models = args.models or MODELS
        _out_dir_or_usage_error(args.out_dir, ("race",))
        race(models, args.overrides, os.path.join(args.out_dir, "race"), not args.no_progress)
    else:
        if args.models:
            parser().error("--models goes with --race or --forward; the main job compares "
                           f"{' and '.join(MODELS)}")
        _out_dir_or_usage_error(args.out_dir, (*MODELS, "analysis", "study.json"))
        dropping_demo(args)


def _out_dir_or_usage_error(out_dir: str, parts: tuple[str, ...]) -> None:
    try:
        fresh_out_dir(out_dir, parts)
    except ValueError as exc:
        parser().error(str(exc))


if __name__ == "__main__":
    from .cli import run_command   # how every command ends: one-line errors, a closed pipe, bugs said so

    sys.exit(run_command("demo", lambda: main() or 0))
