"""Inference speed-up from dropping modules (NAC App. F, Fig. 5): NAC and Perceiver IO.

Run ``python benchmarks/bench_sparsify.py`` (``nac_tiny_imagenet`` and
``perceiver_io_tiny_imagenet``, batch 64, a few minutes on 2 CPU cores) or with
``--quick`` (``nac_small`` / ``perceiver_io_small``, batch 4, < 20 s; a smoke test whose
ratios mean little).

For each model, copies with 0%, 50%, 75% and 87.5% of the processor modules (NAC,
dropped by importance ``q_i = Σ_j P_ij``, NAC App. F Eq. 10) or latents (Perceiver IO,
the last ones) removed by :func:`modwire.analysis.drop_modules` are timed in eval mode
under ``torch.inference_mode()`` on random ``[B, 3, H, W]`` images, as in the paper
(App. F: batch 64, ``inference_mode``). The variants are timed interleaved
(0%, 50%, 75%, 87.5%, 0%, ...), one forward per sample, and the median per variant is
kept, so slow phases of a shared machine hit all of them; every speed-up is a ratio of
two medians from the same run. Weights are random: only speed is measured here.

Acceptance: NAC throughput at 87.5% dropped / at 0% >= 7x. The FLOP ratio of the two
copies (printed) bounds what a compute-bound run can show: 6.4x at Table 4 sizes, since
the App. C tokenizer and the 64 output modules do not shrink with the processor modules.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import modwire
from modwire.analysis import count_flops, drop_modules

FRACTIONS = (0.0, 0.5, 0.75, 0.875)


def bench(name: str, batch: int, repeats: int, warmup: int) -> dict[float, float]:
    torch.manual_seed(0)
    model = modwire.create_model(name).eval()
    cfg = model.config
    field = "num_processor_modules" if isinstance(model, modwire.NAC) else "num_latents"
    variants = {f: drop_modules(model, f) for f in FRACTIONS}
    x = torch.randn(batch, cfg.tokenizer.in_channels, cfg.tokenizer.image_size, cfg.tokenizer.image_size)
    times: dict[float, list[float]] = {f: [] for f in FRACTIONS}
    with torch.inference_mode():
        for f, m in variants.items():
            for _ in range(warmup):
                m(x)
        for _ in range(repeats):
            for f, m in variants.items():
                t = time.perf_counter()
                m(x)
                times[f].append(time.perf_counter() - t)
        # counted on the timed batch: part of a forward is batch-independent (x[:1] overstated
        # the full nac_tiny_imagenet with its former 320-channel tokenizer: 24.1 GFLOPs/img at batch 1,
        # 15.7 at batch 64)
        flops = {f: count_flops(lambda m=m: m(x)) / batch for f, m in variants.items()}
    med = {f: statistics.median(ts) for f, ts in times.items()}
    print(f"\n{name}: batch {batch}, {repeats} interleaved repeats, median seconds per forward")
    print(f"  {'dropped':>8} {field:>22} {'s/forward':>10} {'samples/s':>10} {'speed-up':>9} "
          f"{'GFLOPs/img':>11} {'FLOP ratio':>11}")
    for f in FRACTIONS:
        u = getattr(variants[f].config, field)
        print(f"  {f:>8.1%} {u:>22d} {med[f]:>10.4f} {batch / med[f]:>10.1f} {med[0.0] / med[f]:>8.2f}x "
              f"{flops[f] / 1e9:>11.3f} {flops[0.0] / flops[f]:>10.2f}x")
    return {f: med[0.0] / med[f] for f in FRACTIONS}, flops[0.0] / flops[0.875]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small models, batch 4 (smoke test)")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default 64; 4 with --quick)")
    ap.add_argument("--repeats", type=int, default=None, help="timed forwards per variant (default 3; 7 quick)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch = args.batch or (4 if args.quick else 64)
    repeats = args.repeats or (7 if args.quick else 3)
    nac, pio = (("nac_small", "perceiver_io_small") if args.quick
                else ("nac_tiny_imagenet", "perceiver_io_tiny_imagenet"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    s_nac, ceiling = bench(nac, batch, repeats, warmup=1)
    s_pio, _ = bench(pio, batch, repeats, warmup=1)
    ok = s_nac[0.875] >= 7.0
    print(f"\nNAC speed-up at 87.5% modules dropped: {s_nac[0.875]:.2f}x "
          f"(target >= 7x: {'met' if ok else 'NOT met'}{'; --quick sizes, not meaningful' if args.quick else ''})")
    print(f"  FLOP ratio full / 87.5% dropped: {ceiling:.2f}x: the compute-bound ceiling (the tokenizer and the "
          f"output modules do not shrink); a larger measured ratio means the full model pays extra "
          f"(e.g. allocator page faults, see README)")
    print(f"Perceiver IO speed-up at 87.5% latents dropped: {s_pio[0.875]:.2f}x")


if __name__ == "__main__":
    main()
