"""Fused attention (issue 25, item 4): does every hot attention call reach SDPA's fused kernel, and
what does reaching it buy?

    OMP_NUM_THREADS=2 python benchmarks/bench_attention.py [--presets ...] [--batch 16] [--iters 5] [--quick]
        [--device cpu|cuda] [--out FILE.json]

Per preset, in eval (``no_grad``) and train (forward + backward) mode:

* **calls**: SDPA calls of one forward, and how many of them ran with SDPA restricted to the fused
  kernels (``SDPBackend.FLASH_ATTENTION`` on the CPU; flash + memory-efficient + cuDNN on CUDA); a call
  the fused kernels refuse is counted as math. On the CPU a learned bias that needs a gradient (NAC's
  ``log K̂``, NI's and the ViT's relative positions) has no fused kernel in training: those calls count
  as math there (see :func:`modwire.nn.attention.fused_attention`).
* **time**: ``fused_attention`` as modwire calls it (4-D, equal widths) against the former call, SDPA on
  the tensors as they come (5-D for NI, unequal widths for NI's augmented values), timed interleaved in
  one run; ``> 1×`` means the current form is faster.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import modwire
import modwire.nn.attention as attention
from modwire.analysis import time_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
from test_contract import make_inputs  # noqa: E402

PRESETS = ["nac_small", "perceiver_io_small", "ni_digits", "vit_digits", "ait_micro", "transformer_lm_micro"]
FUSED = {"cpu": [SDPBackend.FLASH_ATTENTION],
         "cuda": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]}


def former(q, k, v, bias, scale):
    """The call before issue 25: SDPA on the tensors as they come."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def count_fused(step, device: str) -> tuple[int, int]:
    """``(calls, fused)`` of one ``step()``: each SDPA call is retried with only the fused kernels."""
    real, seen = F.scaled_dot_product_attention, [0, 0]

    def spy(q, k, v, attn_mask=None, **kw):
        seen[0] += 1
        try:
            with sdpa_kernel(FUSED[device]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = real(q, k, v, attn_mask=attn_mask, **kw)
            seen[1] += 1
            return out
        except RuntimeError:
            return real(q, k, v, attn_mask=attn_mask, **kw)

    F.scaled_dot_product_attention = spy
    try:
        step()
    finally:
        F.scaled_dot_product_attention = real
    return seen[0], seen[1]


def steps(name: str, batch: int, device: str):
    torch.manual_seed(0)
    model = modwire.create_model(name).to(device)
    x, kw = make_inputs(model.config, batch=batch, seed=0, device=device)

    def evaluate():
        model.eval()
        with torch.no_grad():
            model(x, **kw)

    def train():
        model.train()
        model.zero_grad(set_to_none=True)
        out = model(x, **kw)
        (out if torch.is_tensor(out) else out[0]).float().square().mean().backward()
    return {"eval": evaluate, "train": train}


def with_kernel(fn, kernel):
    def run():
        attention.fused_attention = kernel
        fn()
    return run


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"platform": platform.platform(), "cpu": cpu, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "commit": commit,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=PRESETS)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="two micro presets, batch 2, 1 round (smoke test)")
    ap.add_argument("--out", help="also write the rows as JSON here (with the machine)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    presets, batch, iters = (["ni_micro", "nac_micro"], 2, 1) if args.quick else (args.presets, args.batch, args.iters)
    current = attention.fused_attention
    print(f"{machine()}; batch {batch}, median of {iters} interleaved rounds")
    print(f"{'preset':<22} {'mode':<5} {'SDPA calls':>10} {'fused':>6} {'current ms':>11} {'former ms':>10} "
          f"{'former/current':>15}")
    rows = []
    for name in presets:
        for mode, fn in steps(name, batch, args.device).items():
            calls, fused = count_fused(fn, args.device)
            t = time_interleaved({"current": with_kernel(fn, current), "former": with_kernel(fn, former)}, iters=iters)
            attention.fused_attention = current
            row = {"preset": name, "mode": mode, "calls": calls, "fused": fused, "current_s": t["current"],
                   "former_s": t["former"], "speedup": t["former"] / t["current"]}
            rows.append(row)
            print(f"{name:<22} {mode:<5} {calls:>10} {fused:>6} {t['current'] * 1e3:>11.2f} {t['former'] * 1e3:>10.2f} "
                  f"{row['speedup']:>14.2f}×")
    if args.out:
        from modwire.files import atomic_write_text

        atomic_write_text(args.out, json.dumps({"machine": machine(), "batch": batch, "iters": iters,
                                                "device": args.device, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
