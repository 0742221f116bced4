"""The AiT memory collapses as printed; two options keep its slots apart (measured here).

AiT's memory slots should specialise (Figure 2: each slot attends to its own image region).
With Eq. 3-4 as printed, every slot becomes the same vector within a few dozen training steps:
``top-k(softmax(·))`` keeps a small share of a nearly uniform softmax over the ``B·N`` pool, so
``γ̂ = LN(Concat(heads) W^O)`` is dominated by ``W^O``'s bias and is the same for every slot;
and Eq. 4 averages the unit-norm memory with a LayerNorm output of norm ``√D``, so the new write
weighs far more than ``1 - α``. Once the slots are equal, their queries, selections and updates
are equal too, and neither the task loss nor the balance loss (Eq. 5-6, stuck at its
fully-collapsed value) can separate them.

This trains a small AiT (2 blocks of 64-d, the paper's workspace: 32 slots × 32-d, 8 heads,
bottleneck k = 512 of a 128 × 64 = 8192-patch pool) on Fashion-MNIST (32×32, 4×4 patches, real
data offline: ``apt-get install dataset-fashion-mnist``, or ``--data-root DIR`` holding the four idx
files) with AdamW and the balance loss at
σ = 0.01, for four workspace variants:

* ``paper``: Eq. 3-4 as printed (the default);
* ``kept``: ``bottleneck_softmax="kept"`` (each slot's weights renormalised over its k patches);
* ``unit``: ``normalize_update=True`` (``γ̂`` scaled to unit slots before Eq. 4);
* ``both``: :data:`modwire.models.ait.NO_COLLAPSE`.

Per variant it records, every ``--every`` steps, the mean cosine similarity between the slots of
each layer's memory, the balance loss and the task loss, and at the end the test accuracy on the
first 2000 test images and the number of distinct patches the slots select. Results go to
``OUT/results.json``, the table to ``OUT/table.md``, the curves to ``OUT/slot_similarity.png``.

Run: ``python experiments/ait_memory_collapse.py`` (about 5 minutes on 2 cores); ``--quick``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "experiments" / "results" / "ait_memory_collapse"
VARIANTS = {"paper": {}, "kept": {"bottleneck_softmax": "kept"}, "unit": {"normalize_update": True},
            "both": {"bottleneck_softmax": "kept", "normalize_update": True}}
MODEL = dict(num_classes=10, d_model=64, num_heads=4, ffn_hidden=128, bottleneck_size=512,
             embed={"kind": "patches", "image_size": 32, "in_channels": 1, "patch_size": 4})


def data(n_train: int, n_test: int, root: str | None = None):
    """Fashion-MNIST padded to 32×32 (from ``root``, else the loader's default, Debian's path):
    ``(x_train, y_train, x_test, y_test)``."""
    import torch
    import torch.nn.functional as F

    from modwire.tasks import build_dataset

    def load(split: str, n: int):
        ds = build_dataset("fashion_mnist", split, max_samples=n, root=root)
        x = torch.stack([ds[i][0] for i in range(len(ds))])
        y = torch.tensor([int(ds[i][1]) for i in range(len(ds))])
        return (F.pad(x, (2, 2, 2, 2)) if x.shape[-1] == 28 else x), y

    return (*load("train", n_train), *load("test", n_test))


def slot_similarity(memory) -> float:
    """Mean cosine similarity between distinct slots of one memory ``[M, D]``."""
    import torch.nn.functional as F

    g = F.normalize(memory, dim=-1)
    s = g @ g.T
    m = len(s)
    return float((s.sum() - s.diagonal().sum()) / (m * m - m))


def train_variant(name: str, steps: int, every: int, tensors, seed: int = 0) -> dict:
    import torch
    import torch.nn.functional as F

    from modwire.analysis.workspace import model_patch_diversity
    from modwire.models import create_model

    x, y, xt, yt = tensors
    torch.manual_seed(seed)
    model = create_model("ait_small_cifar10", **MODEL, **VARIANTS[name])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    curve, start = [], time.perf_counter()
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(x), (128,), generator=g)
        model.train()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        balance = model.auxiliary_losses()["balance"]
        (loss + 0.01 * balance).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % every == 0 or step in (1, steps):
            curve.append({"step": step, "loss": loss.item(), "balance": balance.item(),
                          "slot_cos": [slot_similarity(w.memory) for w in model.workspaces]})
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(xt[i:i + 256]).argmax(-1) == yt[i:i + 256]).sum()) for i in range(0, len(xt), 256))
        diversity = model_patch_diversity(model, [xt[:128]]).mean(dim=-1).tolist()
    return {"variant": name, "steps": steps, "curve": curve, "test_top1": correct / len(xt),
            "patch_diversity": diversity, "seconds": round(time.perf_counter() - start, 1)}


def format_table(results: list[dict]) -> str:
    lines = ["| variant | slot cosine, layer 1 / 2 (start → end) | balance loss (end) | distinct / selected patches "
             "(layer 1 / 2) | test top-1 % |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        a, b = r["curve"][0]["slot_cos"], r["curve"][-1]["slot_cos"]
        lines.append(f"| {r['variant']} | {a[0]:.2f} / {a[1]:.2f} → {b[0]:.2f} / {b[1]:.2f} | "
                     f"{r['curve'][-1]['balance']:.0f} | {r['patch_diversity'][0]:.3f} / {r['patch_diversity'][1]:.3f} | "
                     f"{100 * r['test_top1']:.1f} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        steps = [c["step"] for c in r["curve"]]
        for layer, style in ((0, "-"), (1, "--")):
            ax.plot(steps, [c["slot_cos"][layer] for c in r["curve"]], style, label=f"{r['variant']} (layer {layer + 1})")
    ax.set(xlabel="training step", ylabel="mean cosine between memory slots", ylim=(-0.05, 1.05),
           title="AiT memory collapse (Fashion-MNIST)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="smoke test: 6 steps, 256 images")
    ap.add_argument("--data-root", default=None, help="the directory of Fashion-MNIST's four idx files (default: "
                                                       "where Debian's dataset-fashion-mnist installs them)")
    args = ap.parse_args(argv)
    steps, every = (6, 2) if args.quick else (args.steps, args.every)
    tensors = data(512 if args.quick else 20000, 256 if args.quick else 2000, args.data_root)
    results = []
    for name in VARIANTS:
        results.append(train_variant(name, steps, every, tensors))
        print(f"{name}: slot cosine {results[-1]['curve'][-1]['slot_cos']}, test top-1 {results[-1]['test_top1']:.3f} "
              f"({results[-1]['seconds']:.0f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    table = format_table(results)
    (args.out / "table.md").write_text(table + "\n")
    plot(results, args.out / "slot_similarity.png")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
