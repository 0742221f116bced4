"""What Neural Function Modules cost: forward + backward of each NFM integration vs its base network
(issue 13).

    OMP_NUM_THREADS=1 python benchmarks/bench_nfm.py [--repeats 5] [--quick] [--presets GLOB ...]

Pairs: every registered preset ``nfm_<base>`` whose ``<base>`` is also registered, matching the
globs (default ``*micro``: each integration's test-sized pair: PreActResNet, and the relational
CNN, GAN generator and language model when their presets are registered; absent ones are simply not
listed), plus the classifier at a CPU size, NFM before every stage (``nfm_modules="stage"``, the presets: the
paper's ResNet placement) and, as an option, before every residual block (``nfm_modules="block"``):
PreActResNet-18 (CIFAR-10 layout) at a
quarter width (``--width 16`` initial channels; the paper's is 64), 32×32 images, ``--batch 16``.

Each side runs a train step (train mode; forward, then backward of the mean square of the output);
the two models alternate (``modwire.analysis.time_interleaved``), medians are printed. Columns:
``nfm / base`` (NFM with two passes runs every block twice, so ~2 is the floor without the readers)
and ``nfm / (base × 2)``, the cost of the readers over running the base network twice (measured:
a function that runs the base step twice). Target (issue 13): ``nfm / (base × 2) <= 1.30`` for the
classifier; printed PASS / FAIL (not with --quick).

Inputs: ``model.example_inputs(batch)`` when a model defines it, else made from the config (image
CNNs: ``[B, in_channels, image_size, image_size]``; token models: ids ``[B, min(max_len, 64)]``;
generators: latents ``[B, latent_dim]``); a model none of these fits is skipped with a note.
"""
from __future__ import annotations

import argparse
import fnmatch
import os
from typing import Any, Callable

import torch

import modwire
from modwire.analysis import time_interleaved

TARGET = 1.30


def classifier(width: int, batch: int, modules: str) -> tuple[str, str, str, dict, int]:
    """A classifier row: PreActResNet-18 (CIFAR-10 layout) at ``width`` initial channels (paper: 64), NFM's
    modules = stages (``stage``, the presets) or residual blocks (``block``)."""
    return (f"classifier: PreActResNet-18 w{width}, {modules}s", "nfm_preact_resnet18_cifar10",
            "preact_resnet18_cifar10", {"initial_channels": width, "nfm_modules": modules}, batch)


def example_inputs(model: torch.nn.Module, batch: int) -> tuple[tuple, dict] | None:
    """``(args, kwargs)`` for one call of ``model``, or None when nothing here fits it."""
    if hasattr(model, "example_inputs"):
        return model.example_inputs(batch)
    c, g = model.config, torch.Generator().manual_seed(0)
    if hasattr(c, "latent_dim"):                                   # a generator (models/gan.py): z [B, latent_dim]
        return ((torch.randn(batch, c.latent_dim, generator=g),), {})
    if hasattr(c, "image_size") and hasattr(c, "in_channels"):
        x = torch.rand(batch, c.in_channels, c.image_size, c.image_size, generator=g)
        return ((x,), {})
    if hasattr(c, "vocab_size") and hasattr(c, "max_len"):
        return ((torch.randint(0, c.vocab_size, (batch, min(c.max_len, 64)), generator=g),), {})
    return None


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out
    return next(v for v in values if isinstance(v, torch.Tensor))


def train_step(model: torch.nn.Module, inputs: tuple[tuple, dict]) -> Callable[[], None]:
    args, kwargs = inputs

    def step() -> None:
        model.zero_grad(set_to_none=True)
        _first_tensor(model(*args, **kwargs)).float().square().mean().backward()
    return step


def pairs(globs: list[str]) -> list[tuple[str, str, str, dict, int]]:
    """``(label, nfm preset, base preset, overrides, batch)`` of every registered NFM pair matching ``globs``."""
    names = set(modwire.list_models())
    found = [n for n in sorted(names) if n.startswith("nfm_") and n[4:] in names
             and any(fnmatch.fnmatch(n, g) or fnmatch.fnmatch(n[4:], g) for g in globs)]
    return [(n[4:], n, n[4:], {}, 8) for n in found]


def measure(label: str, nfm_name: str, base_name: str, overrides: dict, batch: int, repeats: int) -> dict | None:
    torch.manual_seed(0)
    nfm = modwire.create_model(nfm_name, **overrides).train()
    base = modwire.create_model(base_name, **overrides).train()
    inputs = example_inputs(base, batch)
    if inputs is None:
        print(f"{label:<40} skipped: no example input for model_type {base.config.model_type!r}")
        return None
    b, n = train_step(base, inputs), train_step(nfm, inputs)
    t = time_interleaved({"base": b, "base x2": lambda: (b(), b()), "nfm": n}, iters=repeats)
    row = {"label": label, "batch": batch, "base": t["base"], "base x2": t["base x2"], "nfm": t["nfm"],
           "params": (base.num_parameters(), nfm.num_parameters())}
    print(f"{label:<40} {batch:>5} {t['base'] * 1e3:>9.1f} {t['base x2'] * 1e3:>9.1f} {t['nfm'] * 1e3:>9.1f} "
          f"{t['nfm'] / t['base']:>9.2f} {t['nfm'] / t['base x2']:>11.2f}   "
          f"{row['params'][0]:,} → {row['params'][1]:,}")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="micro pairs only, 1 repeat (smoke test)")
    ap.add_argument("--presets", nargs="+", default=["*micro"], help="globs over NFM preset names (default *micro)")
    ap.add_argument("--width", type=int, default=16, help="classifier's initial channels (default 16; paper 64)")
    ap.add_argument("--batch", type=int, default=16, help="classifier's batch (default 16)")
    ap.add_argument("--modules", nargs="+", default=["block", "stage"], choices=["block", "stage"],
                    help="classifier rows: NFM before every stage (the presets) and/or every residual block")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    todo = pairs(args.presets) + ([] if args.quick else [classifier(args.width, args.batch, m) for m in args.modules])
    repeats = 1 if args.quick else args.repeats
    print(f"threads {torch.get_num_threads()}, train step (forward + backward), median of {repeats}")
    print(f"{'pair':<40} {'batch':>5} {'base ms':>9} {'base×2 ms':>9} {'nfm ms':>9} {'nfm/base':>9} "
          f"{'nfm/(base×2)':>11}   params base → nfm")
    rows = [r for r in (measure(*p, repeats=repeats) for p in todo) if r is not None]
    for r in rows:
        if not args.quick and r["label"].startswith("classifier"):
            ratio = r["nfm"] / r["base x2"]
            print(f"target nfm/(base×2) <= {TARGET:.2f}, {r['label']}: {ratio:.2f} "
                  f"{'PASS' if ratio <= TARGET else 'FAIL'}")


if __name__ == "__main__":
    main()
