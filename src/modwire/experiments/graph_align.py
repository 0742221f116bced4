"""What ``align="degree"`` does to the graph structure regularizer (NAC App. A, Eq. 6-9).

The default ``align="none"`` is the paper's loss: Eq. 9's cost on ``P`` as labelled,
Hungarian ``σ``, Eq. 6. ``align="degree"`` first puts ``P``'s columns in the prior's
frame by matching degrees (``modwire.graphs.regularizer``). For ``--trials`` random ``P``
(unit signatures ``[U, d_sig]`` from a Gaussian, ``P = exp(-(1 - cos)/ε)``, NAC Eq. 2:
an untrained model) per prior and per ``U``, this prints

* ``degree/none``: the ratio ``L_graph(degree) / L_graph(none)`` (min / median / max);
  below 1 means the degree-aligned matching finds a closer permuted prior;
* ``invariant``: for each align, the fraction of trials whose loss is unchanged (relative
  change < 1e-9) when ``P``'s modules are relabelled by a random permutation of its rows
  and columns, and the median and largest relative change ``|L(πPπᵀ) - L(P)| / L(P)``.

Two kernels: ``d_sig = 64, ε = 1`` (NAC Table 4 at initialisation: ``P`` is nearly
constant around ``e⁻¹``) and ``d_sig = 8, ε = 0.25`` (more spread-out ``P``).
Run: ``PYTHONPATH=src python -m modwire.experiments.graph_align`` (a few minutes on 2 cores;
``--quick`` for a smoke test). Computed in float64 on the CPU. The rows go to ``OUT/study.json``
(:mod:`modwire.experiments.common`; ``--quick`` writes it only where ``--out`` is given).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from modwire.experiments import common
from modwire.graphs import GraphRegularizer, list_priors

DEFAULT_OUT = Path("runs/experiments/graph_align")

KERNELS = ((64, 1.0), (8, 0.25))      # (d_sig, ε)
INVARIANT_RTOL = 1e-9


def random_link_probs(U: int, d_sig: int, eps: float, g: torch.Generator) -> torch.Tensor:
    """NAC Eq. 2 on random unit signatures: ``[U, U]`` float64, symmetric, ``P_ii = 1``."""
    s = torch.nn.functional.normalize(torch.randn(U, d_sig, generator=g, dtype=torch.float64), dim=1)
    return torch.exp(-(1 - s @ s.T) / eps)


def relabel(P: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """``P`` with its modules renumbered by a random permutation (rows and columns)."""
    pi = torch.randperm(P.shape[0], generator=g)
    return P[pi][:, pi]


def trial(regs: dict[str, GraphRegularizer], P: torch.Tensor,
          Pp: torch.Tensor) -> dict[str, tuple[float, float]]:
    """align → (loss on ``P``, relative change of the loss on the relabelled ``Pp``)."""
    out = {}
    for align, reg in regs.items():
        a, b = reg(P).item(), reg(Pp).item()
        out[align] = (a, abs(b - a) / max(abs(a), 1e-300))
    return out


def measure(name: str, U: int, d_sig: int, eps: float, trials: int, seed: int) -> dict[str, object]:
    """Run ``trials`` random ``P`` for one prior and size; summary numbers."""
    regs = {align: GraphRegularizer(name, align=align) for align in ("none", "degree")}
    g = torch.Generator().manual_seed(seed)
    ratios, changes = [], {"none": [], "degree": []}
    for _ in range(trials):
        P = random_link_probs(U, d_sig, eps, g)
        res = trial(regs, P, relabel(P, g))
        ratios.append(res["degree"][0] / res["none"][0])
        for align in changes:
            changes[align].append(res[align][1])
    inv = {a: (sum(c < INVARIANT_RTOL for c in v) / trials, statistics.median(v), max(v))
           for a, v in changes.items()}
    return {"ratio": (min(ratios), statistics.median(ratios), max(ratios)), "invariant": inv}


def row(name: str, U: int, d_sig: int, eps: float, r: dict[str, object]) -> str:
    lo, med, hi = r["ratio"]
    cells = [f"{100 * f:.0f}% ({m:.1e} / {x:.1e})" for f, m, x in r["invariant"].values()]
    return f"| {name} | {U} | {d_sig}, {eps:g} | {lo:.3f} / {med:.3f} / {hi:.3f} | {' | '.join(cells)} |"


def main(argv: list[str] | None = None) -> None:
    ap = common.parser(__doc__, None, "5 trials, U = 16")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 320])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = args.out if args.out is not None or args.quick else DEFAULT_OUT
    if args.quick:
        args.trials, args.sizes = 5, [16]
    trials, sizes = args.trials, args.sizes
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"{trials} random P per row; ratio = L_graph(degree) / L_graph(none), min / median / max; "
          f"invariant = share of trials with relative change < {INVARIANT_RTOL:g} under relabelling "
          f"(median / max relative change)\n")
    print(common.markdown_table(["prior", "U", "d_sig, ε", "degree/none", "invariant, none", "invariant, degree"], []))
    start, results = time.perf_counter(), []
    for d_sig, eps in KERNELS:
        for U in sizes:
            for name in list_priors():
                r = measure(name, U, d_sig, eps, trials, args.seed)
                results.append({"prior": name, "U": U, "d_sig": d_sig, "eps": eps, **r})
                print(row(name, U, d_sig, eps, r), flush=True)
    print(f"\n({time.perf_counter() - start:.0f} s)")
    if out is not None:
        common.write_study(out, "graph_align", results, config=args, seeds=[args.seed], started=start)


if __name__ == "__main__":
    main()
