"""Block-sparse vs dense-masked propagator attention after edge elimination (NAC App. F).

Run ``python benchmarks/bench_block_sparse.py`` (a minute or two on 2 CPU cores) or with
``--quick`` (tiny sizes, < 15 s, a smoke test whose ratios mean nothing).

NAC App. F removes the attentive connections with the smallest link probabilities
``P_ij`` (90% of the off-diagonal pairs costs little accuracy) and names sparse attention
kernels as future work. Here ``P`` is planted-partition-like (NAC Table 4 sizes: U = 320
processor modules in 8 clusters of 40; ``P`` = 0.8 within a cluster, 0.2 between, plus
Gaussian noise of std 0.05, symmetric). The modules start in a random order and are
put in cluster order with ``order_by_groups`` (``block_order``, reverse Cuthill-McKee on the
mask alone, is shown for comparison). The smallest 50% / 75% / 90% of the off-diagonal
pairs (symmetric) are removed; the diagonal is kept.

Timed (inference mode, interleaved A, B, A, B, ..., median per variant; every speed-up is
a ratio of two medians of the same run):

* attention alone, ``[B, H=6, U, 64]`` queries/keys/values laid out as the projections
  produce them: the dense ``attend`` with the masked bias and ``key_mask`` (what an
  edge-eliminated NAC runs now: all ``U²`` scores) vs ``attend`` with a ``BlockSparseBias``
  built once (only the kept ``block_size²`` blocks), for block sizes 16/32/40/64, with the
  block-sparse kernel forced (``max_density=1``);
* the default ``BlockSparseBias.from_dense(..., block_size=40)``, which falls back to one
  ``U × U`` block (dense) when more than half of the blocks are kept;
* for context, a whole propagator layer ``TransformerBlock(384, 6, 1536, mod=ModulationSpec("nac", 384))``
  with that bias (its ModFFN and projections are O(U), so its ratio is smaller).

Acceptance: attention speed-up >= 2x at 90% of the edges removed, block size 40.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import torch

from modwire.nn import BlockSparseBias, ModulationSpec, TransformerBlock, attend, block_order, order_by_groups
from modwire.nn.kernel import normalize_log_kernel

TARGET = 2.0
FRACTIONS = (0.9, 0.75, 0.5)


def planted_partition(u: int, clusters: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P [U, U], labels [U])``: cluster labels in random order, P high within clusters."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(u) * clusters // u
    labels = labels[torch.randperm(u, generator=g)]
    p = torch.where(labels[:, None] == labels[None, :], 0.8, 0.2) + 0.05 * torch.randn(u, u, generator=g)
    p = ((p + p.T) / 2).clamp(1e-3, 1.0)
    p.fill_diagonal_(1.0)
    return p, labels


def eliminate(p: torch.Tensor, fraction: float) -> torch.Tensor:
    """Bool mask ``[U, U]`` without the smallest ``fraction`` of the off-diagonal pairs (NAC App. F)."""
    u = p.shape[0]
    i, j = torch.triu_indices(u, u, 1)
    keep = p[i, j].argsort(descending=True)[: round((1 - fraction) * len(i))]
    mask = torch.eye(u, dtype=torch.bool)
    mask[i[keep], j[keep]] = mask[j[keep], i[keep]] = True
    return mask


def log_kernel(p: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The eval-mode (``K = P``) bias ``log K̂`` and key mask ``[1, 1, U, U]`` an edge-eliminated
    NAC hands to ``attend``."""
    log_k_hat = normalize_log_kernel(p.log(), mask=mask)
    return {"bias": log_k_hat[None, None], "key_mask": mask[None, None]}


