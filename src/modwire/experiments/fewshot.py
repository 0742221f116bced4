"""What the two few-shot studies share: NAC Fig. 4 (``nac_fewshot.py``) and NI Fig. 5a (``ni_fewshot.py``).

Both pre-train two models, then fine-tune each with ``k`` samples per class over several seeds
through ``modwire finetune``'s machinery, one job per (model, k), with an optional learning-rate
check. Each study keeps its own models, jobs and data; this module holds the rest: reading the
job records, the curves they make, the table rows, the plot and the command-line options.

A job record (one line of ``OUT/results.jsonl``) has ``model``, ``shots`` (``-1``: pre-training),
``lr``, ``check`` and, for a fine-tuning, ``values`` (seed → top-1), ``mean``, ``std`` and ``n``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from modwire.experiments import common


def load_results(path: Path) -> dict[str, dict]:
    """Finished jobs by key (``modwire.analysis.results_log``: a last line cut short is dropped)."""
    from modwire.analysis.results_log import load_results as read

    return read(path)


def finished(record: dict | None, *, pretrain: bool, seeds: int, quick: bool) -> bool:
    """A job is done when its record exists at the same ``quick``, with every seed for a fine-tuning."""
    return (record is not None and (pretrain or record.get("n", 0) >= seeds)
            and record.get("quick", False) == quick)


def brief(r: dict) -> str:
    """One line of progress for a finished job."""
    if r["shots"] < 0:
        return f"val top-1 {r['val']['top1']:.3f}"
    return f"top-1 {r['mean']:.3f} ± {r['std'] or 0:.3f} over {r['n']} seed(s)"


def finetune(config_for: Callable, seeds: list[int], out: Path) -> dict:
    """Fine-tune every seed (``modwire finetune``'s ``finetune_seeds``: each a resumable run in
    ``out/seed-<s>``), drop their checkpoints (their result.json, config and metrics stay) and
    return the summary's ``values``, ``mean``, ``std``, ``n``, ``batch_size``, ``epochs`` and ``ways``."""
    from modwire.training.finetune import finetune_seeds

    summary, code = finetune_seeds(config_for, seeds, out, log=lambda s: None)
    if code != 0:
        raise RuntimeError(f"interrupted (exit code {code}); rerun to resume")
    for seed in seeds:
        shutil.rmtree(out / f"seed-{seed}" / "checkpoints", ignore_errors=True)
    return {k: summary[k] for k in ("values", "mean", "std", "n", "batch_size", "epochs", "ways")}


def curves(results: Iterable[dict], *, check: bool = False) -> dict[tuple[str, float], dict[int, dict]]:
    """Fine-tuning records (of the lr check when ``check``) by (model, lr), then by shots."""
    out: dict[tuple[str, float], dict[int, dict]] = {}
    for r in results:
        if r["shots"] >= 0 and r.get("check", False) == check:
            out.setdefault((r["model"], r["lr"]), {})[r["shots"]] = r
    return out


def cell(r: dict | None) -> str:
    """``mean ± std`` in %, the mean alone for one seed, empty for no record."""
    if r is None:
        return ""
    std = r["std"]
    return f"{100 * r['mean']:.1f} ± {100 * std:.1f}" if std is not None else f"{100 * r['mean']:.1f}"


def shot_rows(results: dict[str, dict], models: list[str], lrs: dict[str, float]) -> list[list]:
    """One row per k: each model's top-1 at its lr, the first minus the second, the fewest seeds."""
    cur = curves(results.values())
    main = {m: cur.get((m, lrs[m]), {}) for m in models}
    rows = []
    for k in sorted({k for c in main.values() for k in c}):
        rs = [main[m].get(k) for m in models]
        gap = f"{100 * (rs[0]['mean'] - rs[1]['mean']):+.1f}" if len(rs) == 2 and all(rs) else ""
        rows.append([k, *(cell(r) for r in rs), gap, min((r["n"] for r in rs if r), default=0)])
    return rows


def check_rows(results: dict[str, dict], labels: dict[str, str], *, lr_descending: bool = False) -> list[list]:
    """The lr check's rows: model, k, lr, top-1, by model, k and lr."""
    found = [(key, k, r) for key, c in curves(results.values(), check=True).items() for k, r in c.items()]
    found.sort(key=lambda t: (t[0][0], t[1], -t[0][1] if lr_descending else t[0][1]))
    return [[labels[m], k, f"{lr:g}", f"{100 * r['mean']:.1f}"] for (m, lr), k, r in found]


