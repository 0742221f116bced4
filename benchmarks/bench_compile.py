"""Compiled / eager and bf16 / fp32, per model family (issue 25): a train step (forward, backward of the
mean square of the output, SGD step) and an eval forward, each pair timed interleaved in one run.

    OMP_NUM_THREADS=2 python benchmarks/bench_compile.py [--presets nac_micro ...] [--batch 16] [--iters 5]
                                                     [--device cpu|cuda] [--quick] [--out FILE.json]

Columns: ``compiled/eager`` is eager time over compiled time (> 1: compiling pays), ``bf16/fp32`` is
fp32 time over bf16-autocast time (> 1: bf16 pays), both for the train step and the eval forward.
Compiled: ``torch.compile(model, fullgraph=True)`` (inductor), compiled before timing. Inputs: the
registry contract's (``tests/models/test_contract.py``'s ``make_inputs``, re-stated here). A family
whose compile fails is printed with the error instead of its ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Callable

import torch

import modwire
from modwire.analysis import time_interleaved

FAMILIES = ["nac_micro", "perceiver_io_micro", "ni_micro", "vit_micro", "ait_micro", "nfm_preact_resnet_micro",
            "nfm_cnn_mlp_micro", "transformer_lm_micro", "nfm_transformer_lm_micro", "nfm_gan_resnet_micro"]


def inputs(model: torch.nn.Module, batch: int, device: str) -> tuple[Any, dict]:
    """``(x, kwargs)`` for ``model(x, **kwargs)`` (the registry contract's inputs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
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


def family(name: str, batch: int, iters: int, device: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = modwire.create_model(name).to(device)
    x, kw = inputs(model, batch, device)
    row: dict[str, Any] = {"preset": name, "params": model.num_parameters()}
    compiled = torch.compile(model, fullgraph=True)
    try:
        fns = {"eager": steps(model, x, kw, "fp32", device), "compiled": steps(compiled, x, kw, "fp32", device),
               "bf16": steps(model, x, kw, "bf16", device)}
        for i, mode in enumerate(("train", "eval")):
            t = time_interleaved({k: v[i] for k, v in fns.items()}, iters=iters, warmup=2)
            row[f"{mode}_ms"] = round(1e3 * t["eager"], 3)
            row[f"{mode}_compiled_over_eager"] = round(t["eager"] / t["compiled"], 3)
            row[f"{mode}_bf16_over_fp32"] = round(t["eager"] / t["bf16"], 3)
    except Exception as e:                          # a family that does not compile: say so, go on
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=FAMILIES)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="two families, 2 timed rounds (smoke test)")
    ap.add_argument("--out", help="also write the rows as JSON here (with the machine)")
    args = ap.parse_args()
    presets, iters = (args.presets[:2], 2) if args.quick else (args.presets, args.iters)
    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
               "torch": torch.__version__, "device": args.device,
               "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device}, batch {args.batch}, "
          f"median of {iters} interleaved rounds")
    print(f"{'preset':28} {'params':>9} {'train ms':>9} {'train c/e':>9} {'train bf16':>10} "
          f"{'eval ms':>8} {'eval c/e':>8} {'eval bf16':>9}")
    rows = []
    for name in presets:
        row = family(name, args.batch, iters, args.device)
        rows.append(row)
        if "error" in row:
            print(f"{name:28} {row['params']:>9,} {row['error']}")
            continue
        print(f"{name:28} {row['params']:>9,} {row['train_ms']:>9.2f} {row['train_compiled_over_eager']:>9.2f} "
              f"{row['train_bf16_over_fp32']:>10.2f} {row['eval_ms']:>8.2f} {row['eval_compiled_over_eager']:>8.2f} "
              f"{row['eval_bf16_over_fp32']:>9.2f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine, "batch": args.batch, "iters": iters, "rows": rows},
                                             indent=1))


if __name__ == "__main__":
    main()
