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
same as Markdown tables; both written atomically. Also counted, per forward: the base network's
multiply-adds (``modwire.analysis.count_flops``: convolutions and matmuls) and the elements of the
readers' per-position products (the broadcast ``q·k`` and ``w·v`` of every source of every read), the
elementwise work that no matmul carries; and a floor: those products' multiplies alone (three per
product, fresh operands of their shapes), timed interleaved with the base step, give the least NFM /
base that any reader materialising them can reach (:func:`products_floor`).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import modwire
import modwire.nn.nfm as nfm_module
from modwire.analysis import count_flops, time_interleaved
from modwire.nn.attention import sparse_softmax

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

    def step(backward: bool = True) -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        out = model(*args, **kwargs).float().square().mean()
        if backward:
            out.backward()
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


def reader_products(model: torch.nn.Module, step) -> list[tuple[int, ...]]:
    """The broadcast shapes of the readers' per-position products in one forward (``q · k`` over ``d_k``
    and ``w · v`` over ``d_v`` of every source of every read; each is read and written again in the
    backward), recorded by wrapping the reader's two contractions."""
    shapes: list[tuple[int, ...]] = []
    real_scores, real_values = nfm_module.source_scores, nfm_module.add_source_values

    def scores(q, key, how):                                      # q [B, H or 1, c, P], key [B, H, c, R, P / U]
        b, hq, c, p = q.shape
        shapes.append(tuple(torch.broadcast_shapes((b, hq, c, how.u, p // how.u), key.shape)))
        return real_scores(q, key, how)

    def values(a, w, value, how):                                 # w [B, H, R, P], value [B, H, c, R, P / U]
        b, hd, r, p = w.shape
        shapes.append((b, hd, value.shape[2], max(r, how.u), p // how.u))
        return real_values(a, w, value, how)
    nfm_module.source_scores, nfm_module.add_source_values = scores, values
    try:
        with torch.no_grad():
            step(backward=False)
    finally:
        nfm_module.source_scores, nfm_module.add_source_values = real_scores, real_values
    return shapes


def products_floor(shapes: list[tuple[int, ...]], base_step, iters: int = 5) -> dict:
    """The readers' multiplies alone, timed interleaved with the base network's train step: per recorded
    product, three contiguous multiplies of its full shape (the forward's, and the backward's one per
    operand), operands made beforehand (more than the caches hold, as in a model). A lower bound on
    what the readers cost while their products are materialised: it leaves out every reduction, the
    softmax, the projections and the copies."""
    operands = [(torch.rand(shape), torch.rand(shape)) for shape in shapes]

    def multiplies() -> None:
        for a, b in operands:
            for _ in range(3):
                torch.mul(a, b)
    t = time_interleaved({"base": base_step, "products": multiplies}, iters=iters)
    return {"base_step_ms": round(t["base"] * 1e3, 2), "products_ms": round(t["products"] * 1e3, 2),
            "floor_nfm_over_base": round((2 * t["base"] + t["products"]) / t["base"], 2)}


def elementwise_ns() -> dict:
    """ns per element of a plain multiply of two contiguous 4 MiB float32 tensors into a fresh one on
    this machine: ``warm``, the same operands each call (they stay in cache), and ``cold``, operands
    taken in turn from 32 pairs (256 MiB, more than the caches hold), as a model's products are."""
    pairs = [(torch.rand(1 << 20), torch.rand(1 << 20)) for _ in range(32)]
    turn = iter(range(1 << 30))

    def cold() -> None:
        a, b = pairs[next(turn) % len(pairs)]
        torch.mul(a, b)
    t = time_interleaved({"warm": lambda: torch.mul(*pairs[0]), "cold": cold}, iters=64)
    return {k: round(v * 1e9 / (1 << 20), 3) for k, v in t.items()}


def keys_axis_topk(shape: tuple[int, ...] = (16, 4, 44, 361), k: int = 5) -> dict:
    """The reader's top-k softmax over its keys axis (``sparse_softmax(dim=2)`` of scores ``[B, H, keys,
    P]``; default: the largest Sort-of-CLEVR read) against the former rule on the same scores, ``topk``
    along that axis and bool masks (issue 39 replaced it), forward and backward, timed interleaved."""
    scores = torch.randn(shape, generator=torch.Generator().manual_seed(0)).requires_grad_()
    up = torch.randn(shape)

    def former() -> None:
        idx = scores.detach().topk(k, dim=2).indices
        keep = torch.zeros(shape, dtype=torch.bool).scatter_(2, idx, True)
        w = scores.masked_fill(~keep, torch.finfo(scores.dtype).min).softmax(dim=2) * keep
        w.backward(up)

    def current() -> None:
        sparse_softmax(scores, topk=k, dim=2).backward(up)
    t = time_interleaved({"former": former, "current": current}, iters=9)
    return {"shape": list(shape), "k": k, "former_ms": round(t["former"] * 1e3, 2),
            "current_ms": round(t["current"] * 1e3, 2), "former_over_current": round(t["former"] / t["current"], 2)}


def run(pair: str, batch: int, top: int) -> dict:
    nfm_name, base_name, overrides = PAIRS[pair]
    torch.manual_seed(0)
    nfm, base = modwire.create_model(nfm_name, **overrides), modwire.create_model(base_name, **overrides)
    base_step, nfm_step = step_of(base, batch), step_of(nfm, batch)
    base_ms, _ = profiled(base_step, top)
    nfm_ms, ops = profiled(nfm_step, top)
    macs = count_flops(lambda: base_step(backward=False)) // 2
    shapes = reader_products(nfm, nfm_step)
    floor = products_floor(shapes, base_step)
    return {"pair": pair, "nfm": nfm_name, "base": base_name, "overrides": overrides, "batch": batch,
            "base_ms": round(base_ms, 1), "nfm_ms": round(nfm_ms, 1),
            "readers_share": round(max(nfm_ms - 2 * base_ms, 0.0) / nfm_ms, 3),
            "base_forward_macs": macs,
            "reader_forward_product_elements": sum(math.prod(x) for x in shapes), "floor": floor, "top": ops}


def markdown(rows: list[dict], info: dict, mul: dict, topk: dict) -> str:
    lines = [f"Profile of one NFM train step (`benchmarks/profile_nfm.py`; {info['cpu']}, {info['threads']} "
             f"thread(s), torch {info['torch']}, {info['date']}, commit {info['git_commit']}"
             f"{' + working tree' if info['git_dirty'] else ''}). Times are the profiler's self CPU times "
             f"(the profiler adds its own overhead: compare shares, not absolute ms). A contiguous multiply of "
             f"two 4 MiB tensors here: {mul['warm']} ns per element with its operands in cache, {mul['cold']} ns "
             f"with them from memory. The reader's top-k softmax over its keys axis (scores {topk['shape']}, "
             f"k = {topk['k']}, forward and backward, `keys_axis_topk`): {topk['current_ms']} ms; the "
             f"former rule (`topk` along that axis, bool masks) {topk['former_ms']} ms on the same scores.", ""]
    for r in rows:
        lines += [f"### {r['pair']}: `{r['nfm']}` {r['overrides'] or ''} (batch {r['batch']})", "",
                  f"Base step {r['base_ms']} ms, NFM step {r['nfm_ms']} ms under the profiler; the readers "
                  f"(the NFM step beyond twice the base's) {100 * r['readers_share']:.0f} % of it. One forward: "
                  f"the base's convolutions and matmuls {r['base_forward_macs'] / 1e6:.0f} M multiply-adds; the "
                  f"readers' per-position products {r['reader_forward_product_elements'] / 1e6:.0f} M elements "
                  f"(elementwise, each written and read again, and twice more in the backward).", "",
                  f"Floor: the readers' multiplies alone (three per product: the forward's and the backward's, "
                  f"no reduction, softmax, projection or copy) take {r['floor']['products_ms']} ms against the "
                  f"base step's {r['floor']['base_step_ms']} ms (timed interleaved, without the profiler), so "
                  f"while the products are materialised NFM / base >= {r['floor']['floor_nfm_over_base']} "
                  f"(two passes plus them).", "",
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
    mul = elementwise_ns()
    topk = keys_axis_topk()
    print(f"a contiguous multiply on this machine: {mul['warm']} ns per element with operands in cache, "
          f"{mul['cold']} ns with operands from memory; the keys-axis top-k softmax {topk['shape']} "
          f"(forward and backward): former rule {topk['former_ms']} ms, current {topk['current_ms']} ms")
    for r in rows:
        print(f"{r['pair']}: base {r['base_ms']} ms, nfm {r['nfm_ms']} ms, readers {100 * r['readers_share']:.0f} %; "
              f"forward: base {r['base_forward_macs'] / 1e6:.1f} M MACs, reader products "
              f"{r['reader_forward_product_elements'] / 1e6:.1f} M elements; the multiplies alone "
              f"{r['floor']['products_ms']} ms vs the base step {r['floor']['base_step_ms']} ms: NFM / base >= "
              f"{r['floor']['floor_nfm_over_base']}")
        for o in r["top"]:
            print(f"  {o['op']:<40} {o['self_ms']:>9.2f} ms {100 * o['share']:>5.1f} % {o['calls']:>5}")
    if args.out:
        write_json(args.out, {"benchmark": "profile_nfm.py", "argv": sys.argv[1:], "machine": info,
                              "multiply_ns_per_element": mul, "keys_axis_topk": topk, "rows": rows})
    if args.markdown:
        target = Path(args.markdown)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(markdown(rows, info, mul, topk) + "\n")
        os.replace(tmp, target)


if __name__ == "__main__":
    main()
