"""NI Table 1's "+ all" fine-tuning, instrumented (issue 35: why one seed collapses).

From the pre-training of an ``modwire.experiments.ni_fuzzy_boolean`` study (``--study DIR``: its
``pretrain/``), this re-runs ``modwire finetune`` on the 10 new functions exactly as the study does
(``fuzzy_boolean_adapt``, the study's points per function, batch 128, 3 epochs, RAdam at a constant
lr, no clipping), for each ``--train`` set × ``--lrs`` × ``--seeds``, keeping the weights every
``--every`` steps. For each run it records:

* the training loss every 8 steps (``metrics.jsonl``) and the validation R² at each epoch end;
* ``--clip C`` (not the study's protocol, which has no clipping): the same with the gradients'
  global norm clipped at ``C`` (as the pre-training, ``optim.grad_clip``), runs in ``…-clipC/``;
* at each kept snapshot: the validation R² (mean over the functions, and each function's), the
  distance each parameter group has moved from the pre-trained weights relative to their norm
  (``|θ_t - θ_0| / |θ_0|``; the new CLS tokens: their norm), each script's σ (Eq. 3), and the
  share of variables no function reads (``Σ_u C̃_ui = 0``; first validation batch, every
  function iteration), the CLS tokens' attention on the input tokens (ModAttn's weights ``W``
  summed over the inputs, mean over CLS tokens, functions and heads; per function iteration), the
  gradient's norm per group on that batch (MSE), and the predictions' spread (std over samples /
  the targets' std, mean over the functions; 0: a constant output).

Where the study itself fine-tuned a set at that lr (NI Table 3's 0.05), its own runs are measured
(no snapshots: their last checkpoint) instead of being trained again. Output: ``DIR/diagnosis/study.json``
(:mod:`modwire.analysis.study`'s one format, study ``<DIR's name>_diagnosis``): one record per run,
its summary (final R², best snapshot, largest late loss) and the measures above; each invocation
adds the runs it measures to the file's records (runs already there are kept, not measured again),
and its ``wall_time_s`` is that invocation's (the training runs' own times are in their
``metrics.jsonl``). The runs under ``DIR/diagnosis/`` are working state. Wall time: one fine-tuning
run (~7-10 min on one core) per train set × lr × seed, and ~1-3 min to measure one run's snapshots.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

from modwire.experiments import common

GROUPS = (("cls_tokens", ("cls_tokens",)), ("embedding", ("embed.",)),
          ("type_inference", ("type_inference.", "log_sigma", "functions.signatures")),
          ("codes", ("functions.codes",)), ("locs", ("locs.",)), ("head", ("norm.", "heads.")))


def group_of(name: str) -> str:
    """The parameter group of an NI parameter name (:data:`GROUPS`, first match)."""
    for group, keys in GROUPS:
        if any(k in name for k in keys):
            return group
    raise ValueError(f"no group for parameter {name!r}")


class Run(NamedTuple):
    """One fine-tuning run: its parameter sets, lr and seed; ``rerun``: trained here even where the
    study has the run; ``clip``: the gradients' global norm bound (0: none, the study's protocol)."""

    train: str
    lr: float
    seed: int
    rerun: bool = False
    clip: float = 0.0

    @classmethod
    def of(cls, record: dict) -> "Run":
        return cls(**{k: record.get(k, cls._field_defaults.get(k)) for k in cls._fields})


def run_dir(study: Path, run: Run) -> Path:
    """The study's own run where it trained this set at this lr without clipping
    (``finetune-<set>/seed-<s>``) unless ``run.rerun``, else this script's
    (``diagnosis/<set>-lr<lr>[-clip<C>]/seed-<s>``)."""
    sets = run.train.replace(",", "+")
    own = study / f"finetune-{sets}"
    if not run.rerun and not run.clip and (own / "summary.json").is_file() \
            and json.loads((own / "summary.json").read_text())["lr"] == run.lr:
        return own / f"seed-{run.seed}"
    return study / "diagnosis" / (f"{sets}-lr{run.lr:g}" + (f"-clip{run.clip:g}" if run.clip else "")) / f"seed-{run.seed}"


def finetune(study: Path, run: Run, args: argparse.Namespace) -> None:
    """One ``modwire finetune`` run with the study's settings, the weights kept every ``args.every``."""
    out = run_dir(study, run).parent
    if (out / f"seed-{run.seed}" / "result.json").is_file() or out.name.startswith("finetune-"):
        return                      # finished, or the study's own run (the study trains it)
    code = common.modwire("finetune", str(study / "pretrain"), "--task", "fuzzy_boolean_adapt", "--train", run.train,
                          "--seeds", str(run.seed), "--epochs", str(args.adapt_epochs), "--lr", str(run.lr),
                          "--batch-size", "128", "--out", str(out), "--set",
                          f"data.params={{size: {{train: {args.adapt_points}, val: {args.val_points}}}}}",
                          "progress=false", "log_every=8", f"keep_weights_every={args.every}",
                          *([f"optim.grad_clip={run.clip}"] if run.clip else [])).returncode
    if code:
        raise SystemExit(code)


