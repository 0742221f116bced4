"""``make demo``: build the NAC Table 4 models, run them on a batch, print size and speed.

Until the training CLI lands this is modwire's main job: it shows that the paper's
Tiny-ImageNet NAC and its Perceiver IO baseline build from one line each, map
``[B, 3, 64, 64]`` images to ``[B, 200]`` logits, and how fast they run here.
"""
from __future__ import annotations

import argparse
import time

import torch

from . import create_model, list_models, model_source


def forward_throughput(model: torch.nn.Module, x: torch.Tensor, iters: int) -> tuple[float, torch.Tensor]:
    """Samples per second of an inference forward (after one warm-up call)."""
    model.eval()
    with torch.inference_mode():
        out = model(x)
        start = time.perf_counter()
        for _ in range(iters):
            out = model(x)
        elapsed = time.perf_counter() - start
    return x.shape[0] * iters / elapsed, out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=["nac_tiny_imagenet", "perceiver_io_tiny_imagenet"],
                    choices=list_models(), metavar="MODEL", help=f"presets, any of {list_models()}")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"modwire demo: inference forward on a batch of {args.batch} images, "
          f"{torch.get_num_threads()} CPU threads")
    print(f"{'model':<30}{'source':<20}{'params':>12}{'logits':>14}{'img/s':>10}")
    rates = {}
    for name in args.models:
        model = create_model(name)
        c = model.config
        x = torch.randn(args.batch, c.in_channels, c.image_size, c.image_size)
        rate, out = forward_throughput(model, x, args.iters)
        assert torch.isfinite(out).all(), f"{name} produced non-finite logits"
        rates[name] = rate
        print(f"{name:<30}{model_source(name):<20}{model.num_parameters():>12,}"
              f"{str(list(out.shape)):>14}{rate:>10.1f}")
    if len(rates) == 2:
        (a, ra), (b, rb) = rates.items()
        print(f"throughput ratio {a} / {b}: {ra / rb:.2f}")


if __name__ == "__main__":
    main()
