"""Where an NFM train step spends its time (issue 39: "profile, not guess"): ``torch.profiler`` over one
train step (forward, backward of the mean square of the output) of an NFM model and of its base
network, the top operators by self CPU time, and the readers' share (the NFM step's time beyond twice
the base's, the two passes' blocks).

    OMP_NUM_THREADS=1 python benchmarks/profile_nfm.py [--pair w16|w64|soc|micro ...] [--batch 16] [--top 12]
        [--out RESULT.json] [--markdown RESULT.md]

Pairs: ``w16`` / ``w64``: PreActResNet-18 (CIFAR-10 layout, NFM before every stage) at 16 / 64 initial
channels, 32×32 images; ``soc``: the Sort-of-CLEVR CNN_MLP pair (75×75 images and questions);
``micro``: the test-sized PreActResNet pair (a smoke test). Each step
is run twice before the profiled one. ``--out``: the tables and the machine as JSON; ``--markdown``: the
same as Markdown tables; both written atomically.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import modwire

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_nfm import machine, write_json  # noqa: E402

PAIRS = {"w16": ("nfm_preact_resnet18_cifar10", "preact_resnet18_cifar10", {"initial_channels": 16, "nfm_modules": "stage"}),
         "w64": ("nfm_preact_resnet18_cifar10", "preact_resnet18_cifar10", {"initial_channels": 64, "nfm_modules": "stage"}),
         "soc": ("nfm_cnn_mlp_sort_of_clevr", "cnn_mlp_sort_of_clevr", {}),
         "micro": ("nfm_preact_resnet_micro", "preact_resnet_micro", {})}


def step_of(model: torch.nn.Module, batch: int):
    c = model.config
    if c.model_type == "preact_resnet":                           # images [B, C, S, S]
        args, kwargs = (torch.rand(batch, c.in_channels, c.image_size, c.image_size,
                                   generator=torch.Generator().manual_seed(0)),), {}
    else:
        args, kwargs = model.example_inputs(batch)

    def step() -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        model(*args, **kwargs).float().square().mean().backward()
    return step


def profiled(step, top: int) -> tuple[float, list[dict]]:
    """``(total self CPU ms, the top operators)`` of one call of ``step`` (after two warm-up calls)."""
    step(), step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) / 1e3
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return total, [{"op": e.key, "self_ms": round(e.self_cpu_time_total / 1e3, 2), "calls": e.count,
                    "share": round(e.self_cpu_time_total / 1e3 / total, 4)} for e in events[:top]]


def run(pair: str, batch: int, top: int) -> dict:
    nfm_name, base_name, overrides = PAIRS[pair]
    torch.manual_seed(0)
    nfm, base = modwire.create_model(nfm_name, **overrides), modwire.create_model(base_name, **overrides)
    base_ms, _ = profiled(step_of(base, batch), top)
    nfm_ms, ops = profiled(step_of(nfm, batch), top)
    return {"pair": pair, "nfm": nfm_name, "base": base_name, "overrides": overrides, "batch": batch,
            "base_ms": round(base_ms, 1), "nfm_ms": round(nfm_ms, 1),
            "readers_share": round(max(nfm_ms - 2 * base_ms, 0.0) / nfm_ms, 3), "top": ops}


def markdown(rows: list[dict], info: dict) -> str:
    lines = [f"Profile of one NFM train step (`benchmarks/profile_nfm.py`; {info['cpu']}, {info['threads']} "
             f"thread(s), torch {info['torch']}, {info['date']}, commit {info['git_commit']}"
             f"{' + working tree' if info['git_dirty'] else ''}). Times are the profiler's self CPU times "
             f"(the profiler adds its own overhead: compare shares, not absolute ms).", ""]
    for r in rows:
        lines += [f"### {r['pair']}: `{r['nfm']}` {r['overrides'] or ''} (batch {r['batch']})", "",
                  f"Base step {r['base_ms']} ms, NFM step {r['nfm_ms']} ms under the profiler; the readers "
                  f"(the NFM step beyond twice the base's) {100 * r['readers_share']:.0f} % of it.", "",
                  "| op | self ms | share | calls |", "|---|---:|---:|---:|"]
        lines += [f"| `{o['op']}` | {o['self_ms']} | {100 * o['share']:.1f} % | {o['calls']} |" for o in r["top"]]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", nargs="+", default=["w16", "w64", "soc"], choices=sorted(PAIRS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", metavar="PATH", help="the tables and the machine as JSON (atomically)")
    ap.add_argument("--markdown", metavar="PATH", help="the tables as Markdown (atomically)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rows = [run(p, args.batch, args.top) for p in args.pair]
    info = machine(torch.device("cpu"))
    for r in rows:
        print(f"{r['pair']}: base {r['base_ms']} ms, nfm {r['nfm_ms']} ms, readers {100 * r['readers_share']:.0f} %")
        for o in r["top"]:
            print(f"  {o['op']:<40} {o['self_ms']:>9.2f} ms {100 * o['share']:>5.1f} % {o['calls']:>5}")
    if args.out:
        write_json(args.out, {"benchmark": "profile_nfm.py", "argv": sys.argv[1:], "machine": info, "rows": rows})
    if args.markdown:
        target = Path(args.markdown)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(markdown(rows, info) + "\n")
        os.replace(tmp, target)


if __name__ == "__main__":
    main()
