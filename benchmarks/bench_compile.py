"""Compiled / eager and bf16 / fp32, per model family (issues 25, 39): a train step (forward, backward of
the mean square of the output, SGD step) and an eval forward, each set timed interleaved in one run.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_compile.py [--presets nac_micro ...] [--batch 16]
        [--iters 15] [--min-round-ms 20] [--device cpu|cuda] [--quick] [--out FILE.json]
    python benchmarks/bench_compile.py --markdown FILE.json      # the docs/speed.md table of a result file

Columns: ``compiled/eager`` is eager time over compiled time (> 1: compiling pays), ``bf16/fp32`` is
fp32 time over bf16-autocast time (> 1: bf16 pays), both for the train step and the eval forward.
Compiled: ``torch.compile(model, **model.compile_kwargs(fullgraph=True))`` (inductor, with the model's own
inductor options: an NFM's layout optimization off), compiled in the warm-up. Inputs: the
registry contract's (``tests/models/test_contract.py``'s ``make_inputs``). A family whose compile
fails is printed with the error instead of its ratios.

Timing: each round calls eager, compiled and bf16 in turn (``modwire.analysis.time_interleaved``, median
of ``--iters`` rounds); in a round each side runs ``calls`` times back to back, ``calls`` chosen once
per family and mode so that the eager side's run lasts at least ``--min-round-ms`` (a micro preset's
call is a millisecond: one call per sample would time the machine's noise). Same calls, same inputs on
every side; times are per call.

Goal (issue 39), printed PASS / FAIL per family and mode and written to the JSON: compiled / eager
>= 1.2 in both modes. ``--out``: the rows, the goal, the arguments and the machine (CPU model, torch,
threads, the CPUs the process may run on, the 1-minute load average at the start and the end, date,
git commit and whether the tree was dirty), written atomically (a temporary file, then ``os.replace``).
``--markdown FILE.json`` prints the table (and the line naming the run) that docs/speed.md holds, from
that file alone.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["nac_micro", "perceiver_io_micro", "ni_micro", "vit_micro", "ait_micro", "nfm_preact_resnet_micro",
            "nfm_cnn_mlp_micro", "transformer_lm_micro", "nfm_transformer_lm_micro", "nfm_gan_resnet_micro"]
GOAL = 1.2              # issue 39: compiled / eager, every family, train and eval


def inputs(model: torch.nn.Module, batch: int, device: str) -> tuple[Any, dict]:
    """``(x, kwargs)`` for ``model(x, **kwargs)`` (the registry contract's inputs)."""
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from test_contract import make_inputs

    x, kw = make_inputs(model.config, batch=batch, device=device)
    return x, kw


def steps(model: torch.nn.Module, x: Any, kw: dict, precision: str, device: str) -> tuple[Callable, Callable]:
    """A train step and an eval forward of ``model`` (a module or its compiled form)."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    cast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")

    def train() -> None:
        model.train()
        with cast:
            out = model(x, **kw)
        opt.zero_grad(set_to_none=True)
        out.float().square().mean().backward()
        opt.step()

    @torch.no_grad()
    def evaluate() -> None:
        model.eval()
        with cast:
            model(x, **kw)

    return train, evaluate


def calls_per_round(fn: Callable[[], None], min_round_ms: float) -> int:
    """How many back-to-back calls of ``fn`` (warm) last ``min_round_ms``: the fastest of 3 calls."""
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return max(1, math.ceil(min_round_ms / 1e3 / best))


def family(name: str, batch: int, iters: int, device: str, min_round_ms: float) -> dict[str, Any]:
    import modwire
    from modwire.analysis import time_interleaved

    torch.manual_seed(0)
    model = modwire.create_model(name).to(device)
    x, kw = inputs(model, batch, device)
    row: dict[str, Any] = {"preset": name, "params": model.num_parameters()}
    compiled = torch.compile(model, **model.compile_kwargs(fullgraph=True))   # with the model's inductor options
    try:
        fns = {"eager": steps(model, x, kw, "fp32", device), "compiled": steps(compiled, x, kw, "fp32", device),
               "bf16": steps(model, x, kw, "bf16", device)}
        for i, mode in enumerate(("train", "eval")):
            one = {k: v[i] for k, v in fns.items()}
            for fn in one.values():                 # compile (both modes get their graph), warm up
                fn(), fn()
            calls = calls_per_round(one["eager"], min_round_ms)
            t = time_interleaved({k: (lambda f=f: [f() for _ in range(calls)]) for k, f in one.items()},
                                 iters=iters, warmup=1)
            ratio = t["eager"] / t["compiled"]
            row[f"{mode}_ms"] = round(1e3 * t["eager"] / calls, 3)
            row[f"{mode}_compiled_ms"] = round(1e3 * t["compiled"] / calls, 3)
            row[f"{mode}_compiled_over_eager"] = round(ratio, 3)
            row[f"{mode}_bf16_over_fp32"] = round(t["eager"] / t["bf16"], 3)
            row[f"{mode}_calls_per_round"] = calls
            row[f"{mode}_goal_met"] = ratio >= GOAL
    except Exception as e:                          # a family that does not compile: say so, go on
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return row


def machine(device: str) -> dict[str, Any]:
    """Where the run ran: CPU model, threads, the CPUs this process may use, torch, git commit."""
    cpuinfo = Path("/proc/cpuinfo")
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")), None) if cpuinfo.exists() else None

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"platform": platform.platform(), "cpu": cpu or platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch": torch.__version__, "python": platform.python_version(), "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "git_commit": git("rev-parse", "HEAD"), "git_dirty": None if status is None else bool(status)}


def write_json(path: Path, data: dict) -> None:
    """``data`` to ``path`` atomically (a temporary file beside it, then ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def goal_line(rows: list[dict]) -> tuple[str, bool]:
    """``PASS`` / ``FAIL`` of the goal over every family and mode, with the rows that miss it."""
    missed = [f"{r['preset']} {mode} {r[f'{mode}_compiled_over_eager']:.2f}x" for r in rows if "error" not in r
              for mode in ("train", "eval") if not r[f"{mode}_goal_met"]]
    failed = [r["preset"] for r in rows if "error" in r]
    ok = not missed and not failed
    text = f"goal compiled / eager >= {GOAL} for every family, train and eval: {'PASS' if ok else 'FAIL'}"
    if missed or failed:
        text += " (" + "; ".join(missed + [f"{p} failed to compile" for p in failed]) + ")"
    return text, ok


def markdown(data: dict, source: str = "benchmarks/results/compile_cpu.json") -> str:
    """docs/speed.md's table of the result file ``source`` holding ``data`` (and the line that names the
    run), from the file alone."""
    mach, args = data["machine"], data["args"]
    pinned = f"pinned to CPU {','.join(map(str, mach['affinity']))}" if mach.get("affinity") and \
        len(mach["affinity"]) < mach["cpus"] else "not pinned"
    load = mach.get("load_average_1min")
    load = f"; 1-minute load average {load['start']:.1f} at the start, {load['end']:.1f} at the end" if load else ""
    commit = (mach["git_commit"] or "unknown")[:7] + (" + uncommitted changes" if mach.get("git_dirty") else "")
    threads = f"{mach['threads']} thread" + ("s" if mach["threads"] != 1 else "")
    lines = [f"`{source}`: {mach['cpu']}, {threads}, {pinned}, torch "
             f"{mach['torch']}, {mach['date'][:10]}, commit {commit}; batch {args['batch']}, median of {args['iters']} "
             f"interleaved rounds of at least {args['min_round_ms']:g} ms per side{load}.",
             "",
             f"| preset | params | train step eager ms | compiled / eager (train) | bf16 / fp32 (train) | "
             f"eval eager ms | compiled / eager (eval) | bf16 / fp32 (eval) | compiled ≥ {GOAL}× |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| `{r['preset']}` | {r['params']:,} | {r['error']} | | | | | | FAIL |")
            continue
        met = "PASS" if r["train_goal_met"] and r["eval_goal_met"] else \
            "FAIL (" + ", ".join(m for m in ("train", "eval") if not r[f"{m}_goal_met"]) + ")"
        cells = [f"`{r['preset']}`", f"{r['params']:,}"]
        for mode in ("train", "eval"):
            cells += [f"{r[f'{mode}_ms']:.2f}", f"{r[f'{mode}_compiled_over_eager']:.2f}×",
                      f"{r[f'{mode}_bf16_over_fp32']:.2f}×"]
        lines.append("| " + " | ".join(cells + [met]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=FAMILIES)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=15, help="interleaved rounds (median; default 15)")
    ap.add_argument("--min-round-ms", type=float, default=20.0,
                    help="each side's run per round lasts at least this long on the eager side (default 20)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="two families, 2 rounds of one call (smoke test)")
    ap.add_argument("--out", help="also write the rows as JSON here (with the machine), atomically")
    ap.add_argument("--markdown", metavar="FILE.json",
                    help="print docs/speed.md's table of this result file; run nothing")
    args = ap.parse_args()
    if args.markdown:
        path = Path(args.markdown).resolve()
        source = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        print(markdown(json.loads(path.read_text()), source))
        return
    if args.quick:
        args.presets, args.iters, args.min_round_ms = args.presets[:2], 2, 0.0
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device}, batch {args.batch}, "
          f"median of {args.iters} interleaved rounds of >= {args.min_round_ms:g} ms per side")
    print(f"{'preset':28} {'params':>9} {'train ms':>9} {'train c/e':>9} {'train bf16':>10} "
          f"{'eval ms':>8} {'eval c/e':>8} {'eval bf16':>9}  goal >= {GOAL}")
    rows, load, where = [], os.getloadavg(), machine(args.device)      # the tree and date the run started from
    for name in args.presets:
        row = family(name, args.batch, args.iters, args.device, args.min_round_ms)
        rows.append(row)
        if "error" in row:
            print(f"{name:28} {row['params']:>9,} {row['error']}")
            continue
        verdict = " ".join(f"{m} {'PASS' if row[f'{m}_goal_met'] else 'FAIL'}" for m in ("train", "eval"))
        print(f"{name:28} {row['params']:>9,} {row['train_ms']:>9.2f} {row['train_compiled_over_eager']:>9.2f} "
              f"{row['train_bf16_over_fp32']:>10.2f} {row['eval_ms']:>8.2f} {row['eval_compiled_over_eager']:>8.2f} "
              f"{row['eval_bf16_over_fp32']:>9.2f}  {verdict}", flush=True)
    text, ok = goal_line(rows)
    print(text)
    if args.out:
        write_json(Path(args.out), {
            "benchmark": "bench_compile", "machine": {**where, "load_average_1min": {
                "start": load[0], "end": os.getloadavg()[0]}}, "goal": {
                "compiled_over_eager_at_least": GOAL, "met": ok, "summary": text},
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "markdown")},
            "batch": args.batch, "iters": args.iters, "rows": rows})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
