"""``modwire train``'s throughput against the model's own train step (issue 25, item 7).

    python benchmarks/bench_train_loop.py [--cases nac_small vit_micro] [--batch 32] [--steps 6] [--rounds 3]
                                          [--workers 0 auto] [--device cpu|cuda] [--quick] [--out FILE.json]

Per case (a preset on a built-in generator task):

* ``step``: the model's own train step on batches already on the device (built once, before timing):
  forward, the task loss plus the model's weighted auxiliary losses, backward, gradient clipping,
  the optimizer step; samples per second over ``--steps`` steps after two warm-up steps.
* ``train (w)``: ``modwire.training.train`` end to end with ``data.num_workers=w``: data generation,
  collation, copies, label checks, logging, everything of the run; the rate is the trainer's own
  ``samples_per_s`` in ``metrics.jsonl``, over the steps after the first logged window (which holds
  the run's start: the loader's workers and the first batches).

One round times ``step`` and then a run for each worker setting, in turn; the table gives the median
over ``--rounds`` rounds and ``train / step`` for each setting, PASS when it is >= 0.80 (the goal:
the trainer keeps its device busy). A generator section times the vectorised synthetic tasks' items:
one at a time (``ds[i]``) against a batch at once (``ds.__getitems__``, what the DataLoader asks for).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from modwire.analysis import time_interleaved
from modwire.tasks import build_dataset, get_task
from modwire.training import load_config, train
from modwire.training.config import resolve_num_workers
from modwire.training.optim import build_optimizer
from modwire.training.runtime import call_model, compute_loss, make_loader, to_device
from modwire.training import build_model_for_task

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.80
CASES = {                           # name: (preset, task, task params besides size)
    "nac_small": ("nac_small", "triangle", {}),
    "vit_micro": ("vit_micro", "sort_of_clevr", {}),
    "nac_micro": ("nac_micro", "triangle", {}),
}
GENERATORS = ("triangle", "sort_of_clevr")


def config(case: str, batch: int, steps: int, workers: Any, device: str, out_dir: str | None = None):
    preset, task, params = CASES[case]
    size = {"train": max(batch * (steps + 4), 2 * batch), "val": batch}   # one epoch: no validation mid-run
    overrides = [f"model.name={preset}", f"data.task={task}", f"data.batch_size={batch}",
                 f"data.num_workers={workers}", f"device={device}", "progress=false",
                 "data.params=" + json.dumps({**params, "size": size})]
    if out_dir is not None:
        overrides.append(f"out_dir={out_dir}")
    return load_config(None, overrides)


def step_rate(case: str, batch: int, steps: int, device: str) -> float:
    """Samples/s of the model's own train step on batches already on ``device``."""
    cfg = config(case, batch, steps, 0, device)
    info = get_task(cfg.data.task)
    torch.manual_seed(cfg.seed)
    model = build_model_for_task(cfg).to(device).train()
    optimizer = build_optimizer(model, cfg.optim)
    dataset = build_dataset(cfg.data.task, "train", **cfg.data.params)
    loader = make_loader(dataset, batch, None, info, 0, drop_last=True)
    dev = torch.device(device)
    batches = [(to_device(x, dev), y.to(dev)) for _, (x, y) in zip(range(min(steps, 4)), loader)]
    weights = {**getattr(model, "aux_loss_defaults", {}), **cfg.aux_loss_weights}

    def one(x, y) -> None:
        out = call_model(model, x)
        loss = compute_loss(info, out, y, cfg.optim.label_smoothing)
        aux = model.auxiliary_losses() if hasattr(model, "auxiliary_losses") else {}
        loss = loss + sum(weights.get(k, 0.0) * v for k, v in aux.items())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for i in range(2):                                  # warm-up
        one(*batches[i % len(batches)])
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for i in range(steps):
        one(*batches[i % len(batches)])
    sync()
    return batch * steps / (time.perf_counter() - t)


def train_rate(case: str, batch: int, steps: int, workers: Any, device: str) -> float:
    """Samples/s of ``modwire train``: the trainer's logged rate after the first logged window."""
    log_every = 2
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(case, batch, steps, workers, device, out_dir=tmp)
        cfg.max_steps, cfg.log_every = log_every + steps, log_every
        train(cfg, overwrite=True)
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    rates = [r["samples_per_s"] for r in records if "samples_per_s" in r][1:]   # not the start's window
    return len(rates) / sum(1 / r for r in rates)      # equal samples per window: the harmonic mean


