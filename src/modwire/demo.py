"""``make demo``: what NAC is for. Train a CPU-sized NAC and a Perceiver IO of the same
dimensions on images, then drop 0-94% of their processor modules (NAC) / latents
(Perceiver IO) at inference time and print the accuracy of every copy side by side, next
to the paper's claim (NAC §3 "Effect of Dropping Modules", Fig. 5a / 15).

The dropping, evaluation, FLOP counting and plots are :func:`modwire.analysis.analyze`
(``modwire analyze``); this module only picks the data, trains the two runs and prints.

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
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import create_model, get_config, list_models, model_source
from .analysis.report import DEFAULT_DROP_FRACTIONS
from .errors import UserError

MODELS = ["nac_small", "perceiver_io_small"]
DROP = DEFAULT_DROP_FRACTIONS   # fractions of modules / latents dropped: those of `modwire analyze`

# The paper's claim next to which the table is printed (NAC abstract and §3, Fig. 5a / 15;
# Tiny-ImageNet at full scale, not this CPU-sized run).
PAPER_CLAIM = ("NAC paper (§3, Fig. 5a / 15; Tiny-ImageNet, full scale): with 87.5% of its modules dropped at "
               "inference a NAC\nloses less than 3% of its accuracy (abstract: \"8x speedup at inference time while "
               "losing less than 3%\nperformance\"), while a Perceiver IO with its latents dropped degrades much "
               "faster.")


@dataclass(frozen=True)
class DemoData:
    """The data of the demo's main job and its training budget (``key=value`` overrides)."""

    task: str
    why: str
    train: tuple[str, ...]          # config overrides shared by both runs
    nac: tuple[str, ...] = ()       # NAC only (the graph prior)


