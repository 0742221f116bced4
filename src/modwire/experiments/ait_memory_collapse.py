"""The AiT memory collapse: which parts of the write keep the memory slots apart (measured here).

AiT's memory slots should specialise (Figure 2: each slot attends to its own image region). This
trains a small AiT (2 blocks of 64-d wired as the authors' code, the workspace reading the FFN's
output; the paper's workspace: 32 slots × 32-d, 8 bottleneck heads of width D = 32 with the 1/√D
scale of Eq. 3, no biases, bottleneck k = 512 of a 128 × 64 = 8192-patch pool; the write's Dropout
0.1) with AdamW and the balance loss at σ = 0.01, for these workspace variants:

* ``paper``: modwire's defaults: Eq. 3-4 as printed, ``γ̂ = LN(Dropout(Concat(heads) W^O))``, Eq. 3's
  top-k of the softmax over the pool, gradient through the written memory;
* ``residual``: the authors' code's write ``γ̂ = LN(γ + Dropout(Concat(heads) W^O))``
  (``write_residual=True``), otherwise ``paper``;
* ``biased``: modwire's workspace before issue 23: biases on ``W^Q, W^K, W^V, W^O`` and ``D/A``-wide
  heads (``bottleneck_bias=True, bottleneck_head_split=True``), otherwise ``paper``;
* ``kept``: ``bottleneck_softmax="kept"`` (the authors' top-k: each slot's weights renormalised over
  its k patches);
* ``unit``: ``normalize_update=True`` (``γ̂`` scaled to unit slots before Eq. 4);
* ``both``: :data:`modwire.models.ait.NO_COLLAPSE` (``kept`` and ``unit``);
* ``authors``: the network the authors released, :data:`modwire.models.ait.AUTHORS_AIT` (their
  residual write and top-k, and their detached write).

Every variant states ``write_residual``, ``bottleneck_softmax`` and ``write_grad`` itself, so the
table does not move with the defaults. The committed results of earlier code
(``experiments/results/ait_memory_collapse_*``) were measured with modwire's block before issue 35
(the workspace reading ``LN(x)`` after the FFN's residual) and without the Dropout; their
``authors`` variant had the authors' write and top-k but a write with gradient.
Data: Fashion-MNIST (32×32, 4×4 patches; ``apt-get install dataset-fashion-mnist`` or ``--data-root DIR``
holding the four idx files); where Fashion-MNIST is not at hand, ``--task digits`` (scikit-learn's
bundled 8×8 digits upsampled to 32×32, the same model with 8×8 patches, 16 tokens per image and a 2048-patch
pool: a 4×4 patch of the upsampled image is one constant pixel, which the patch LayerNorm maps to one
token whatever its value, ``--patch-size 4``; 1.4k training images) or ``--task triangle``
(the built-in generated Triangle task, 64×64 in 8×8 patches: the same 64 tokens per image and pool).

Per variant and training seed (``--seeds N``: seeds 0 .. N-1, default 3; the seed sets the
initialisation and the batch order, the data are the same for every seed) it records, every
``--every`` steps, the mean cosine similarity between the slots of each layer's memory, the balance
loss and the task loss, and at the end the test accuracy on the first 2000 test images, the number
of distinct patches the slots select and the run's wall time (``seconds``). Results go to
``OUT/results.json`` (one record per variant and seed, rewritten after each run), the table to
``OUT/table.md`` (per variant the mean ± sample std over the seeds and each seed's end cosine, then
one line per run), the curves to ``OUT/slot_similarity.png`` (the mean over the seeds, the band
their range), the study run's record to ``OUT/study.json`` (:mod:`modwire.experiments.common`). A record
without ``seed`` (the one-seed runs of earlier code) is seed 0.

Run: ``python -m modwire.experiments.ait_memory_collapse`` (300 steps, about 1.5 minutes a variant and seed
on one core); ``--task triangle --steps 150``; ``--quick`` (one seed unless ``--seeds`` says
otherwise); ``--report`` reprints the table and rebuilds ``OUT/study.json`` from
``OUT/results.json`` (no training).
"""
from __future__ import annotations

import time
from pathlib import Path

from modwire.experiments import common
from modwire.files import atomic_write_text