def generator_rows(batch: int, rounds: int) -> list[dict[str, Any]]:
    """ms per item of each vectorised generator, one item at a time against a batch at once."""
    rows = []
    for task in GENERATORS:
        ds = build_dataset(task, "train")
        n = len(ds)
        start = iter(range(rounds * 4 + 4))

        def indices() -> list[int]:       # fresh items every call (Sort-of-CLEVR keeps rendered images)
            k = next(start)
            return [(k * batch + i) * 7919 % n for i in range(batch)]

        def clear() -> None:
            getattr(ds, "_cache", {}).clear()

        t = time_interleaved({"per_item": lambda: (clear(), [ds[i] for i in indices()]),
                              "batched": lambda: (clear(), ds.__getitems__(indices()))}, iters=rounds, warmup=1)
        rows.append({"task": task, "batch": batch, "per_item_ms": round(1e3 * t["per_item"] / batch, 4),
                     "batched_ms": round(1e3 * t["batched"] / batch, 4),
                     "speedup": round(t["per_item"] / t["batched"], 2)})
    return rows


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def write_json(path: Path, data: dict) -> None:
    """``data`` as JSON at ``path``, atomically (a temporary file in its folder, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=["nac_small", "vit_micro"], choices=sorted(CASES))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", nargs="+", default=["0", "1", "auto"], help="data.num_workers settings to compare")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="vit_micro only, batch 8, 2 steps, 1 round (smoke test)")
    ap.add_argument("--out", help="also write the results as JSON here (atomically)")
    args = ap.parse_args()
    if args.quick:
        args.cases, args.batch, args.steps, args.rounds = ["vit_micro"], 8, 2, 1
    workers = [w if w == "auto" else int(w) for w in args.workers]
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "cpus_available": affinity, "threads": torch.get_num_threads(),
               "torch": torch.__version__, "python": platform.python_version(), "device": args.device,
               "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
               "auto_workers": resolve_num_workers("auto", device=args.device)}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {affinity} CPUs, {args.device}, "
          f"batch {args.batch}, {args.steps} timed steps, median of {args.rounds} interleaved rounds; "
          f"data.num_workers auto = {machine['auto_workers']}")
    rows = []
    for case in args.cases:
        preset, task, _ = CASES[case]
        times: dict[str, list[float]] = {"step": [], **{f"train_w{w}": [] for w in workers}}
        for _ in range(args.rounds):
            times["step"].append(step_rate(case, args.batch, args.steps, args.device))
            for w in workers:
                times[f"train_w{w}"].append(train_rate(case, args.batch, args.steps, w, args.device))
        med = {k: statistics.median(v) for k, v in times.items()}
        row: dict[str, Any] = {"case": case, "preset": preset, "task": task, "batch": args.batch,
                               "step_samples_per_s": round(med["step"], 2),
                               "step_rounds": [round(v, 2) for v in times["step"]]}
        for w in workers:
            ratio = med[f"train_w{w}"] / med["step"]
            row[f"train_w{w}_samples_per_s"] = round(med[f"train_w{w}"], 2)
            row[f"train_w{w}_rounds"] = [round(v, 2) for v in times[f"train_w{w}"]]
            row[f"ratio_w{w}"] = round(ratio, 3)
            row[f"pass_w{w}"] = ratio >= GOAL
        rows.append(row)
        print(f"\n{case} ({preset} on {task}): model train step {med['step']:.1f} samples/s")
        for w in workers:
            print(f"  modwire train, data.num_workers={w}: {row[f'train_w{w}_samples_per_s']:.1f} samples/s, "
                  f"train / step {row[f'ratio_w{w}']:.2f} "
                  f"{'PASS' if row[f'pass_w{w}'] else 'FAIL'} (goal >= {GOAL:.2f})", flush=True)
    gens = generator_rows(args.batch if not args.quick else 8, max(args.rounds, 2) if not args.quick else 1)
    print("\ngenerator ms/item: one at a time vs a batch at once (__getitems__)")
    for g in gens:
        print(f"  {g['task']:14} per item {g['per_item_ms']:.3f}  batched {g['batched_ms']:.3f}  "
              f"({g['speedup']:.2f}x)")
    if args.out:
        write_json(Path(args.out), {
            "benchmark": "bench_train_loop", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"), "git_commit": git_commit(), "machine": machine, "goal": GOAL,
            "args": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows, "generators": gens})
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
