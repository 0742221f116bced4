"""NI Table 1 at CPU scale: learning fuzzy Boolean expressions, then re-wiring the learned
functions for new ones (NI §4.1, App. B).

The paper pre-trains a Neural Interpreter to regress 20 random fuzzy Boolean functions of 5
variables at once (one CLS token per function, a shared regression head; NI Table 3), then adapts
it to 10 new functions with 10 new CLS tokens, training (1) the CLS tokens only, (2) + the type
inference parameters (type-inference MLP, signatures, σ: the routing), (3) + everything. If the
functions learned recomposable primitives, re-wiring alone (2) should come close to (3), well
above (1). Reported R² (mean ± std over the 10 new functions): 0.9983 (pre-training), 0.9202,
0.9857, 0.9953.

This runs the same protocol with ``modwire train`` and ``modwire finetune`` at CPU size (measured:
25 minutes on 2 cores with ``OMP_NUM_THREADS=2``, 13 of them pre-training): the NI Table 3
architecture at half width (``--width``; the paper's
128 with ``--width 128``), fewer points per function and epochs (``--points``, ``--epochs``),
fine-tuning with NI Table 3's optimiser (RAdam, lr 0.05, no schedule) on ``--adapt-points`` points
of each new function for 3 epochs, over ``--seeds``. Each stage is an ordinary training run
(checkpointed, resumable): rerunning the command after an interruption picks up where it stopped.
The three fine-tuning settings run in parallel worker processes (one thread each).

Output (``--out``, default ``experiments/results/ni_fuzzy_boolean``): ``pretrain/`` (the run),
``finetune-<setting>/`` (one run per seed, ``summary.json``), ``table.md``, ``table1.png`` and the
study run's record ``study.json`` (:mod:`modwire.experiments.common`; not written by ``--residual-growth``).
``--report`` reprints the table from those files and rebuilds ``study.json`` from them (no training);
``--quick`` is a smoke test (seconds).

Table 1's parameter sets are the paper's: the 10 new CLS tokens feed the pre-trained shared
regression head, which ``new_task`` keeps, so ``cls`` trains the CLS tokens alone ("all parameters
remain frozen, implying that the CLS tokens are the only trainable parameters"), ``cls,type_inference``
adds type inference (MLP, signatures, σ), ``all`` everything.

``--residual R`` pre-trains with NI Eq. 11's reading ``R`` (``interpreter_residual``: ``identity``, Eq. 11
as printed, the default; ``update``, modwire's reading that keeps the scale; ``none``, the authors'
code); the registry's study ``ni_fuzzy_boolean_residual_update`` is the ``update`` run (a Table 1
study with ``none`` has not been run).

``--residual-growth`` measures the three readings at initialisation on
``ni_digits`` and ``ni_fuzzy_boolean``: the residual stream's ``|x_i^{(k)}| / |x_i^{(0)}|`` after each
function iteration, and whether ``iterations=50`` runs (``residual_growth.json``; seconds).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from modwire.experiments import common
from modwire.files import atomic_write_text

CONFIG = common.CONFIGS / "cpu" / "ni_fuzzy_boolean.yaml"
PAPER = {"pretrain": (0.9983, 0.0005), "cls": (0.9202, 0.0198), "cls,type_inference": (0.9857, 0.0034),
         "all": (0.9953, 0.0013)}
SETTINGS = {"cls": "Finetuning CLS Tokens", "cls,type_inference": "+ Type Inference Parameters",
            "all": "+ Remaining Parameters"}


# ----------------------------------------------------------------------------- the two stages

def pretrain(args: argparse.Namespace) -> dict:
    """Pre-train on the 20 functions (``fuzzy_boolean``); returns the final validation metrics.
    A finished run is read back; an interrupted one resumes."""
    from modwire.training import load_config, train

    run = Path(args.out) / "pretrain"
    done = run / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    w = args.width
    residual = {} if args.residual is None else {"interpreter_residual": args.residual}
    cfg = load_config(CONFIG, values={
        "out_dir": run, "progress": False, "epochs": args.epochs, "log_every": 50,
        "data.params": {"size": {"train": args.points, "val": args.val_points}},
        "optim.min_lr": args.lr, "optim.lr": args.lr, "optim.warmup_steps": 0,   # NI Table 3: no schedule
        "model.overrides": {"d_model": w, "d_code": w, "type_hidden": w, "ffn_hidden": w, **residual}})
    result = train(cfg, resume=(run / "checkpoints" / "last" / "state.pt").is_file())
    if result["status"] != "finished":
        raise SystemExit(result["exit_code"])
    common.write_json_atomic(done, {"val": result["val"], "step": result["step"]})
    return {"val": result["val"], "step": result["step"]}


def finetune(setting: str, args: argparse.Namespace) -> int:
    """One fine-tuning setting on the 10 new functions (``fuzzy_boolean_adapt``), every seed:
    ``modwire finetune`` with new CLS tokens, RAdam at lr 0.05 (NI Table 3), 3 epochs."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")     # for the `modwire finetune` process
    out = Path(args.out)
    return common.modwire("finetune", str(out / "pretrain"), "--task", "fuzzy_boolean_adapt", "--train", setting,
                          "--seeds", args.seeds, "--epochs", str(args.adapt_epochs), "--lr", str(args.adapt_lr),
                          "--batch-size", "128", "--out", str(out / f"finetune-{setting.replace(',', '+')}"),
                          "--set", f"data.params={{size: {{train: {args.adapt_points}, val: {args.val_points}}}}}",
                          "progress=false").returncode