def time_interleaved(fns: dict[str, Callable[[], object]], iters: int) -> dict[str, float]:
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(iters):
        for n, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[n].append(time.perf_counter() - t)
    return {n: statistics.median(t) for n, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default 64; 4 with --quick)")
    ap.add_argument("--iters", type=int, default=7, help="timed repeats per variant (median)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    u, clusters, heads, hd, dim, hidden, block, sweep = (
        (48, 4, 2, 16, 32, 64, 12, (4, 8, 12, 16)) if args.quick else
        (320, 8, 6, 64, 384, 1536, 40, (16, 32, 40, 64)))
    b = args.batch or (4 if args.quick else 64)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average (1 min) "
          f"{os.getloadavg()[0]:.2f}; B={b}, U={u} ({clusters} clusters), H={heads}, head dim {hd}; "
          f"median of {args.iters} interleaved")
    p, labels = planted_partition(u, clusters)
    perm = order_by_groups(labels)
    print("\nblock density at block size", block, "(random order / order_by_groups / block_order rcm):")
    for f in FRACTIONS:
        m = eliminate(p, f)
        dens = [BlockSparseBias.from_dense(None, m[o][:, o], block).layout.density
                for o in (torch.arange(u), perm, block_order(m))]
        print(f"  {f:.0%} removed: " + " / ".join(f"{d:.3f}" for d in dens))
    p, labels = p[perm][:, perm], labels[perm]                      # modules in cluster order from here on

    q, k, v = (torch.randn(b, u, heads, hd).transpose(1, 2) for _ in range(3))  # as the projections lay them out
    layer = TransformerBlock(dim, heads, hidden, mod=ModulationSpec("nac", dim)).eval()
    x, codes = torch.randn(b, u, dim), torch.randn(u, dim)
    results = {}
    with torch.inference_mode():
        for f in FRACTIONS:
            mask = eliminate(p, f)
            dense = log_kernel(p, mask)
            cross = int((mask & (labels[:, None] != labels[None, :])).sum())
            print(f"\n{f:.0%} of off-diagonal edges removed: {int(mask.sum()) - u} kept "
                  f"({cross} across clusters)")
            print(f"  {'block':>5} {'density':>8} {'groups':>6} {'dense s':>8} {'sparse s':>9} {'speed-up':>8} "
                  f"{'max |diff|':>10}")
            for bs in sweep:
                t0 = time.perf_counter()
                sparse = BlockSparseBias.from_dense(dense["bias"], mask, bs, max_density=1.0)
                build = time.perf_counter() - t0
                ref, out = attend(q, k, v, **dense)[0], attend(q, k, v, bias=sparse)[0]
                t = time_interleaved({"dense": lambda: attend(q, k, v, **dense),
                                      "sparse": lambda: attend(q, k, v, bias=sparse)}, args.iters)
                speed = t["dense"] / t["sparse"]
                results[f, bs] = speed
                print(f"  {bs:>5} {sparse.layout.density:>8.3f} {len(sparse.layout.groups):>6} {t['dense']:>8.4f} "
                      f"{t['sparse']:>9.4f} {speed:>7.2f}x {(out - ref).abs().max().item():>10.1e}"
                      f"   (built in {build * 1e3:.1f} ms)")
            sparse = BlockSparseBias.from_dense(dense["bias"], mask, block)  # default max_density 0.5
            kind = ("dense fallback (one U x U block)" if sparse.layout.num_blocks == 1 else
                    f"block-sparse, density {sparse.layout.density:.3f}")
            t = time_interleaved({"dense": lambda: attend(q, k, v, **dense),
                                  "sparse": lambda: attend(q, k, v, bias=sparse)}, args.iters)
            print(f"  from_dense(block {block}) default -> {kind}: attention speed-up "
                  f"{t['dense'] / t['sparse']:.2f}x")
            t = time_interleaved({"dense": lambda: layer(x, codes, **dense),
                                  "sparse": lambda: layer(x, codes, bias=sparse)}, args.iters)
            print(f"  whole TransformerBlock, same bias: dense {t['dense']:.4f} s, with it "
                  f"{t['sparse']:.4f} s, speed-up {t['dense'] / t['sparse']:.2f}x")
    speed = results[0.9, block]
    verdict = ("not checked with --quick" if args.quick else
               "PASS" if speed >= TARGET else "FAIL")
    print(f"\nattention speed-up at 90% removed, block {block}: {speed:.2f}x "
          f"(target >= {TARGET:g}x: {verdict}); load average (1 min) {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
