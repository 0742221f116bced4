"""Graph structure regularizer benchmarks (NAC App. A, Eq. 6-9): its share of a NAC
training step, and the time of the matching (Eq. 9 cost + Hungarian method).

Run ``python benchmarks/bench_graph.py`` (a few minutes on 2 CPU cores) or with
``--quick`` (tiny sizes, < 20 s, a smoke test: its ratios mean nothing). Every claim
is a ratio of timings taken in the same run, interleaved (A, B, A, B, ...), median.

Sections:

1. **Overhead in a training step.** ``nac_tiny_imagenet`` (NAC Table 4) with
   ``U = 320`` and ``U = 1024`` processor modules; a step is forward on random
   ``[B, 3, 64, 64]`` images + cross entropy + backward + AdamW step, timed without
   and with ``+ GraphRegularizer("scale_free")(model.link_probs())``. Also timed
   alone: the regularizer's forward + backward (link probabilities, matching, Eq. 6).
   Printed: the step times, ``share = (with - without) / without`` (a difference of
   two noisy medians) and ``alone / without`` (the steadier estimate).
   Acceptance: ``alone / without < 5%`` at ``U = 320``.
2. **Matching at U = 1280.** ``match(P, P0)`` (the paper's Eq. 9 cost on ``P`` as labelled, one Hungarian call)
   on ``P`` from random signatures through the NAC kernel (an untrained model, Table 4
   ε = 1) and on a relabelled graph sampled from the prior (a model that fits its
   prior), for several priors; split into the Eq. 9 cost (matmul) and
   ``scipy.optimize.linear_sum_assignment``. Acceptance: every median < 1 s. Then the
   literal broadcast ``U³`` form of Eq. 9 (the authors' code) against the matmul form.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

import modwire
from modwire.graphs import GraphRegularizer, match, matching_cost, prior, sample_adjacency
from modwire.nn.kernel import SignatureKernel

from bench_nac import time_interleaved, time_once

SHARE_TARGET = 0.05    # regularizer alone / train step, U = 320
MATCH_TARGET = 1.0     # seconds, match at U = 1280


def section_overhead(args) -> float:
    preset = "nac_small" if args.quick else "nac_tiny_imagenet"
    sizes = (16, 32) if args.quick else (320, 1024)
    alone_share = float("nan")
    for U in sizes:
        torch.manual_seed(0)
        model = modwire.create_model(preset, num_processor_modules=U).train()
        c = model.config
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(args.batch, 3, c.tokenizer.image_size, c.tokenizer.image_size)
        y = torch.randint(c.num_classes, (args.batch,))
        reg = GraphRegularizer("scale_free")
        seconds: list[float] = []

        def step(with_reg: bool):
            def run():
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x), y)
                if with_reg:
                    loss = loss + args.weight * reg(model.link_probs())
                loss.backward()
                opt.step()
            return run

        def alone():
            model.zero_grad(set_to_none=True)
            reg(model.link_probs()).backward()
            seconds.append(reg.last_matching_seconds)

        t = time_interleaved({"without": step(False), "with": step(True), "alone": alone}, args.iters)
        share, alone_share = (t["with"] - t["without"]) / t["without"], t["alone"] / t["without"]
        print(f"U={U:5d} ({preset}, batch {args.batch}, median of {args.iters}): "
              f"step {t['without']:.3f} s, step + regularizer {t['with']:.3f} s, "
              f"regularizer alone {t['alone'] * 1e3:.1f} ms (matching {statistics.median(seconds) * 1e3:.1f} ms)")
        print(f"        share (with - without) / without = {share * 100:+.2f}%, "
              f"alone / without = {alone_share * 100:.2f}%")
        if U == sizes[0]:
            first = alone_share
    verdict = ("(not checked with --quick)" if args.quick
               else ("PASS" if first < SHARE_TARGET else "FAIL"))
    print(f"regularizer alone / step at U={sizes[0]}: {first * 100:.2f}% "
          f"(target < {SHARE_TARGET * 100:g}%): {verdict}")
    return first


def _median(fn, iters: int) -> float:
    fn()
    return statistics.median(time_once(fn) for _ in range(iters))


def section_matching(args) -> None:
    U = 128 if args.quick else 1280
    torch.manual_seed(0)
    s = torch.randn(U, 64)                                     # d_sig 64 (Table 4)
    untrained = SignatureKernel(epsilon=1.0).link_probs(s, s)  # [U, U]
    perm = torch.randperm(U)
    worst = 0.0
    print(f"U={U}, median of {args.iters} after a warm-up; cost = Eq. 9 by matmul, "
          f"scipy = linear_sum_assignment on the float64 cost")
    for name in ("scale_free", "planted_partition", "ring_of_cliques"):
        P0 = prior(name, U)
        fitted = sample_adjacency(name, U, seed=0)[perm][:, perm]  # a model that matches its prior
        for label, P in (("untrained P", untrained), ("fitted P", fitted)):
            def cost():
                assign = torch.empty(U, dtype=torch.long)
                assign[torch.sort(P.sum(1), descending=True, stable=True).indices] = \
                    torch.sort(P0.sum(1), descending=True, stable=True).indices
                return matching_cost(P, P0[:, assign])

            C = cost().double().numpy()
            t = time_interleaved({"match": lambda: match(P, P0), "cost": cost,
                                  "scipy": lambda: linear_sum_assignment(C)}, args.iters)
            worst = max(worst, t["match"])
            print(f"  {name:18s} {label:12s}: match {t['match'] * 1e3:7.1f} ms "
                  f"= cost {t['cost'] * 1e3:6.1f} ms + scipy {t['scipy'] * 1e3:7.1f} ms (+ transfer)")
    verdict = "(not checked with --quick)" if args.quick else ("PASS" if worst < MATCH_TARGET else "FAIL")
    print(f"slowest match at U={U}: {worst:.3f} s (target < {MATCH_TARGET:g} s): {verdict}")
    if not args.quick and U >= 1024:
        print("  note: at U >= 1024 the paper's scale_free (Eq. 8, beta 0.5) clips to 1 everywhere "
              "(a complete graph), so its cost columns are all equal")

    n = 64 if args.quick else 320
    P, P0 = untrained[:n, :n].contiguous(), prior("scale_free", n)
    t = time_interleaved({"broadcast": lambda: (P[:, None, :] - P0[None, :, :]).square().sum(-1),
                          "matmul": lambda: matching_cost(P, P0)}, args.iters)
    err = (matching_cost(P.double(), P0.double())
           - (P.double()[:, None] - P0.double()[None]).square().sum(-1)).abs().max().item()
    print(f"Eq. 9 at U={n}: literal broadcast (U³ tensor, {n ** 3 * 4 / 2 ** 20:.0f} MiB) "
          f"{t['broadcast'] * 1e3:.1f} ms vs matmul {t['matmul'] * 1e3:.2f} ms: "
          f"{t['broadcast'] / t['matmul']:.0f}x; max |difference| (float64) {err:.1e}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16, help="images per training step (default 16)")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per measurement (default 3)")
    ap.add_argument("--weight", type=float, default=1e-3, help="regularizer weight (timing only)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes; a smoke test, < 20 s")
    args = ap.parse_args(argv)
    if args.quick:
        for name, small in (("batch", 2), ("iters", 1)):
            if getattr(args, name) == ap.get_default(name):
                setattr(args, name, small)
    if args.batch < 1 or args.iters < 1:
        ap.error("--batch and --iters must be >= 1")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, numpy {np.__version__}; "
          f"load average (1 min) {os.getloadavg()[0]:.2f} (other work on the machine skews timings)")
    print("== 1. regularizer overhead in a NAC training step ".ljust(100, "="))
    section_overhead(args)
    print("== 2. matching (NAC Eq. 9 + Hungarian method) ".ljust(100, "="))
    section_matching(args)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