# ----------------------------------------------------------------------------- dynamic inference

def dynamic_inference(out: Path) -> dict:
    """The pre-trained model's validation R² with 1, 2, …, 2·n_i function iterations per script
    (anytime inference, NI Fig. 8: fewer, and more, than it was trained with; ``None`` where the
    reading refuses the count, :func:`~modwire.models.neural_interpreter.max_identity_iterations`)
    and with each function dropped in turn (NI Fig. 5c); cached in ``pretrain/dynamic.json``."""
    import copy

    import torch

    from modwire.models import from_pretrained
    from modwire.tasks import build_dataset, compute_metrics
    from modwire.training import load_config
    from modwire.training.checkpoint import choose_checkpoint

    path = out / "pretrain" / "dynamic.json"
    if path.is_file():
        return json.loads(path.read_text())
    cfg = load_config(str(out / "pretrain" / "config.yaml"))
    model = from_pretrained(choose_checkpoint(out / "pretrain")[0]).eval()
    data = build_dataset(cfg.data.task, cfg.data.val_split, **cfg.data.params)
    x, y = (torch.stack(t) for t in zip(*(data[i] for i in range(len(data)))))

    def r2(m, **kw) -> float | None:
        try:
            with torch.no_grad():
                return compute_metrics(("r2",), torch.cat([m(xb, **kw) for xb in x.split(512)]), y)["r2"]
        except ValueError:          # too many iterations for Eq. 11 as printed in this dtype
            return None

    n_i, u = model.config.num_iterations, model.config.num_functions
    with torch.no_grad():
        full = compute_metrics(("r2", "r2_std"), torch.cat([model(xb) for xb in x.split(512)]), y)
    result = {"checkpoint": {**full, "path": str(choose_checkpoint(out / "pretrain")[0].name)},
              "residual": model.config.interpreter_residual, "trained_iterations": n_i,
              "iterations": {str(k): r2(model, iterations=k) for k in range(1, 2 * n_i + 1)}, "dropped": {}}
    for f in range(u):
        m = copy.deepcopy(model)
        m.drop_functions([f])
        result["dropped"][str(f)] = r2(m)
    common.write_json_atomic(path, result)
    return result