def measure(study: Path, run: Run) -> dict:
    """The records of one finished run (module docstring)."""
    import torch

    from modwire.models import from_pretrained
    from modwire.tasks import build_dataset
    from modwire.tasks.metrics import r2_per_column
    from modwire.training import load_config
    from modwire.training.checkpoint import choose_checkpoint

    d = run_dir(study, run)
    cfg = load_config(str(d / "config.yaml"))
    data = build_dataset(cfg.data.task, cfg.data.val_split, **cfg.data.params)
    x, y = (torch.stack(t) for t in zip(*(data[i] for i in range(len(data)))))
    pre = dict(from_pretrained(choose_checkpoint(study / "pretrain")[0]).named_parameters())
    lines = [json.loads(li) for li in (d / "metrics.jsonl").read_text().splitlines()]
    out = {**run._asdict(),
           "loss": [[r["step"], r["loss"]] for r in lines if "loss" in r],
           "val": [[r["step"], r["val_r2"]] for r in lines if "val_r2" in r],
           "final": json.loads((d / "result.json").read_text())["val"], "snapshots": []}
    snaps = sorted((d / "checkpoints").glob("weights-*"))
    last = next(iter(sorted((d / "checkpoints").glob("last-*"))[-1:]), None)
    if last is not None and not any(p.name.split("-")[1] == last.name.split("-")[1] for p in snaps):
        snaps.append(last)                       # the study's own runs keep no snapshots: their end
    for snap in snaps:
        model = from_pretrained(snap).eval()
        with torch.no_grad():
            pred = torch.cat([model(xb) for xb in x.split(512)])
            extra = model.forward_record(x[:512])
        per_fn = r2_per_column(pred, y)
        model.zero_grad()
        ((model(x[:512]) - y[:512]) ** 2).mean().backward()          # the task's loss (MSE) on one batch
        grads: dict[str, float] = {}
        for name, p in model.named_parameters():
            if p.grad is not None:
                grads[group_of(name)] = grads.get(group_of(name), 0.0) + float(p.grad.pow(2).sum())
        moved: dict[str, list[float]] = {}
        for name, p in model.named_parameters():
            g = group_of(name)
            base = pre.get(name)
            a, b = moved.setdefault(g, [0.0, 0.0])
            if base is None or base.shape != p.shape:        # new (the CLS tokens): their norm
                moved[g] = [a + float(p.detach().pow(2).sum()), b]
            else:
                moved[g] = [a + float((p.detach() - base.detach()).pow(2).sum()), b + float(base.detach().pow(2).sum())]
        unread = [float((C.sum(1) == 0).double().mean()) for C in extra.compatibility]
        t = model.config.num_cls_tokens                  # the CLS tokens come last: their attention on the inputs
        reads = [float(w[..., -t:, :-t].sum(-1).mean()) for w in extra.propagator_attention]
        out["snapshots"].append({
            "step": int(snap.name.split("-")[1]), "r2": float(per_fn.mean()), "r2_per_function": per_fn.tolist(),
            "moved": {g: (a ** 0.5 / b ** 0.5 if b else a ** 0.5) for g, (a, b) in moved.items()},
            "sigma": [float(s.log_sigma.detach().exp()) for s in model.scripts], "unread": unread,
            "cls_reads_inputs": reads,
            "grad_norm": {g: v ** 0.5 for g, v in grads.items()},
            "output_std": float((pred.std(0) / y.std(0)).mean())})
    return out


