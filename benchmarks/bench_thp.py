"""Transparent huge pages for PyTorch's CPU tensors (``THP_MEM_ALLOC_ENABLE=1``) on the NFM pairs (issue 39).

    OMP_NUM_THREADS=1 python benchmarks/bench_thp.py [--pairs w16 w64 soc authors] [--rounds 4] [--repeats 3]
        [--out RESULT.json] [--markdown RESULT.md]

An NFM train step takes thousands of minor page faults (first touches of memory fresh from the kernel) where
its base takes few (``bench_nfm.py``'s fault column). PyTorch's CPU allocator asks the
kernel for transparent huge pages (2 MiB) on allocations of at least 2 MiB when the environment variable
``THP_MEM_ALLOC_ENABLE=1`` is set before its first allocation, which only a fresh process can do; and the
kernel grants them where ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``.

So each measurement is a child process (this script with ``--child``): one pair's NFM and base train steps
(forward, mean square of the output, backward; ``bench_nfm.train_step``), timed interleaved in it (medians
of ``--repeats``), with its minor page faults per step. The parent runs ``--rounds`` rounds; each round
runs the pair once without and once with the variable, alternating which goes first, and reports the
medians over rounds: each model's speed with THP (time without over time with) and NFM / base on each
side. Pairs: ``w16`` / ``w64``: PreActResNet-18 (CIFAR-10, a reader per stage) at 16 / 64 initial channels,
batch 16; ``soc``: the Sort-of-CLEVR CNN_MLP presets, batch 16; ``authors``: modwire running the authors'
Sort-of-CLEVR network (``AUTHORS_NFM_CNN``) and its base at their widths, batch 64 (``bench_nfm_authors.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

import modwire
from modwire.analysis import time_interleaved
from modwire.models.relational_cnn import AUTHORS_NFM_CNN

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_nfm import counting_faults, example_inputs, machine, train_step, write_json, write_text  # noqa: E402

VARIABLE = "THP_MEM_ALLOC_ENABLE"
_WIDTHS = {"w16": 16, "w64": 64}
PAIRS = {"w16": "PreActResNet-18 w16, stages (batch 16)", "w64": "PreActResNet-18 w64, stages (batch 16)",
         "soc": "Sort-of-CLEVR CNN_MLP (batch 16)", "authors": "the authors' Sort-of-CLEVR network (batch 64)"}


def build(pair: str) -> tuple[torch.nn.Module, torch.nn.Module, int]:
    """``(nfm, base, batch)`` of ``pair`` (module docstring)."""
    if pair in _WIDTHS:
        o = {"initial_channels": _WIDTHS[pair], "nfm_modules": "stage"}
        return (modwire.create_model("nfm_preact_resnet18_cifar10", **o),
                modwire.create_model("preact_resnet18_cifar10", **o), 16)
    if pair == "soc":
        return modwire.create_model("nfm_cnn_mlp_sort_of_clevr"), modwire.create_model("cnn_mlp_sort_of_clevr"), 16
    base_fields = {k: v for k, v in AUTHORS_NFM_CNN.items() if k != "nfm"}
    return (modwire.create_model("nfm_cnn_mlp_sort_of_clevr", **AUTHORS_NFM_CNN),
            modwire.create_model("cnn_mlp_sort_of_clevr", **base_fields), 64)


def child(pair: str, repeats: int) -> dict:
    """One pair's NFM and base train-step times (s) and page faults per step, in this process."""
    torch.manual_seed(0)
    nfm, base, batch = build(pair)
    inputs = example_inputs(base, batch)
    faults: dict[str, list[int]] = {"nfm": [], "base": []}
    fns = {name: counting_faults(train_step(m, inputs), faults[name]) for name, m in (("nfm", nfm), ("base", base))}
    t = time_interleaved(fns, iters=repeats, warmup=1)
    return {**{k: t[k] for k in fns}, **{f"faults {k}": statistics.median(v[1:] or v) for k, v in faults.items()},
            "thp": os.environ.get(VARIABLE) == "1"}


