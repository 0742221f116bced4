"""Forward-time cost of the model input checks (``modwire.nn.tokenizers``: shapes, dtype,
one ``aminmax`` for NaN/inf) on ``nac_small``, batch 64: forwards with and without the
checks, interleaved, reported as the median of the paired ratios (issue 9, item 5).

    OMP_NUM_THREADS=1 python benchmarks/bench_input_checks.py [--pairs 15] [--batch 64]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import modwire
from modwire.nn.tokenizers import ConvTokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = modwire.create_model("nac_small").eval()
    x = torch.rand(args.batch, 3, 32, 32)
    checked = ConvTokenizer.check_input

    def unchecked(self, x, *, name="x"):
        return x

    def forward_s(check) -> float:
        ConvTokenizer.check_input = check
        t = time.perf_counter()
        with torch.no_grad():
            model(x)
        return time.perf_counter() - t

    forward_s(checked), forward_s(unchecked)                      # warm-up
    on, off = zip(*[(forward_s(checked), forward_s(unchecked)) for _ in range(args.pairs)])
    ConvTokenizer.check_input = checked
    ratios = [a / b for a, b in zip(on, off)]
    t = time.perf_counter()
    for _ in range(100):
        checked(model.tokenizer, x)
    alone = (time.perf_counter() - t) / 100
    print(f"nac_small forward, batch {args.batch}, {torch.get_num_threads()} thread(s): with checks "
          f"{statistics.median(on) * 1e3:.1f} ms, without {statistics.median(off) * 1e3:.1f} ms")
    print(f"with / without checks (median of {args.pairs} interleaved pairs): {statistics.median(ratios):.4f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")
    print(f"check_input alone: {alone * 1e6:.0f} us = {alone / statistics.median(off) * 100:.3f}% of a forward")


if __name__ == "__main__":
    main()