SUMMARY = ("final_r2", "best_snapshot_r2", "best_snapshot_step", "max_loss_after_64", "max_loss_step", "run")


def summarise(study: Path, run: dict) -> dict:
    """One run's record with its summary first: the final R², the best snapshot's R² and step, the
    largest training loss after step 64 and its step, and the run's folder."""
    late = [(loss, step) for step, loss in run["loss"] if step > 64]
    worst = max(late) if late else (None, None)
    best = max(run["snapshots"], key=lambda s: s["r2"]) if run["snapshots"] else None
    summary = [run["final"]["r2"], None if best is None else best["r2"], None if best is None else best["step"],
               worst[0], worst[1], _relative(run_dir(study, Run.of(run)))]
    return {**Run.of(run)._asdict(), **dict(zip(SUMMARY, summary)),
            **{k: v for k, v in run.items() if k not in Run._fields and k not in SUMMARY}}


def _relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(common.ROOT).as_posix()
    except (ValueError, TypeError):     # outside the clone, or no clone
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", type=Path, required=True, help="an ni_fuzzy_boolean.py output folder (its pretrain/)")
    ap.add_argument("--train", default="all", help="parameter sets, ';'-separated (each as modwire finetune --train)")
    ap.add_argument("--lrs", default="0.05", help="fine-tuning learning rates, comma-separated")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--every", type=int, default=32, help="keep the weights every N steps")
    ap.add_argument("--adapt-points", type=int, default=32768)
    ap.add_argument("--val-points", type=int, default=4096)
    ap.add_argument("--adapt-epochs", type=int, default=3)
    ap.add_argument("--rerun", action="store_true",
                    help="train into diagnosis/ (with snapshots) also where the study has its own run")
    ap.add_argument("--clip", type=float, default=0.0, help="clip the gradients' global norm (0: no, the protocol)")
    ap.add_argument("--report", action="store_true", help="only measure the finished runs")
    args = ap.parse_args(argv)
    import time

    import torch

    started = time.perf_counter()
    torch.set_num_threads(1)
    combos = [Run(t, float(lr), int(s), args.rerun, args.clip) for t in args.train.split(";")
              for lr in args.lrs.split(",") for s in args.seeds.split(",")]
    if not args.report:
        for run in combos:
            finetune(args.study, run, args)
    from modwire.analysis.study import read_study

    out = args.study / "diagnosis"
    old = read_study(out / common.RESULTS_FILE)["results"] if (out / common.RESULTS_FILE).is_file() else []
    done = {Run.of(r) for r in old}
    runs = old + [summarise(args.study, measure(args.study, c)) for c in combos
                  if c not in done and (run_dir(args.study, c) / "result.json").is_file()]
    runs.sort(key=lambda r: Run.of(r))
    common.write_study(out, f"{args.study.resolve().name}_diagnosis", runs, config=args,
                       seeds=sorted({r["seed"] for r in runs}), started=started)
    columns = (*Run._fields, *SUMMARY)
    print(common.markdown_table(columns, [[r[k] for k in columns] for r in runs]) if runs else "no finished runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