# modwire's defaults (Eq. 3-4 as printed; no biases, width-D heads), stated so the table does not move with them
PAPER = {"write_residual": False, "bottleneck_softmax": "all", "write_grad": True}
AUTHORS = {"write_residual": True, "bottleneck_softmax": "kept", "write_grad": False}   # = modwire.models.ait.AUTHORS_AIT
VARIANTS = {"paper": PAPER, "residual": {**PAPER, "write_residual": True},
            "biased": {**PAPER, "bottleneck_bias": True, "bottleneck_head_split": True},
            "kept": {**PAPER, "bottleneck_softmax": "kept"}, "unit": {**PAPER, "normalize_update": True},
            "both": {**PAPER, "bottleneck_softmax": "kept", "normalize_update": True},
            "authors": AUTHORS}
MODEL = dict(num_classes=10, d_model=64, num_heads=4, ffn_hidden=128, bottleneck_size=512, classifier="mean",
             tokenizer={"kind": "patches", "image_size": 32, "in_channels": 1, "patch_size": 4})
# digits: 8×8 images upsampled 4× (nearest) to 32×32, so a 4×4 patch is one constant pixel, which the
# authors' patch LayerNorm maps to one token whatever its value: the model would see no image. An 8×8
# patch holds 2×2 of the digit's pixels.
TASKS = {"fashion_mnist": {"num_classes": 10, "tokenizer": MODEL["tokenizer"]},
         "digits": {"num_classes": 10, "tokenizer": {**MODEL["tokenizer"], "patch_size": 8}},
         "triangle": {"num_classes": 2, "tokenizer": {"kind": "patches", "image_size": 64, "in_channels": 1,
                                                  "patch_size": 8}}}


def data(n_train: int, n_test: int, root: str | None = None, task: str = "fashion_mnist"):
    """Fashion-MNIST padded to 32×32 (from ``root``, else the loader's default, Debian's path) or the
    generated Triangle task: ``(x_train, y_train, x_test, y_test)``."""
    import torch
    import torch.nn.functional as F

    from modwire.tasks import build_dataset

    def load(split: str, n: int):
        ds = build_dataset(task, split, max_samples=n, **({"root": root} if task == "fashion_mnist" else {}))
        x = torch.stack([ds[i][0] for i in range(len(ds))])
        y = torch.tensor([int(ds[i][1]) for i in range(len(ds))])
        return (F.pad(x, (2, 2, 2, 2)) if x.shape[-1] == 28 else x), y

    return (*load("train", n_train), *load("test", n_test))


def train_variant(name: str, steps: int, every: int, tensors, seed: int = 0, task: str = "fashion_mnist",
                  patch_size: int | None = None) -> dict:
    import torch
    import torch.nn.functional as F

    from modwire.analysis.workspace import model_patch_diversity, slot_similarity
    from modwire.models import create_model

    x, y, xt, yt = tensors
    torch.manual_seed(seed)
    tokenizer = {**TASKS[task]["tokenizer"], **({"patch_size": patch_size} if patch_size else {})}
    model = create_model("ait_small_cifar10", **{**MODEL, **TASKS[task], "tokenizer": tokenizer}, **VARIANTS[name])
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
    return {"variant": name, "seed": seed, "task": task, "patch_size": tokenizer["patch_size"], "overrides": VARIANTS[name],
            "steps": steps, "curve": curve,
            "test_top1": correct / len(xt), "patch_diversity": diversity,
            "seconds": round(time.perf_counter() - start, 1)}


def _by_variant(results: list[dict]) -> dict[str, list[dict]]:
    """The records by variant (in the order they first appear), each variant's in seed order (a
    record without ``seed`` is seed 0)."""
    out: dict[str, list[dict]] = {}
    for r in results:
        out.setdefault(r["variant"], []).append(r)
    return {k: sorted(v, key=lambda r: r.get("seed", 0)) for k, v in out.items()}


def format_table(results: list[dict]) -> str:
    """Per variant, mean ± sample std over the seeds: the slot cosine at the end per layer (AiT Fig. 2:
    slots that specialise stay apart) and each seed's for layer 1, the balance loss, the patch
    diversity, the test accuracy and each seed's wall time; then one line per run."""
    ms = common.format_mean_std
    summary = []
    for name, runs in _by_variant(results).items():
        end = [r["curve"][-1] for r in runs]
        cos = [ms([c["slot_cos"][layer] for c in end]) for layer in (0, 1)]
        summary.append([name, len(runs), f"{cos[0]} / {cos[1]}",
                        ", ".join(f"{c['slot_cos'][0]:.2f}" for c in end), ms([c["balance"] for c in end], 0),
                        f"{ms([r['patch_diversity'][0] for r in runs], 3)} / "
                        f"{ms([r['patch_diversity'][1] for r in runs], 3)}",
                        ms([100 * r["test_top1"] for r in runs], 1), ", ".join(str(r["seconds"]) for r in runs)])
    per_run = []
    for r in results:
        a, b = r["curve"][0]["slot_cos"], r["curve"][-1]["slot_cos"]
        per_run.append([r["variant"], r.get("seed", 0), f"{a[0]:.2f} / {a[1]:.2f} → {b[0]:.2f} / {b[1]:.2f}",
                        f"{r['curve'][-1]['balance']:.0f}",
                        f"{r['patch_diversity'][0]:.3f} / {r['patch_diversity'][1]:.3f}", f"{100 * r['test_top1']:.1f}",
                        r["seconds"]])
    return (common.markdown_table(["variant", "seeds", "slot cosine at the end, layer 1 / 2", "layer 1 per seed",
                                   "balance loss (end)", "distinct / selected patches (layer 1 / 2)", "test top-1 %",
                                   "seconds per seed"], summary) + "\n\n" +
            common.markdown_table(["variant", "seed", "slot cosine, layer 1 / 2 (start → end)", "balance loss (end)",
                                   "distinct / selected patches (layer 1 / 2)", "test top-1 %", "seconds"], per_run))


