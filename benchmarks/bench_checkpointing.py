"""What gradient checkpointing costs and saves (``model.set_grad_checkpointing()``, ``grad_checkpointing: true``
in ``modwire train``): per preset, a train step with and without it, and what the forward leaves in memory for
the backward.

    OMP_NUM_THREADS=1 python benchmarks/bench_checkpointing.py [--presets vit_digits ni_digits nac_small
        perceiver_io_small] [--batch 8] [--repeats 5] [--device cpu|cuda] [--quick] [--out R.json] [--markdown R.md]

Each preset is built once and copied; the copy checkpoints its blocks (same weights). A train step is
``bench_nfm.train_step``'s (train mode; forward on the config's example inputs of ``--batch``, backward of the
mean square of the output); the two models alternate (``modwire.analysis.time_interleaved``, medians of
``--repeats``). Memory: the bytes the forward leaves allocated (``torch.profiler`` with ``profile_memory``: the
net allocation of the forward, on the model's device), which is what the autograd graph keeps for the backward
plus the output; on CUDA also the peak allocated over a whole step (``torch.cuda.max_memory_allocated``).
Columns: checkpointed / plain step time (> 1: slower) and kept bytes (< 1: less memory).
``--quick``: the micro presets, 1 repeat (a smoke test). ``--out`` / ``--markdown``: written atomically.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import modwire
from modwire.analysis import time_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_nfm import machine, train_step, write_json, write_text  # noqa: E402

PRESETS = ["vit_digits", "ni_digits", "nac_small", "perceiver_io_small"]
QUICK = ["vit_micro", "ni_micro", "nac_micro", "perceiver_io_micro"]


def kept_bytes(model: torch.nn.Module, inputs: dict, device: torch.device) -> int:
    """The bytes a training forward leaves allocated on ``device`` (what the backward reads, and the output)."""
    model.train()
    model.zero_grad(set_to_none=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as prof:
        with record_function("forward"):
            loss = model(**inputs).float().square().mean()
    loss.backward()
    event = next(e for e in prof.events() if e.name == "forward")
    return int(event.device_memory_usage if device.type == "cuda" else event.cpu_memory_usage)


def peak_bytes(step, device: torch.device) -> int | None:
    """The peak CUDA memory allocated during one call of ``step`` (None on the CPU: no such counter)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def measure(name: str, batch: int, repeats: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    plain = modwire.create_model(name).to(device)
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing()
    inputs = {k: v.to(device) for k, v in plain.config.example_inputs(batch).items()}
    steps = {"plain": train_step(plain, ((), inputs)), "checkpointed": train_step(checkpointed, ((), inputs))}
    t = time_interleaved(steps, iters=repeats, warmup=1)
    kept = {side: kept_bytes(m, inputs, device) for side, m in (("plain", plain), ("checkpointed", checkpointed))}
    peak = {side: peak_bytes(steps[side], device) for side in steps}
    row = {"preset": name, "batch": batch, "plain_s": t["plain"], "checkpointed_s": t["checkpointed"],
           "time_ratio": t["checkpointed"] / t["plain"], "kept_plain": kept["plain"],
           "kept_checkpointed": kept["checkpointed"], "kept_ratio": kept["checkpointed"] / max(kept["plain"], 1),
           "peak_plain": peak["plain"], "peak_checkpointed": peak["checkpointed"]}
    peak_note = "" if peak["plain"] is None else \
        f", peak {peak['plain'] / 2**20:.1f} → {peak['checkpointed'] / 2**20:.1f} MiB"
    print(f"{name:<22} {batch:>5} {t['plain'] * 1e3:>9.1f} {t['checkpointed'] * 1e3:>9.1f} {row['time_ratio']:>7.2f}"
          f" {kept['plain'] / 2**20:>11.2f} {kept['checkpointed'] / 2**20:>11.2f} {row['kept_ratio']:>7.3f}{peak_note}")
    return row


def markdown(result: dict) -> str:
    m = result["machine"]
    cuda = any(r["peak_plain"] is not None for r in result["rows"])
    lines = [f"Gradient checkpointing (`benchmarks/bench_checkpointing.py {' '.join(result['argv'])}`; {m['cpu']}, "
             f"{m['threads']} thread(s), {m['device']}{' (' + m['gpu'] + ')' if m['gpu'] else ''}, torch {m['torch']}, "
             f"{m['date']}, commit {m['git_commit']}{' + working tree' if m['git_dirty'] else ''}; train steps, "
             f"medians of {result['repeats']} interleaved rounds).", "",
             "| preset | batch | step ms plain | checkpointed | time checkpointed / plain | MiB kept for the backward, "
             "plain | checkpointed | kept checkpointed / plain |" + (" peak MiB plain | checkpointed |" if cuda else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if cuda else "")]
    for r in result["rows"]:
        row = (f"| {r['preset']} | {r['batch']} | {r['plain_s'] * 1e3:.1f} | {r['checkpointed_s'] * 1e3:.1f} | "
               f"{r['time_ratio']:.2f} | {r['kept_plain'] / 2**20:.2f} | {r['kept_checkpointed'] / 2**20:.2f} | "
               f"{r['kept_ratio']:.3f} |")
        if cuda:
            row += f" {r['peak_plain'] / 2**20:.1f} | {r['peak_checkpointed'] / 2**20:.1f} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=None, help=f"default: {' '.join(PRESETS)}")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--quick", action="store_true", help="the micro presets, 1 repeat (smoke test)")
    ap.add_argument("--out", metavar="PATH", help="the rows and the machine as JSON (atomically)")
    ap.add_argument("--markdown", metavar="PATH", help="the table as Markdown (atomically)")
    args = ap.parse_args()
    for flag in ("batch", "repeats"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    presets = args.presets or (QUICK if args.quick else PRESETS)
    unknown = [p for p in presets if p not in modwire.list_models()]
    if unknown:
        ap.error(f"--presets: unknown {unknown}; the presets: modwire.list_models()")
    repeats = 1 if args.quick else args.repeats
    print(f"threads {torch.get_num_threads()}, device {device}; train step ms, plain and checkpointed "
          f"(median of {repeats} interleaved rounds); MiB the forward leaves for the backward")
    print(f"{'preset':<22} {'batch':>5} {'plain ms':>9} {'ckpt ms':>9} {'t c/p':>7} {'kept plain':>11} "
          f"{'kept ckpt':>11} {'k c/p':>7}")
    rows = [measure(p, args.batch, repeats, device) for p in presets]
    result = {"benchmark": "bench_checkpointing.py", "argv": sys.argv[1:], "machine": machine(device),
              "repeats": repeats, "rows": rows}
    if args.markdown:
        write_text(args.markdown, markdown(result))
        print(f"wrote {args.markdown}")
    if args.out:
        write_json(args.out, result)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