def plot(results: dict[str, dict], models: list[str], labels: dict[str, str], lrs: dict[str, float], path: Path, *,
         xlabel: str, ylabel: str, title: str, chance: float | None = None) -> Path | None:
    """Top-1 vs samples per class (log x), one line per model, error bars = std over seeds."""
    cur = curves(results.values())
    lines = {m: sorted(cur.get((m, lrs[m]), {}).items()) for m in models}
    if not any(lines.values()):
        return None

    def draw(fig, ax):
        for m, pts in lines.items():
            if pts:
                ax.errorbar([k for k, _ in pts], [100 * r["mean"] for _, r in pts],
                            yerr=[100 * (r["std"] or 0) for _, r in pts], marker="o", capsize=3,
                            label=f"{labels[m]} (lr {lrs[m]:g})")
        if chance is not None:
            ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance")
        ax.set_xscale("log")
        ks = sorted({k for pts in lines.values() for k, _ in pts})
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return common.save_figure(path, draw, figsize=(5.5, 4))


def require_readable(script: str, what: str, task: str, params: dict) -> None:
    """Fail early, with the fix, when the study's Fashion-MNIST (``task`` with ``params``) is not installed."""
    from modwire.tasks import build_dataset

    try:
        build_dataset(task, "test", **params)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise SystemExit(f"{script}: {what} {task} is not readable ({e}); on Debian: apt-get install "
                         f"dataset-fashion-mnist, or pass --data-root DIR") from None


def add_arguments(ap: argparse.ArgumentParser, default_lrs: dict[str, float], labels: dict[str, str],
                  shots: Iterable[int], check_help: str) -> None:
    """The options both studies take: ``--models``, ``--shots``, ``--seeds``, ``--<model>-lr``,
    ``--lr-check``, ``--lr-check-only`` and ``--data-root`` (Fashion-MNIST's directory)."""
    ap.add_argument("--models", default=",".join(default_lrs))
    ap.add_argument("--shots", default=",".join(map(str, shots)), help="samples per class, comma-separated")
    ap.add_argument("--seeds", type=common.positive, default=3)
    for m, lr in default_lrs.items():
        ap.add_argument(f"--{m}-lr", type=float, default=None, help=f"{labels[m]}'s fine-tuning lr (default {lr})")
    ap.add_argument("--lr-check", action="store_true", help=check_help)
    ap.add_argument("--lr-check-only", action="store_true", help="the lr check without the curve")
    ap.add_argument("--data-root", default=None, help="the directory of Fashion-MNIST's four idx files (default: "
                                                       "where Debian's dataset-fashion-mnist installs them)")


def parse_arguments(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, with ``--data-root`` made absolute (the worker processes and a resume read the same
    files) and ``--lr-check-only`` implying ``--lr-check``."""
    args = ap.parse_args(argv)
    if args.data_root:
        args.data_root = os.path.abspath(os.path.expanduser(args.data_root))
    args.lr_check |= args.lr_check_only
    if args.workers < 0:
        ap.error(f"--workers: expected 0 (in this process) or more, got {args.workers}")
    return args


def parse_plan(args: argparse.Namespace, known: Iterable[str], script: str) -> tuple[list[str], list[int]]:
    """``(models, shots)`` of ``--models`` and ``--shots``, each checked."""
    models = args.models.split(",")
    unknown = [m for m in models if m not in known]
    if unknown:
        raise SystemExit(f"{script}: unknown model {unknown}; models: {list(known)}")
    shots = [int(s) for s in args.shots.split(",")]
    if not shots or min(shots) < 1:
        raise SystemExit(f"{script}: --shots expects whole numbers >= 1, got {args.shots!r}")
    return models, shots


def lr_of(model: str, args: argparse.Namespace, default: Callable[[str], float]) -> float:
    """``--<model>-lr`` where given, else the model's default."""
    return getattr(args, f"{model}_lr") or default(model)


def run_study(args: argparse.Namespace, name: str, *, check_data: Callable[[], None],
              plan: Callable[[argparse.Namespace], tuple[list, list]], run_jobs: Callable[..., list[str]],
              report: Callable[[Path, list[str], dict[str, float]], str], lrs: dict[str, float],
              script: str, argv: list[str] | None) -> int:
    """The command: pre-train, then fine-tune (or, with ``--report``, only read the log), print the
    table and write ``OUT/study.json``. Its seeds are the curve's (the lr check's seed is not one)."""
    started = time.perf_counter()
    out, models = args.out, args.models.split(",")
    failed: list[str] = []
    if not args.report:
        check_data()
        pre, ft = plan(args)
        failed = run_jobs(pre, out, args.workers)
        if not failed:                   # fine-tuning needs both pre-trained models
            failed = run_jobs(ft, out, args.workers)
        print(f"ran in {(time.perf_counter() - started) / 60:.1f} minutes")
    print(report(out, models, lrs))
    results = [r for r in load_results(out / "results.jsonl").values() if r["model"] in models]
    curve = [r for r in results if not r.get("check", False)]
    seeds = sorted({int(s) for r in curve for s in r.get("values", {})}) if args.report else range(args.seeds)
    common.finish_study(out, name, results, args=args, started=started, seeds=seeds, logs=[out / "results.jsonl"],
                        script=script, argv=argv)
    if failed:
        print(f"{len(failed)} jobs failed (not in the table):\n  " + "\n  ".join(failed))
    return 1 if failed else 0