def format_dynamic(d: dict) -> str:
    its = ", ".join(f"{k}: " + ("refused" if v is None else f"{v:.4f}") for k, v in d["iterations"].items())
    c = d.get("checkpoint")
    head = f"Pre-trained checkpoint {c['path']} (fine-tuning starts from it).\n" if c else ""
    drops = ", ".join(f"f{k}: {v:.4f}" for k, v in d["dropped"].items())
    return head + (f"Anytime inference (NI Fig. 8), pre-training R² by function iterations per script: {its}.\n"
            f"Function dropping (NI Fig. 5c), pre-training R² with one function removed: {drops}.")


# ----------------------------------------------------------------------------- Eq. 11: residual growth

READINGS = ("identity", "update", "none")


def _growth_inputs(preset: str, seed: int = 0) -> tuple:
    """``(x, forward kwargs)``: 8 random inputs of the preset's kind."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if preset == "ni_digits":
        return torch.rand(8, 3, 32, 32, generator=g), {"task": torch.arange(8) % 3}
    return torch.rand(8, 5, 1, generator=g), {}


def residual_growth_of(preset: str, residual: str) -> dict:
    """One preset and reading at initialisation (seed 0): the growth per function iteration
    (:func:`modwire.models.neural_interpreter.residual_growth`) and ``iterations=50``'s outcome."""
    import torch

    import modwire
    from modwire.models.neural_interpreter import residual_growth

    torch.manual_seed(0)
    model = modwire.create_model(preset, interpreter_residual=residual).eval()
    x, kw = _growth_inputs(preset)
    with torch.no_grad():
        tokens = model.embed(x)
        tokens = torch.cat([tokens, model.cls_tokens.expand(len(x), -1, -1)], dim=1)   # as SetModel._run
        ratios = residual_growth(model, tokens)
        try:
            fifty = "finite" if torch.isfinite(model(x, iterations=50, **kw)).all() else "NaN"
        except ValueError as e:
            fifty = f"refused: {e}"
    c = model.config
    return {"scripts": c.num_scripts, "iterations_per_script": c.num_iterations, "growth": ratios,
            "per_iteration": [b / a for a, b in zip([1.0] + ratios[:-1], ratios)], "iterations_50": fifty}


def residual_growth_table(out: Path) -> str:
    """Every preset × reading into ``out/residual_growth.json``; returns a Markdown summary."""
    result = {p: {r: residual_growth_of(p, r) for r in READINGS} for p in ("ni_digits", "ni_fuzzy_boolean")}
    common.write_json_atomic(out / "residual_growth.json", result)
    return common.markdown_table(
        ["preset", "interpreter_residual", "|x^(k)|/|x^(0)| after each function iteration", "iterations=50"],
        [[preset, residual, ", ".join(f"{g:.3g}" for g in r["growth"]), r["iterations_50"].split(";")[0]]
         for preset, readings in result.items() for residual, r in readings.items()])


# ----------------------------------------------------------------------------- the table

def setting_results(out: Path, setting: str) -> list[dict]:
    """Per seed: the validation metrics at the end of fine-tuning (``r2``: mean over the 10
    functions of each function's R²; ``r2_std``: their std). Each seed's run is read from
    ``seed-<s>/`` next to the summary (the summary's ``seed_runs`` name the directories the runs
    trained in, which a copied or committed study no longer has)."""
    return [json.loads(f.read_text())["val"] for f in seed_files(out, setting)]


def seed_files(out: Path, setting: str) -> list[Path]:
    """The ``result.json`` of each finished seed of a fine-tuning setting, in seed order."""
    folder = out / f"finetune-{setting.replace(',', '+')}"
    if not (folder / "summary.json").is_file():
        return []
    seeds = sorted(int(s) for s in json.loads((folder / "summary.json").read_text())["seed_runs"])
    return [f for s in seeds if (f := folder / f"seed-{s}" / "result.json").is_file()]