def plot(results: list[dict], path: Path) -> Path | None:
    """Slot cosine over training, per variant and layer: the mean over the seeds, the band their range."""
    import numpy as np

    def draw(fig, ax):
        for name, runs in _by_variant(results).items():
            steps = [c["step"] for c in runs[0]["curve"]]
            for layer, style in ((0, "-"), (1, "--")):
                cos = np.array([[c["slot_cos"][layer] for c in r["curve"]] for r in runs])
                line, = ax.plot(steps, cos.mean(0), style, label=f"{name} (layer {layer + 1})")
                if len(runs) > 1:
                    ax.fill_between(steps, cos.min(0), cos.max(0), color=line.get_color(), alpha=0.15, lw=0)
        seeds = common.seeds_of(results)
        ax.set(xlabel="training step", ylabel="mean cosine between memory slots", ylim=(-0.05, 1.05),
               title=f"AiT memory collapse ({results[0].get('task', 'task not recorded')}, "   # early runs lack it
                     f"{len(seeds)} seed{'s' * (len(seeds) > 1)})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return common.save_figure(path, draw)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, None, "6 steps, 256 images, one seed unless --seeds",
                       report="reprint the table from OUT/results.json and rebuild OUT/study.json (no training)",
                       results="ait_memory_collapse")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--seeds", type=common.positive, default=None, help="training seeds 0 .. N-1 (default 3; 1 with "
                                                                       "--quick)")
    ap.add_argument("--task", choices=sorted(TASKS), default="fashion_mnist")
    ap.add_argument("--patch-size", type=common.positive, default=None,
                    help="the patch side in pixels (default: the task's, 4; 8 for digits)")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--data-root", default=None, help="the directory of Fashion-MNIST's four idx files (default: "
                                                       "where Debian's dataset-fashion-mnist installs them)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    args.seeds = args.seeds or (1 if args.quick else 3)
    results = common.read_log(args.out / "results.json", __file__) if args.report else train_variants(args)
    table = format_table(results)
    atomic_write_text(args.out / "table.md", table + "\n")
    plot(results, args.out / "slot_similarity.png")
    common.finish_study(args.out, "ait_memory_collapse", results, args=args, started=started,
                        seeds=common.seeds_of(results), logs=[args.out / "results.json"], script=__file__, argv=argv)
    print(table)
    return 0


def train_variants(args) -> list[dict]:
    """Train every variant of ``args.variants`` for each of ``args.seeds`` seeds (seed-major) on the same
    data; the records go to ``OUT/results.json`` after each run, so a killed study keeps its runs."""
    steps, every = (6, 2) if args.quick else (args.steps, args.every)
    try:
        tensors = data(512 if args.quick else 20000, 256 if args.quick else 2000, args.data_root, args.task)
    except (FileNotFoundError, ValueError) as e:     # the loader's message shows the expected layout
        raise SystemExit(f"ait_memory_collapse.py: the {args.task} data is not readable: {e}\n(on Debian: "
                         f"apt-get install dataset-fashion-mnist, or pass --data-root DIR, or --task digits)") from None
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in range(args.seeds):
        for name in args.variants:
            results.append(train_variant(name, steps, every, tensors, seed=seed, task=args.task,
                                         patch_size=args.patch_size))
            print(f"{name}, seed {seed}: slot cosine {results[-1]['curve'][-1]['slot_cos']}, test top-1 "
                  f"{results[-1]['test_top1']:.3f} ({results[-1]['seconds']:.0f} s)", flush=True)
            common.write_json_atomic(args.out / "results.json", results)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
