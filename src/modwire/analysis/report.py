"""``modwire analyze``: inference-time sparsification of trained runs (NAC §3 "Effect of
Dropping Modules", Fig. 5, App. F Fig. 10 and 15) and pictures of the learned graph
(NAC App. A.2, Fig. 8). A run whose model does not describe its modules (an AiT, a ResNet,
a transformer LM, ...) gets what its declared capabilities give it instead:
:mod:`modwire.analysis.kinds` (the table of analyses: :mod:`modwire.analysis.catalog`).

For a trained run (and optional baseline runs, e.g. the Perceiver IO of Fig. 5/15), in
three parts, one file each:

* **Dropping modules** (Fig. 5a/b, 15; :mod:`modwire.analysis.dropping`): for each fraction ``f`` the run's model loses
  ``round(f·U)`` processor modules — for a NAC those with the smallest importance
  ``q_i = Σ_j P_ij`` (App. F Eq. 10), for a Perceiver IO its last latents
  (:func:`~modwire.analysis.sparsify.drop_modules`), and with ``draws=N`` (``--draws N``) also
  ``N`` random subsets, the same index subsets for every run with as many modules — and the
  copy is evaluated on the validation split (every metric of the task), timed (samples/s, eval
  mode, ``torch.inference_mode``, median of a few batches, all models interleaved) and its
  FLOPs counted (:func:`~modwire.analysis.flops.count_flops` on one batch / batch size).
* **Eliminating edges** (Fig. 10, NAC runs; :mod:`modwire.analysis.edges`): for each fraction the smallest off-diagonal
  ``P_ij`` are set to 0 (:func:`~modwire.analysis.sparsify.eliminate_edges`) and the copy
  is evaluated; its propagators are timed dense-masked and block-sparse
  (:func:`~modwire.analysis.sparsify.block_sparse`, modules ordered by the matched blocks
  of a planted-partition / ring-of-cliques prior, else by reverse Cuthill-McKee), and the
  two outputs compared.
* **Writing** (this file): the curves' CSV files, ``summary.json``, a table, and
  **graph pictures** (Fig. 8): the graph of ``P_ij > 0.5`` drawn force-directed, and a
  heatmap of ``P`` — in the frame of the run's graph prior (modules ordered by the
  matching to ``P0``) next to ``P0``, or, without a prior, by descending ``q_i``.

Outputs (``OUT``, default ``RUN_DIR/analysis``): ``modules_dropped.csv`` (one row per dropped
copy: its ``order``, ``draw`` and ``dropped`` indices), with draws ``modules_dropped_stats.csv``
(mean and std over the draws), ``edges_removed.csv``, ``summary.json`` and PNGs
(:mod:`modwire.analysis.plots`).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .dropping import Progress, check_drop_fractions, check_draws, drop_stats, module_dropping_curve
from .edges import GRAPH_THRESHOLD, edge_curve, graph_frame, graph_summary, link_probs
from .catalog import is_conditional_run
from .runs import AnalyzedRun, load_run, open_run, output_dir, run_model_class
from ..models.capabilities import ModuleSurgery
from ..errors import UserError
from ..files import atomic_write_text
from ..training.checkpoint import resolve_checkpoint
from ..training.ema import weight_files, weights_note

__all__ = ["DEFAULT_DROP_FRACTIONS", "DEFAULT_EDGE_FRACTIONS", "analyze", "check_fractions", "load_run",
           "parse_fractions"]

DEFAULT_DROP_FRACTIONS = (0.0, 0.25, 0.5, 0.625, 0.75, 0.8125, 0.875, 0.9375)
DEFAULT_EDGE_FRACTIONS = (0.0, 0.5, 0.8, 0.9, 0.92, 0.94, 0.96, 0.98, 1.0)


# ----------------------------------------------------------------------------- fractions

def check_fractions(values: Sequence[float], what: str, closed: bool) -> list[float]:
    """Each value a finite number in ``[0, 1)`` (``closed=False``) or ``[0, 1]``."""
    values = list(values)
    if not values:
        raise UserError(f"{what}: expected at least one fraction")
    interval = "[0, 1]" if closed else "[0, 1)"
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                not (0 <= v <= 1 if closed else 0 <= v < 1):
            raise UserError(f"{what}: every fraction must be a number in {interval}, got {v!r}")
    return [float(v) for v in values]


def parse_fractions(text: str, what: str, closed: bool) -> list[float]:
    """``"0,0.5,.9"`` (commas and/or spaces) → checked floats (see :func:`check_fractions`)."""
    parts = [t for t in str(text).replace(",", " ").split() if t]
    values = []
    for t in parts:
        try:
            values.append(float(t))
        except ValueError:
            raise UserError(f"{what}: expected comma-separated fractions in "
                            f"{'[0, 1]' if closed else '[0, 1)'}, got {t!r}") from None
    return check_fractions(values, what, closed)


# ----------------------------------------------------------------------------- the analysis

def analyze(run_dir: str | os.PathLike, baselines: Sequence[str | os.PathLike] = (),
            out_dir: str | os.PathLike | None = None, drop: Sequence[float] | None = None,
            edges: Sequence[float] | None = None, split: str | None = None, batch: int | None = None,
            max_samples: int | None = None, overrides: Sequence[str] = (), plots: bool = True,
            iters: int | None = None, block_size: int | None = None, draws: int = 0, draw_seed: int = 0,
            progress: Progress | None = None, log: Callable[[str], None] | None = print,
            weights: str | None = None) -> dict[str, Any]:
    """Run the analysis (see the module docstring) and write its files to ``out_dir``
    (default ``run_dir/analysis``). ``drop=None``: :data:`DEFAULT_DROP_FRACTIONS`;
    ``edges=None``: the default fractions for a NAC run, none for a Perceiver IO; explicit
    fractions need a NAC with link probabilities. Returns the summary (also written to
    ``summary.json``). ``batch`` / ``iters`` (None: 64 / 3) and ``block_size`` set the throughput
    and FLOP measurements of module dropping. ``draws`` (0, or >= 2) random drop orders from
    ``draw_seed`` are scored besides each model's own order (:mod:`modwire.analysis.dropping`);
    ``progress(done, total)`` follows the dropped copies as they are scored. ``weights``: None, the
    weights validation scored (the EMA's when the run kept one), or ``"live"`` / ``"ema"``.

    A conditional NAC gets its circuits (NAC Fig. 6: :func:`modwire.analysis.circuits.analyze_circuits`,
    ``max_samples`` default 1000). A run whose model does not describe its modules (no
    :class:`~modwire.models.capabilities.ModuleSurgery`) gets what applies to it instead
    (:func:`modwire.analysis.kinds.analyze_model`: its metrics, an AiT's workspace analyses,
    an NFM model's read map); ``baselines``, ``drop``, ``edges`` and the timing options are refused for it."""
    refuse = [flag for flag, given in (("--baseline", bool(list(baselines))), ("--drop", drop is not None),
                                       ("--edges", edges is not None), ("--batch", batch is not None),
                                       ("--iters", iters is not None), ("--block-size", block_size is not None),
                                       ("--draws", bool(draws)))
              if given]
    if is_conditional_run(run_dir):  # NAC Fig. 6: the designs a conditional generator produces (catalog: circuits)
        from .circuits import analyze_circuits

        if refuse:
            raise UserError(f"{run_dir} holds a conditional NAC: modwire analyze shows its circuits (NAC Fig. 6); "
                            f"{', '.join(refuse)} {'is' if len(refuse) == 1 else 'are'} for dropping modules")
        return analyze_circuits(run_dir, out=out_dir, overrides=overrides, split=split,
                                max_samples=max_samples or 1000, weights=weights, log=log or (lambda s: None))
    cls = run_model_class(run_dir)
    if cls is not None and not issubclass(cls, ModuleSurgery):
        from .kinds import analyze_model

        return analyze_model(run_dir, out_dir=out_dir, split=split, max_samples=max_samples, overrides=overrides,
                             plots=plots, refuse=refuse, log=log, weights=weights)
    batch, iters = 64 if batch is None else batch, 3 if iters is None else iters
    drop, edges = _check_options(DEFAULT_DROP_FRACTIONS if drop is None else drop, edges, batch=batch,
                                 max_samples=max_samples, iters=iters, block_size=block_size, plots=plots)
    draws, draw_seed = check_draws(draws, draw_seed)
    say = log or (lambda s: None)
    # load every run first: bad paths and kinds fail before any long computation
    names: set[str] = set()
    main = open_run(run_dir, overrides, split, max_samples, names, weights)
    runs = [main, *(open_run(b, overrides, split, max_samples, names, weights) for b in baselines)]
    for r in runs[1:]:   # a baseline is compared on the same data: the same task and parameters
        if (r.cfg.data.task, r.cfg.data.params) != (main.cfg.data.task, main.cfg.data.params):
            raise UserError(f"--baseline {r.path}: trained on task {r.cfg.data.task!r} with params "
                            f"{dict(r.cfg.data.params)}, but {run_dir} on {main.cfg.data.task!r} with "
                            f"{dict(main.cfg.data.params)}: a baseline must share the run's task and data")
    if edges is not None and not main.has_graph:
        what = "a NAC without a kernel (kernel.enabled=False)" if main.kind == "nac" else f"a {main.kind} model"
        raise UserError(f"--edges needs a NAC run with link probabilities P (NAC with kernel.enabled=True); "
                        f"{run_dir} is {what} ({main.cfg.model.name}): leave --edges out for it")
    check_drop_fractions(runs, drop)
    device = torch.device("cuda" if torch.cuda.is_available() and main.cfg.device != "cpu" else "cpu")
    for r in runs:
        r.model.to(device)
    out = output_dir(out_dir if out_dir is not None else Path(run_dir) / "analysis")
    split_name = split or main.cfg.data.val_split
    ckpt = resolve_checkpoint(run_dir)
    say(f"analyzing {main.label}: {main.num_modules} {main.noun}, task {main.cfg.data.task!r}, split "
        f"{split_name!r}, {len(main.dataset)} samples, device {device.type}"
        + (f"; baselines: {', '.join(r.label for r in runs[1:])}" if runs[1:] else "")
        + f"; weights: {weights_note(ckpt, weights)}")

    drop_rows = module_dropping_curve(runs, drop, batch=batch, iters=iters, device=device, draws=draws,
                                      draw_seed=draw_seed, progress=progress)
    edge_rows = edge_curve(runs, list(DEFAULT_EDGE_FRACTIONS) if edges is None else edges, batch=batch,
                           iters=iters, block_size=block_size, device=device)
    summary = write_outputs(out, runs, drop_rows, edge_rows, split=split_name, batch=batch, iters=iters,
                            device=device, plots=plots, draws=draws, draw_seed=draw_seed,
                            weights=weights or weight_files(ckpt)[1])
    say(_table(drop_rows, edge_rows, summary["metric"], summary["modules_dropped_stats"]))
    say("wrote:\n" + "\n".join(f"  {p}" for p in summary["files"]))
    return summary


def _check_options(drop, edges, *, batch: int, max_samples: int | None, iters: int, block_size: int | None,
                   plots: bool) -> tuple[list[float], list[float] | None]:
    """Validated, de-duplicated fractions (``edges`` None: not given) and numeric options."""
    drop = list(dict.fromkeys(check_fractions(drop, "--drop (fractions of modules to drop)", closed=False)))
    if edges is not None:
        edges = list(dict.fromkeys(check_fractions(edges, "--edges (fractions of edges to remove)", closed=True)))
    if batch < 1:
        raise UserError(f"--batch: expected >= 1, got {batch}")
    if max_samples is not None and max_samples < 1:
        raise UserError(f"--max-samples: expected >= 1, got {max_samples}")
    if iters < 1:
        raise UserError(f"--iters: expected >= 1, got {iters}")
    if block_size is not None and block_size < 1:
        raise UserError(f"--block-size: expected >= 1, got {block_size}")
    if plots:
        from .plots import require_plotting

        require_plotting()
    return drop, edges


# ----------------------------------------------------------------------------- writing

def write_outputs(out: Path, runs: list[AnalyzedRun], drop_rows: list[dict[str, Any]], edge_rows: list[dict[str, Any]],
                  *, split: str, batch: int, iters: int, device: torch.device, plots: bool, draws: int = 0,
                  draw_seed: int = 0, weights: str = "live") -> dict[str, Any]:
    """Write ``modules_dropped.csv``, ``modules_dropped_stats.csv`` (with random draws),
    ``edges_removed.csv`` (if any rows), the PNGs and ``summary.json`` into ``out``; return the
    summary (its ``files`` lists them all; ``weights``: which of the runs' checkpoint weights were scored,
    ``live`` or ``ema``)."""
    main, others = runs[0], runs[1:]
    keys: list[str] = []
    for row in drop_rows + edge_rows:
        metrics = {k: v for k, v in row.items() if k not in _NON_METRIC}
        keys += [k for k in _metric_keys(metrics, main.info) if k not in keys]
    files = [_write_csv(out / "modules_dropped.csv", drop_rows,
                        ["run", "model", "fraction_dropped", "modules_kept", "order", "draw", *keys, "samples_per_s",
                         "gflops_per_sample", "dropped"])]
    stats = drop_stats(drop_rows, keys)
    if stats:
        files.append(_write_csv(out / "modules_dropped_stats.csv", stats, list(stats[0])))
    if edge_rows:
        files.append(_write_csv(out / "edges_removed.csv", edge_rows,
                                ["run", "fraction_removed", "edges_kept", *keys, "samples_per_s_dense_masked",
                                 "samples_per_s_block_sparse", "block_size", "block_density",
                                 "block_sparse_max_abs_diff"]))
    graphs = {r.name: graph_summary(r) for r in runs if r.has_graph}
    metric = main.info.metrics[0]
    if plots:
        files += _plots(out, runs, drop_rows, edge_rows, metric, split, main, stats)
    summary = {
        "run": str(main.path), "model": main.cfg.model.name, "model_type": main.kind, "task": main.cfg.data.task,
        "split": split, "num_samples": len(main.dataset), "metric": metric, "num_modules": main.num_modules,
        "weights": weights,
        "batch": batch, "timing_iters": iters, "device": device.type, "torch_threads": torch.get_num_threads(),
        "baselines": [{"run": str(r.path), "name": r.name, "model": r.cfg.model.name, "model_type": r.kind,
                       "num_modules": r.num_modules} for r in others],
        "drop_draws": draws, "drop_seed": draw_seed if draws else None,
        "modules_dropped": drop_rows, "modules_dropped_stats": stats, "edges_removed": edge_rows, "graphs": graphs,
    }
    summary_path = out / "summary.json"
    files.append(summary_path)
    summary["files"] = [str(p) for p in files]
    atomic_write_text(summary_path, json.dumps(summary, indent=2) + "\n")
    return summary


_NON_METRIC = {"run", "model", "fraction_dropped", "modules_kept", "order", "draw", "dropped", "samples_per_s",
               "gflops_per_sample", "fraction_removed", "edges_kept", "samples_per_s_dense_masked",
               "samples_per_s_block_sparse", "block_size", "block_density", "block_sparse_max_abs_diff"}


def _metric_keys(metrics: dict[str, float], info) -> list[str]:
    first = [k for k in info.metrics if k in metrics]
    rest = [k for k in metrics if k not in first and k != "loss"]
    return first + rest + (["loss"] if "loss" in metrics else [])


def _cell(v: Any) -> Any:
    """A CSV cell: floats exactly (``repr``), index lists space-separated, None empty."""
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, list):
        return " ".join(map(str, v))
    return "" if v is None else v


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> Path:
    """The rows as CSV, written atomically (a rerun's kill leaves the previous file whole)."""
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for row in rows:
        w.writerow({k: _cell(v) for k, v in row.items()})
    return atomic_write_text(path, text.getvalue())


def _table(drop_rows, edge_rows, metric: str, stats) -> str:
    lines = [f"{'run':<24}{'dropped':>9}{'kept':>7}{metric:>10}{'samples/s':>12}{'GFLOPs/sample':>15}  order"]
    for r in (r for r in drop_rows if r["order"] != "random"):
        lines.append(f"{r['run'][:23]:<24}{r['fraction_dropped']:>9.4g}{r['modules_kept']:>7}"
                     f"{r.get(metric, float('nan')):>10.4f}{r['samples_per_s']:>12.1f}"
                     f"{r['gflops_per_sample']:>15.4g}  {r['order']}")
    if stats:
        lines.append(f"{'run':<24}{'dropped':>9}{'kept':>7}{metric + ' mean ± std over random draws':>40}")
        for r in stats:
            lines.append(f"{r['run'][:23]:<24}{r['fraction_dropped']:>9.4g}{r['modules_kept']:>7}"
                         f"{r[metric + '_mean']:>29.4f} ± {r[metric + '_std']:.4f} ({r['draws']})")
    if edge_rows:
        lines.append(f"{'run':<24}{'edges removed':>14}{'kept':>7}{metric:>10}{'dense/s':>10}{'block/s':>10}"
                     f"{'density':>9}")
        for r in edge_rows:
            lines.append(f"{r['run'][:23]:<24}{r['fraction_removed']:>14.4g}{r['edges_kept']:>7}"
                         f"{r.get(metric, float('nan')):>10.4f}{r['samples_per_s_dense_masked']:>10.1f}"
                         f"{r['samples_per_s_block_sparse']:>10.1f}{r['block_density']:>9.3f}")
    return "\n".join(lines)


def _plots(out: Path, runs: list[AnalyzedRun], drop_rows, edge_rows, metric: str, split: str, main: AnalyzedRun,
           stats) -> list[Path]:
    from .plots import plot_curves, plot_graph, plot_link_probs

    labels = {r.name: r.label for r in runs}

    def series(rows, x, y, name=lambda row: labels[row["run"]]):
        by: dict[str, tuple[list, list]] = {}
        for row in rows:
            xs, ys = by.setdefault(name(row), ([], []))
            xs.append(x(row))
            ys.append(row.get(y, float("nan")))
        return by

    u_of = {r.name: r.num_modules for r in runs}
    dropped = lambda row: u_of[row["run"]] - row["modules_kept"]  # noqa: E731
    own = [row for row in drop_rows if row["order"] != "random"]
    accuracy = series(own, dropped, metric)
    if stats:   # each model's own order labelled as such, next to the mean over the random draws
        accuracy = {**series(own, dropped, metric, lambda row: f"{labels[row['run']]} ({row['order']} order)"),
                    **series(stats, dropped, f"{metric}_mean",
                             lambda row: f"{labels[row['run']]} (random, mean of {row['draws']})")}
    files = [
        plot_curves(accuracy, out / "accuracy_vs_modules_dropped.png",
                    "modules (NAC) / latents (PIO) dropped", f"{split} {metric}",
                    "dropping modules at inference time (NAC Fig. 5a, 15)"),
        plot_curves(series(own, dropped, "samples_per_s"), out / "throughput_vs_modules_dropped.png",
                    "modules (NAC) / latents (PIO) dropped", "samples / s (inference)",
                    "inference speed as modules are dropped (NAC Fig. 5b)"),
        plot_curves(series(own, lambda row: row["gflops_per_sample"], metric), out / "accuracy_vs_gflops.png",
                    "GFLOPs / sample", f"{split} {metric}", "accuracy vs compute (NAC Fig. 15)"),
    ]
    if edge_rows:
        files.append(plot_curves(series(edge_rows, lambda row: row["fraction_removed"], metric),
                                 out / "accuracy_vs_edges_removed.png", "edges removed (%)", f"{split} {metric}",
                                 "eliminating connections between modules (NAC Fig. 10)", percent_x=True))
        speed = {}
        for kind, key in (("dense masked", "samples_per_s_dense_masked"), ("block-sparse", "samples_per_s_block_sparse")):
            for label, xy in series(edge_rows, lambda row: row["fraction_removed"], key).items():
                speed[f"{label}, {kind}"] = xy
        files.append(plot_curves(speed, out / "throughput_vs_edges_removed.png", "edges removed (%)",
                                 "samples / s (inference)", "propagators dense-masked vs block-sparse",
                                 percent_x=True))
    for r in runs:
        if not r.has_graph:
            continue
        suffix = "" if r is main else f"_{r.name}"
        p = link_probs(r)
        order, p0, name, note = graph_frame(r, p)
        files.append(plot_graph(p, out / f"graph{suffix}.png", threshold=GRAPH_THRESHOLD, seed=0))
        files.append(plot_link_probs(p, out / f"link_probs{suffix}.png", prior=p0, order=order,
                                     title=f"{r.label}: {note}"))
    return files