def rows(out: Path) -> list[tuple[str, str, tuple | None, tuple]]:
    """``(key, label, ours, paper)``; ours = (R² mean over seeds, std over functions (mean over
    seeds), std over seeds, seeds)."""
    table = []
    done, dynamic = out / "pretrain" / "result.json", out / "pretrain" / "dynamic.json"
    if done.is_file():   # the checkpoint the fine-tuning starts from (the best), else the last validation
        val = json.loads(dynamic.read_text())["checkpoint"] if dynamic.is_file() else \
            json.loads(done.read_text())["val"]
        table.append(("pretrain", "All Parameters (Pretraining)", (val["r2"], val["r2_std"], 0.0, 1),
                      PAPER["pretrain"]))
    for key, label in SETTINGS.items():
        res = setting_results(out, key)
        ours = None
        if res:
            mean, seed_std = common.mean_std(r["r2"] for r in res)
            ours = (mean, statistics.fmean(r["r2_std"] for r in res), seed_std, len(res))
        table.append((key, label, ours, PAPER[key]))
    return table


def format_table(table: list) -> str:
    """NI Table 1's rows, ours next to the paper's, then whether its ordering holds."""
    lines = [common.markdown_table(
        ["parameter set", "R² ours (± std over functions; ± std over seeds)", "R² NI Table 1"],
        [[label, "not run" if ours is None else f"{ours[0]:.4f} ± {ours[1]:.4f}"
          + (f"; ± {ours[2]:.4f} ({ours[3]} seeds)" if ours[3] > 1 else ""), f"{paper[0]:.4f} ± {paper[1]:.4f}"]
         for _, label, ours, paper in table])]
    got = {key: ours[0] for key, _, ours, _ in table if ours is not None}
    if {"cls", "cls,type_inference", "all"} <= set(got):
        order = got["cls"] < got["cls,type_inference"] <= got["all"]
        lines.append(f"\nTable 1 ordering (CLS only < + type inference ≤ + all): {'holds' if order else 'does NOT hold'}.")
    if "pretrain" in got:
        lines.append(f"Pre-training R² ≥ 0.99: {'yes' if got['pretrain'] >= 0.99 else 'no'} ({got['pretrain']:.4f}).")
    return "\n".join(lines)


def plot(table: list, path: Path) -> Path | None:
    """Ours next to NI Table 1, per parameter set (error bars: std over the new functions)."""
    done = [(label, ours, paper) for _, label, ours, paper in table if ours is not None]
    if not done:
        return None

    def draw(fig, ax):
        x = range(len(done))
        ax.bar([i - 0.2 for i in x], [o[0] for _, o, _ in done], 0.4, yerr=[o[1] for _, o, _ in done],
               label="modwire, CPU-sized", capsize=3)
        ax.bar([i + 0.2 for i in x], [p[0] for _, _, p in done], 0.4, yerr=[p[1] for _, _, p in done],
               label="NI Table 1", capsize=3)
        ax.set_xticks(list(x), [label.replace(" Parameters", "\nParameters") for label, _, _ in done], fontsize=7)
        ax.set_ylabel("R² (new functions)")
        ax.set_ylim(min(0.5, min(o[0] for _, o, _ in done) - 0.05), 1.0)
        ax.legend(loc="lower right", fontsize=8)
        ax.set_title("Fuzzy Boolean: adapting to 10 new functions (NI §4.1)", fontsize=9)
    return common.save_figure(path, draw, figsize=(7, 3.5))


def report(out: Path) -> tuple[str, list[dict]]:
    """The table (``out/table.md``) and figure (``out/table1.png``) from the run files; returns the
    text and the study's results (one record per row, then the dynamic-inference measurements)."""
    dynamic = dynamic_inference(out) if (out / "pretrain" / "result.json").is_file() else None
    table = rows(out)
    text = format_table(table)
    if dynamic is not None:
        text += "\n" + format_dynamic(dynamic)
    atomic_write_text(out / "table.md", text + "\n")
    plot(table, out / "table1.png")
    results = [{"setting": key, "label": label, "paper": paper,
                **({} if ours is None else dict(zip(("r2", "r2_std_functions", "r2_std_seeds", "seeds"), ours))),
                "r2_per_seed": [r["r2"] for r in setting_results(out, key)] if key in SETTINGS else
                [ours[0]] if ours else []}
               for key, label, ours, paper in table]
    return text, results + ([{"setting": "dynamic_inference", **dynamic}] if dynamic is not None else [])


