"""``make demo``: train a CPU-sized NAC and a Perceiver IO of the same dimensions on a
built-in task, then print accuracy, parameters and training speed for both.

Both runs use the same config (``DEMO`` below, overridable with ``--set``): only the
model differs. ``--forward`` instead times the inference forward of the full NAC
Table 4 models (the previous demo).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from . import create_model, list_models, model_source

# The built-in task and budget of the demo: ListOps (NAC Table 3) with short expressions
# (depth ≤ 3, at most 64 tokens), ~2 minutes per model on 2 CPU cores. Chance is 10%, the
# majority class about 14%.
DEMO = [
    "data.task=listops", "data.params.size={train: 48000, val: 1000, test: 1000}", "data.params.min_len=5",
    "data.params.max_len=64", "data.params.max_depth=3", "model.overrides.max_len=64",
    "model.overrides.token_dim=96", "data.batch_size=64", "epochs=1", "max_steps=700", "optim.lr=2e-3",
    "optim.warmup_steps=50", "optim.weight_decay=0.05", "log_every=50",
]
MODELS = ["nac_small", "perceiver_io_small"]


def train_both(models: list[str], overrides: list[str], out_dir: str, progress: bool) -> list[dict]:
    from .training import load_config, train

    rows = []
    for name in models:
        cfg = load_config(None, [*DEMO, f"model.name={name}", f"out_dir={out_dir}/{name}",
                                 f"progress={str(progress).lower()}", *overrides])
        start = time.perf_counter()
        result = train(cfg)
        elapsed = time.perf_counter() - start
        rows.append({"model": name, "params": result["model"].num_parameters(), "task": cfg.data.task,
                     **result["val"], "steps": result["step"], "steps_per_s": result["step"] / elapsed,
                     "run_dir": result["run_dir"]})
    return rows


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


def forward_demo(models: list[str], batch: int, iters: int) -> None:
    print(f"inference forward on a batch of {batch} images, {torch.get_num_threads()} CPU threads")
    print(f"{'model':<30}{'source':<20}{'params':>12}{'logits':>14}{'img/s':>10}")
    rates = {}
    for name in models:
        model = create_model(name)
        c = model.config
        x = torch.randn(batch, c.tokenizer.in_channels, c.tokenizer.image_size, c.tokenizer.image_size)
        rate, out = forward_throughput(model, x, iters)
        assert torch.isfinite(out).all(), f"{name} produced non-finite logits"
        rates[name] = rate
        print(f"{name:<30}{model_source(name):<20}{model.num_parameters():>12,}"
              f"{str(list(out.shape)):>14}{rate:>10.1f}")
    if len(rates) == 2:
        (a, ra), (b, rb) = rates.items()
        print(f"throughput ratio {a} / {b}: {ra / rb:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=None, choices=list_models(), metavar="MODEL",
                    help=f"presets, any of {list_models()}")
    ap.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                    help="training-config overrides applied to both runs")
    ap.add_argument("--out-dir", default="runs/demo")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--forward", action="store_true", help="time the NAC Table 4 inference forward instead")
    ap.add_argument("--batch", type=int, default=16, help="with --forward")
    ap.add_argument("--iters", type=int, default=2, help="with --forward")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    if args.forward:
        forward_demo(args.models or ["nac_tiny_imagenet", "perceiver_io_tiny_imagenet"], args.batch, args.iters)
        return
    rows = train_both(args.models or MODELS, args.overrides, args.out_dir, not args.no_progress)
    metric = next(k for k in rows[0] if k not in ("model", "params", "task", "loss"))
    print(f"\nmodwire demo: {rows[0]['task']}, {rows[0]['steps']} training steps per model, "
          f"{torch.get_num_threads()} CPU threads")
    print(f"{'model':<24}{'params':>12}{'val ' + metric:>12}{'val loss':>10}{'train steps/s':>15}")
    for r in rows:
        print(f"{r['model']:<24}{r['params']:>12,}{r[metric]:>12.3f}{r['loss']:>10.3f}{r['steps_per_s']:>15.2f}")
    print(json.dumps([{k: v for k, v in r.items() if k != "run_dir"} for r in rows]))


if __name__ == "__main__":
    main()