def run_child(pair: str, repeats: int, thp: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if thp:
        env[VARIABLE] = "1"
    done = subprocess.run([sys.executable, __file__, "--child", pair, "--repeats", str(repeats)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:                   # the child's own error, not a CalledProcessError
        raise SystemExit(f"bench_thp: the {pair} child ({VARIABLE}={'1' if thp else 'unset'}) failed with exit "
                         f"status {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(pair: str, rounds: int, repeats: int) -> dict:
    sides: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(rounds):
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            sides[side].append(run_child(pair, repeats, side == "on"))
    med = {side: {k: statistics.median([x[k] for x in runs]) for k in runs[0] if k != "thp"}
           for side, runs in sides.items()}
    row = {"pair": pair, "label": PAIRS[pair], "off": med["off"], "on": med["on"],
           "nfm speed": med["off"]["nfm"] / med["on"]["nfm"], "base speed": med["off"]["base"] / med["on"]["base"],
           "nfm/base off": med["off"]["nfm"] / med["off"]["base"], "nfm/base on": med["on"]["nfm"] / med["on"]["base"],
           "rounds": {side: runs for side, runs in sides.items()}}
    print(f"{row['label']:<48} NFM {row['nfm speed']:.2f}x  base {row['base speed']:.2f}x  NFM/base "
          f"{row['nfm/base off']:.2f} -> {row['nfm/base on']:.2f}  faults/step NFM {med['off']['faults nfm']:.0f} -> "
          f"{med['on']['faults nfm']:.0f}", flush=True)
    return row


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"Transparent huge pages (`benchmarks/bench_thp.py {' '.join(result['argv'])}`; {m['cpu']}, "
             f"{m['threads']} thread(s), torch {m['torch']}, {m['date']}, commit {m['git_commit']}"
             f"{' + working tree' if m['git_dirty'] else ''}; kernel THP setting `{result['thp_setting']}`; "
             f"medians over {result['rounds']} rounds of child processes without / with `{VARIABLE}=1`, "
             f"each the median of {result['repeats']} interleaved train steps).", "",
             "| pair | NFM speed with THP | base speed with THP | NFM / base without | with | "
             "NFM page faults / step without → with |", "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['label']} | {r['nfm speed']:.2f}× | {r['base speed']:.2f}× | {r['nfm/base off']:.2f} | "
                     f"{r['nfm/base on']:.2f} | {r['off']['faults nfm']:.0f} → {r['on']['faults nfm']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--rounds", type=int, default=4, help="child processes per side and pair (default 4)")
    ap.add_argument("--repeats", type=int, default=3, help="timed train steps per model in each child (default 3)")
    ap.add_argument("--child", choices=list(PAIRS), help=argparse.SUPPRESS)
    ap.add_argument("--out", metavar="RESULT.json")
    ap.add_argument("--markdown", metavar="RESULT.md")
    args = ap.parse_args()
    for name in ("rounds", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: expected an integer >= 1, got {getattr(args, name)}")
    if args.child:
        print(json.dumps(child(args.child, args.repeats)))
        return
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    setting = thp.read_text().strip() if thp.exists() else "unknown (no /sys/kernel/mm/transparent_hugepage)"
    print(f"kernel THP: {setting}; {args.rounds} rounds per side, {args.repeats} steps per child", flush=True)
    rows = [measure(p, args.rounds, args.repeats) for p in args.pairs]
    result = {"benchmark": "bench_thp.py", "argv": sys.argv[1:], "machine": machine(torch.device("cpu")),
              "thp_setting": setting, "rounds": args.rounds, "repeats": args.repeats, "rows": rows}
    if args.out:
        write_json(args.out, result)
    if args.markdown:
        write_text(args.markdown, markdown(result))


if __name__ == "__main__":
    main()