# configs/cpu/nac_fashion_mnist_prior.yaml and perceiver_io_fashion_mnist.yaml, cut from one
# epoch (469 steps) to 240 steps of 128 images so that both runs and the analysis take minutes
# on 2 cores (the demo prints its total time; a measured run: README, "make demo").
FASHION_TRAIN = ("data.task=fashion_mnist", "data.val_split=test", "data.batch_size=128", "max_steps=240",
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
        shutil.rmtree(path / part, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("written by python -m modwire.demo, which replaces its runs here on each start\n")


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


def train_pair(data: DemoData, overrides: list[str], out_dir: str, progress: bool) -> dict[str, dict]:
    """Train ``nac_small`` and ``perceiver_io_small`` on ``data``; ``{model: row}``."""
    from .training import load_config, train

    rows = {}
    for name in MODELS:
        extra = data.nac if name.startswith("nac") else ()
        run_dir = os.path.join(out_dir, name)
        cfg = load_config(None, [*data.train, *extra, f"model.name={name}", f"out_dir={run_dir}",
                                 f"progress={str(progress).lower()}", *overrides])
        start = time.perf_counter()
        result = train(cfg)
        rows[name] = {"run_dir": run_dir, "steps": result["step"], "seconds": time.perf_counter() - start,
                      "params": result["model"].num_parameters()}
    return rows


def print_drop_table(summary: dict, runs: dict[str, dict]) -> None:
    """The modules-dropped rows of ``analyze``'s summary, NAC and Perceiver IO side by side."""
    metric = summary["metric"]
    by = {}
    for row in summary["modules_dropped"]:
        by.setdefault(row["fraction_dropped"], {})[row["model"]] = row
    nac, pio = MODELS
    print(f"\n{'dropped':>8} | {'NAC modules':>11} {'NAC ' + metric:>9} {'GFLOP':>7} | "
          f"{'PIO latents':>11} {'PIO ' + metric:>9} {'GFLOP':>7}")
    for f, r in sorted(by.items()):
        print(f"{f:>8.2%} | {r[nac]['modules_kept']:>11} {r[nac][metric]:>9.1%} {r[nac]['gflops_per_sample']:>7.4f} | "
              f"{r[pio]['modules_kept']:>11} {r[pio][metric]:>9.1%} {r[pio]['gflops_per_sample']:>7.4f}")
    full = min(by)
    most = 0.875 if 0.875 in by else max(by)   # the paper's claim is at 87.5% dropped
    keep = {m: by[most][m][metric] / max(by[full][m][metric], 1e-12) for m in MODELS}
    lost = {m: by[full][m][metric] - by[most][m][metric] for m in MODELS}
    print(f"\nthis run ({summary['task']}, {summary['num_samples']} {summary['split']} images; "
          f"{runs[nac]['steps']} / {runs[pio]['steps']} training steps):\nwith {most:.2%} dropped the NAC keeps "
          f"{keep[nac]:.0%} of its accuracy ({100 * lost[nac]:.1f} points lost), the Perceiver IO "
          f"{keep[pio]:.0%} ({100 * lost[pio]:.1f} points lost)")
    holds = lost[nac] < 0.03 and lost[nac] < lost[pio]
    print(PAPER_CLAIM)
    print("→ the pattern " + ("holds in this run." if holds else "does NOT hold in this run (the numbers above are "
                              "what it gave)."))


def dropping_demo(args: argparse.Namespace) -> dict:
    """Main job: pick data, train both, ``analyze`` the NAC with the Perceiver IO as baseline."""
    from .analysis import analyze

    data = pick_data(args.dataset)
    print(f"modwire demo: dataset {data.task}: {data.why}", flush=True)
    start = time.perf_counter()
    overrides = list(args.overrides) + ([f"max_steps={args.steps}"] if args.steps else [])
    runs = train_pair(data, overrides, args.out_dir, not args.no_progress)
    nac, pio = (runs[m]["run_dir"] for m in MODELS)
    print(f"modwire.analysis.analyze: dropping {', '.join(f'{f:g}' for f in args.drop)} of the modules / "
          f"latents,\nscoring each copy on up to {args.max_samples} test images", flush=True)
    summary = analyze(nac, [pio], out_dir=os.path.join(args.out_dir, "analysis"), drop=args.drop, edges=[0.0],
                      max_samples=args.max_samples, batch=32, iters=1, plots=not args.no_plots, log=None)
    print_drop_table(summary, runs)
    for m in MODELS:
        print(f"{m}: {runs[m]['params']:,} parameters, {runs[m]['steps']} steps in {runs[m]['seconds']:.0f} s, "
              f"run {runs[m]['run_dir']}")
    plot = next((p for p in summary["files"] if p.endswith("accuracy_vs_modules_dropped.png")), None)
    print(f"plot: {plot}" if plot else "plot: none (--no-plots)")
    print(f"all files: {os.path.join(args.out_dir, 'analysis')}; total {time.perf_counter() - start:.0f} s, "
          f"CPU threads: {torch.get_num_threads()}")
    return summary


# ----------------------------------------------------------------------------- --race, --forward

# The race (``--race``): ListOps (NAC Table 3) with short expressions (depth ≤ 3, at most
# 64 tokens; the race prints each model's train steps/s); chance is 10%. configs/cpu/nac_listops.yaml
# and perceiver_io_listops.yaml hold the same settings. Each model trains at its best peak
# learning rate and warm-up from experiments/table1_ladder.py's sweep (the paper, too, tunes them
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
                    help="fractions of modules / latents to drop (default 0 to 0.9375)")
    ap.add_argument("--max-samples", type=int, default=2000, help="test images scored per dropped copy")
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
        _out_dir_or_usage_error(args.out_dir, (*MODELS, "analysis"))
        dropping_demo(args)


def _out_dir_or_usage_error(out_dir: str, parts: tuple[str, ...]) -> None:
    try:
        fresh_out_dir(out_dir, parts)
    except ValueError as exc:
        parser().error(str(exc))


if __name__ == "__main__":
    main()
