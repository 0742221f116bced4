"""Learned attention biases on FlexAttention (issue 39, item 3): ``attention_backend="flex"`` against
``"sdpa"`` on the models whose attention has a learned bias (NAC's ``log K̂``, NI's and the ViT's
relative positions).

    taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/bench_flex.py [--presets ...] [--batch 8] [--iters 5]
        [--device cpu|cuda] [--precision fp32|bf16] [--compile] [--quick] [--out FILE.json]

Per preset and mode (``eval``: a forward under ``no_grad``; ``train``: forward and backward), one model
per backend with the same weights, timed interleaved (A, B, A, B, ...; median of ``--iters`` rounds after
the warm-up, which compiles). With ``"sdpa"`` a training step's learned bias takes SDPA's math path on
the CPU (its fused kernel has no bias gradient); an evaluation step runs SDPA's fused kernel. ``flex
calls``: the attention calls of one step that ran on FlexAttention, of all attention calls. Without
``--compile`` the "flex" model still runs FlexAttention compiled (``modwire.nn.flex`` compiles its
core; the rest of the model is eager). torch has no FlexAttention backward on the CPU: there a "flex"
training step runs SDPA, so it is not timed (``null`` in the JSON). Where the "flex" model fails to
compile (``--compile`` on the CPU, torch 2.13), the error is recorded (``flex_error``) and SDPA alone is timed.

``attention alone`` (evaluation, ``no_grad``): the attention calls of one step of each preset, recorded
and replayed, all of them per timed call: FlexAttention (compiled, as the models run it) against SDPA on
its math kernel (``SDPBackend.MATH``: the path a learned bias takes in training, without the backward)
and SDPA as it chooses (its fused kernel), the mask folded into the bias for SDPA as ``attend`` does.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import modwire
import modwire.nn.attention as attention
from modwire.analysis import time_interleaved
from modwire.files import atomic_write_text
from modwire.nn import flex
from runflags import Run, add_run_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
from test_contract import make_inputs  # noqa: E402

PRESETS = ["nac_small", "ni_digits", "vit_digits"]
BACKENDS = ("sdpa", "flex")


def machine(run: Run) -> dict:
    """Where the numbers come from: commit, torch, threads and the CPUs this process may run on."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, cwd=Path(__file__).parent).stdout.strip())
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"commit": commit, "dirty": dirty, "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(), "pinned_to": cpus,
            "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "device": torch.cuda.get_device_name() if run.device == "cuda" else "cpu",
            "precision": run.precision, "compile": run.compile}


def models(name: str, run: Run) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    out = {b: modwire.create_model(name, attention_backend=b).to(run.device) for b in BACKENDS}
    out["flex"].load_state_dict(out["sdpa"].state_dict())
    return out


def step_fn(model: torch.nn.Module, x, kw, mode: str, run: Run):
    """One timed call: ``eval`` (forward, ``no_grad``) or ``train`` (forward + backward)."""
    net = run.compiled(model)

    def evaluate():
        with torch.no_grad(), run.cast():
            net(x, **kw)

    def train():
        model.zero_grad(set_to_none=True)
        with run.cast():
            out = net(x, **kw)
            loss = (out if torch.is_tensor(out) else out[0]).float().square().mean()
        loss.backward()
    model.train(mode == "train")
    return evaluate if mode == "eval" else train


def count_calls(step) -> tuple[int, int]:
    """``(flex, all)``: attention calls of one eager ``step()`` that ran on FlexAttention / on a kernel."""
    seen = [0, 0]
    real_flex, real_sdpa = flex.flex_attend, attention.fused_attention

    def on_flex(*a, **k):
        seen[0] += 1
        seen[1] += 1
        return real_flex(*a, **k)

    def on_sdpa(*a, **k):
        seen[1] += 1
        return real_sdpa(*a, **k)
    flex.flex_attend, attention.fused_attention = on_flex, on_sdpa
    try:
        step()
    finally:
        flex.flex_attend, attention.fused_attention = real_flex, real_sdpa
    return seen[0], seen[1]


def measure(name: str, mode: str, batch: int, iters: int, run: Run) -> dict:
    nets = models(name, run)
    x, kw = make_inputs(nets["sdpa"].config, batch=batch, seed=0, device=run.device)
    eager = Run(run.device, run.precision, compile=False)
    flex_calls, calls = count_calls(step_fn(nets["flex"], x, kw, mode, eager))
    timed, error = {"sdpa": step_fn(nets["sdpa"], x, kw, mode, run)}, None
    if flex_calls:                        # else "flex" runs SDPA here (no CPU backward): nothing to compare
        timed["flex"] = step_fn(nets["flex"], x, kw, mode, run)
        try:
            timed["flex"]()               # compiles; a failure is recorded, not fatal
        except Exception as e:            # noqa: BLE001 (torch.compile's errors have no common base)
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            del timed["flex"]
    t = time_interleaved(timed, iters=iters, warmup=run.warmup)
    sdpa, fl = t["sdpa"], t.get("flex")
    return {"preset": name, "mode": mode, "batch": batch, "calls": calls, "flex_calls": flex_calls,
            "sdpa_ms": round(sdpa * 1e3, 3), "flex_ms": None if fl is None else round(fl * 1e3, 3),
            "sdpa_over_flex": None if fl is None else round(sdpa / fl, 3), "flex_error": error}