def logs(out: Path) -> list[Path]:
    """The files the report reads: the pre-training's result and dynamic-inference files, each
    setting's summary and per-seed results."""
    files = [out / "pretrain" / "result.json", out / "pretrain" / "dynamic.json"]
    for setting in SETTINGS:
        files += [out / f"finetune-{setting.replace(',', '+')}" / "summary.json", *seed_files(out, setting)]
    return [f for f in files if f.is_file()]


# ----------------------------------------------------------------------------- the command

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = common.parser(__doc__, None, "tiny sizes, one seed", report="reprint the table from --out",
                       results="ni_fuzzy_boolean")
    ap.add_argument("--width", type=int, default=64, help="d_model = d_code = MLP widths (NI Table 3: 128)")
    ap.add_argument("--points", type=int, default=32768, help="training points per function (NI: 131072)")
    ap.add_argument("--val-points", type=int, default=4096, help="validation points per function (NI: 32768)")
    ap.add_argument("--epochs", type=int, default=14, help="pre-training epochs (NI: 20)")
    ap.add_argument("--lr", type=float, default=6e-3, help="pre-training lr, constant (NI Table 3: 0.006)")
    ap.add_argument("--adapt-points", type=int, default=32768, help="fine-tuning points per new function (NI: 131072)")
    ap.add_argument("--adapt-epochs", type=int, default=3, help="fine-tuning epochs (NI Table 3: 3)")
    ap.add_argument("--adapt-lr", type=float, default=0.05, help="fine-tuning lr, constant (NI Table 3: 0.05)")
    ap.add_argument("--seeds", default="0,1,2", help="fine-tuning seeds")
    ap.add_argument("--workers", type=int, default=2, help="parallel fine-tuning processes")
    ap.add_argument("--residual", choices=READINGS, default=None,
                    help="NI Eq. 11 reading (model interpreter_residual) to pre-train with; default: the model's "
                         "(identity, Eq. 11 as printed). The registry's study ni_fuzzy_boolean_residual_R runs R")
    ap.add_argument("--residual-growth", action="store_true",
                    help="only measure NI Eq. 11's residual growth at initialisation (residual_growth.json)")
    args = ap.parse_args(argv)
    for name in ("width", "points", "val_points", "epochs", "adapt_points", "adapt_epochs", "workers"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.quick:
        args.width, args.points, args.val_points, args.epochs = 16, 256, 128, 1
        args.adapt_points, args.adapt_epochs, args.seeds = 256, 1, "0"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.residual_growth:
        print(residual_growth_table(out))
        return 0
    if not args.report:
        val = pretrain(args)["val"]
        print(f"pre-training: R² {val['r2']:.4f} ± {val['r2_std']:.4f} (over the 20 functions)", flush=True)
        settings = list(SETTINGS)
        with ProcessPoolExecutor(min(args.workers, len(settings))) as pool:
            codes = list(pool.map(finetune, settings, [args] * len(settings)))
        if any(codes):
            print(f"fine-tuning stopped (exit codes {codes}); run the same command again to resume", file=sys.stderr)
            return max(codes)
    text, results = report(out)
    print(text)
    seeds = sorted({int(f.parent.name.split("-")[1]) for key in SETTINGS for f in seed_files(out, key)}) \
        if args.report else [int(s) for s in args.seeds.split(",") if s]
    name = "ni_fuzzy_boolean" + ("" if args.residual is None else f"_residual_{args.residual}")
    common.finish_study(out, name, results, args=args, started=started, seeds=seeds, logs=logs(out),
                        script=__file__, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