def record_calls(step) -> list[tuple]:
    """The arguments of every FlexAttention call of one eager ``step()`` (detached)."""
    calls, real = [], flex.flex_attend

    def spy(*a):
        calls.append(tuple(t.detach() if torch.is_tensor(t) else t for t in a))
        return real(*a)
    flex.flex_attend = spy
    try:
        step()
    finally:
        flex.flex_attend = real
    return calls


def sdpa_call(q, k, v, bias, mask, scale):
    """``attend``'s SDPA form of a call: the mask folded into the bias as a finite fill."""
    if mask is not None:
        fill = torch.zeros((), dtype=q.dtype, device=q.device) if bias is None else bias
        bias = fill.masked_fill(~mask, attention.mask_value(q.dtype))
    return attention.fused_attention(q, k, v, bias, scale)


def measure_attention(name: str, batch: int, iters: int, run: Run) -> dict:
    nets = models(name, run)
    x, kw = make_inputs(nets["flex"].config, batch=batch, seed=0, device=run.device)
    calls = record_calls(step_fn(nets["flex"], x, kw, "eval", Run(run.device, run.precision)))

    def replay(fn, math=False):
        def go():
            with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]) if math else contextlib.nullcontext():
                for c in calls:
                    fn(*c)
        return go
    t = time_interleaved({"flex": replay(flex.flex_attend), "math": replay(sdpa_call, math=True),
                          "sdpa": replay(sdpa_call)}, iters=iters, warmup=2)
    return {"preset": name, "calls": len(calls), **{f"{k}_ms": round(v * 1e3, 3) for k, v in t.items()},
            "math_over_flex": round(t["math"] / t["flex"], 3), "sdpa_over_flex": round(t["sdpa"] / t["flex"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=PRESETS)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iters", type=int, default=5, help="interleaved rounds (the median is reported)")
    ap.add_argument("--quick", action="store_true", help="the micro presets, batch 2, 1 round (smoke test)")
    ap.add_argument("--out", help="also write the rows and the machine as JSON here (atomically)")
    add_run_flags(ap)
    args = ap.parse_args()
    run = Run.from_args(ap, args)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
    presets, batch, iters = (["nac_micro", "ni_micro", "vit_micro"], 2, 1) if args.quick else \
        (args.presets, args.batch, args.iters)
    info = machine(run)
    print(f"{info}\n{run.describe()}; batch {batch}, median of {iters} interleaved rounds")
    print(f"{'preset':<14} {'mode':<5} {'flex calls':>10} {'sdpa ms':>9} {'flex ms':>9} {'sdpa/flex':>10}")
    rows = []
    for name in presets:
        for mode in ("eval", "train"):
            r = measure(name, mode, batch, iters, run)
            rows.append(r)
            flex_ms = ("failed" if r["flex_error"] else "n/a") if r["flex_ms"] is None else f"{r['flex_ms']:.2f}"
            ratio = "n/a" if r["sdpa_over_flex"] is None else f"{r['sdpa_over_flex']:.2f}x"
            print(f"{name:<14} {mode:<5} {r['flex_calls']:>4} of {r['calls']:<3} {r['sdpa_ms']:>9.2f} {flex_ms:>9} "
                  f"{ratio:>10}", flush=True)
            if r["flex_error"]:
                print(f"  flex: {r['flex_error']}", flush=True)
    alone = []
    for name in [] if run.compile else presets:          # the replay runs the same kernels either way
        if not alone:
            print(f"\nattention alone (eval): the calls of one step, replayed\n{'preset':<14} {'calls':>5} "
                  f"{'flex ms':>9} {'math ms':>9} {'sdpa ms':>9} {'math/flex':>10} {'sdpa/flex':>10}")
        r = measure_attention(name, batch, iters, run)
        alone.append(r)
        print(f"{name:<14} {r['calls']:>5} {r['flex_ms']:>9.2f} {r['math_ms']:>9.2f} {r['sdpa_ms']:>9.2f} "
              f"{r['math_over_flex']:>9.2f}x {r['sdpa_over_flex']:>9.2f}x", flush=True)
    if args.out:
        atomic_write_text(args.out, json.dumps({"machine": info, "batch": batch, "iters": iters, "rows": rows,
                                                "attention_alone": alone}, indent=1) + "\n")


if __name__ == "__main__":
    main()
