"""Associative Transformer speed (issue 12, item 7): the AiT-Small train step vs a ViT-Small of
the same dimensions, the global workspace layers' share of that step, and the cost of the
bottleneck attention's top-k selection at AiT Table 6 pool sizes.

    OMP_NUM_THREADS=1 python benchmarks/bench_ait.py [--batch 32] [--repeats 5] [--quick]
    python benchmarks/bench_ait.py --device cuda --precision bf16 --compile

1. **AiT vs ViT, train step.** ``ait_small_cifar10`` (AiT §5.1 / Table 6: 2 blocks of 768-d
   self-attention with 12 heads, MLP 3072, then a global workspace layer: 32 memory slots of
   32-d, 8 bottleneck heads, k = 512, Hopfield retrieval; 64 patches of 4×4, pooled output) and
   the ViT with every dimension the two configs share (= ``vit_small_cifar10``). One step =
   forward on random ``[B, 3, 32, 32]`` images, cross entropy (+ 0.01 × the AiT's balance loss,
   AiT Eq. 5-6, as the training configs weigh it), backward, AdamW step (lr 1e-4, weight decay
   0.01; Table 6). Interleaved (AiT, ViT, AiT, ...), median of ``--repeats``; printed: AiT / ViT
   time. Paper batch: 512 (a pool of 32.8k patches); default here 32 (2 CPU cores).
2. **Workspace share.** The same AiT step with every
   :class:`~modwire.nn.workspace.GlobalWorkspace` timed from inside: a forward pre-hook and a
   forward hook bracket its forward; identity autograd nodes around its input and output stamp
   the moment its output gradient arrives and the moment its input gradient is complete (its
   backward; the CPU autograd engine runs one node at a time). Share = (workspace forward +
   backward) / whole step, median over steps. Target: <= 25%. Cross-check printed next to it:
   ``1 - ViT / AiT`` from section 1 (the ViT is the AiT without its workspace layers).
3. **Top-k at Table 6 sizes.** The bottleneck attention of one AiT layer at CIFAR sizes: 8
   heads, 32 memory slots as queries, slot size 32 split over the heads (4-d per head), over the
   squashed pool of 512 images × 64 patches = 32,768 keys/values, k = 512 (AiT Eq. 3). Timed,
   interleaved, forward and forward + backward:
   ``modwire.nn.attention.attend(q, k, v, topk=512, topk_softmax="all", return_weights=True)``
   (the call of ``GlobalWorkspace.write`` in training: Eq. 3's ``top-k(softmax(·))``, the
   weights feed the balance loss), the dense softmax (``topk=None``, weights returned; Table 2's
   "W/O bottleneck"), a bare ``torch.topk`` of the ``[8, 32, 32768]`` scores, and
   :func:`gathered_topk` (the same function on the gathered ``k`` selected entries, then
   scattered into dense weights; checked equal). Printed:
   each time, top-k / dense, and the bare ``torch.topk``'s share of the top-k forward.

Weights are random; only speed is measured. Ratios come from timings taken in the same run
(``modwire.analysis.time_interleaved``); compare ratios, not seconds, on a shared machine.

``--device cuda`` moves models and inputs to the GPU (refused when CUDA is not available; CUDA is
synchronised around every timed call, and in section 2 at each hook and stamp, so that the
workspace's GPU time is what is bracketed). ``--precision bf16`` runs every forward and loss, AiT
and ViT alike, under ``torch.autocast(device, bfloat16)`` (backward and AdamW outside it).
``--compile`` times ``torch.compile`` (default mode) of both models' forwards in section 1 and of
the three attention functions and the bare top-k in section 3, compiled by three untimed warm-up
calls each; section 2 is not measured then (the compiled step has no workspace boundary to stamp:
inductor fuses across it; section 1's ``1 - ViT / AiT`` is printed instead). The agreement check
of section 3 always runs eager, in fp32.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from runflags import EAGER, Run, add_run_flags
from modwire.analysis import time_interleaved
from modwire.nn.attention import attend

TARGET_SHARE = 0.25
BALANCE_WEIGHT = 0.01


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- 1. AiT vs ViT

def build_models(preset: str, **overrides: Any) -> tuple[nn.Module, nn.Module]:
    """The AiT preset and a ViT with every config field the two share (same width, depth, heads,
    MLP, embedding, CLS tokens / pooling, classes): the AiT without its workspace layers."""
    from modwire.models.registry import create_model
    from modwire.models.vit import ViT, ViTConfig

    torch.manual_seed(0)
    ait = create_model(preset, **overrides)
    c = ait.config
    shared = {f.name: getattr(c, f.name) for f in dataclasses.fields(ViTConfig)
              if hasattr(c, f.name) and f.name != "name"}
    vit = ViT(ViTConfig(**shared))
    return ait, vit


def images(model: nn.Module, batch: int, seed: int = 0, device: str = "cpu") -> tuple[Tensor, Tensor]:
    e = model.config.tokenizer
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, e.in_channels, e.image_size, e.image_size, generator=g)
    return x.to(device), torch.randint(model.config.num_classes, (batch,), generator=g).to(device)


def train_step(model: nn.Module, x: Tensor, y: Tensor, run: Run = EAGER) -> Callable[[], None]:
    """One call to time: forward, cross entropy (+ the weighted balance loss), backward, AdamW.
    Forward and loss under ``run.cast()``; the forward is ``run.compiled(model)``."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    forward = run.compiled(model)

    def step() -> None:
        model.train()
        opt.zero_grad(set_to_none=True)
        with run.cast():
            loss = F.cross_entropy(forward(x), y)
            for name, aux in model.auxiliary_losses().items():
                loss = loss + (BALANCE_WEIGHT if name == "balance" else 1.0) * aux
        loss.backward()
        opt.step()
    return step


def ait_vs_vit(ait: nn.Module, vit: nn.Module, batch: int, repeats: int, run: Run = EAGER) -> float:
    x, y = images(ait, batch, device=run.device)
    n = ait.num_parameters() / 1e6, vit.num_parameters() / 1e6
    tokens = ait.embed.num_tokens if hasattr(ait.embed, "num_tokens") else None
    print(f"\n1. AiT vs ViT of the same dimensions, train step (batch {batch}"
          + (f", pool of {batch * tokens} patches" if tokens else "") + ")")
    print(f"  parameters: AiT {n[0]:.2f} M, ViT {n[1]:.2f} M")
    t = time_interleaved({"AiT": train_step(ait, x, y, run), "ViT": train_step(vit, x, y, run)}, iters=repeats,
                         warmup=run.warmup)
    r = t["AiT"] / t["ViT"]
    print(f"  step s: AiT {t['AiT']:.4f}, ViT {t['ViT']:.4f}")
    print(f"  AiT / ViT train step time: {r:.3f}x")
    return r


# ----------------------------------------------------------------------------- 2. workspace share

class _Stamp(torch.autograd.Function):
    """Identity whose backward records ``time.perf_counter()`` under ``key`` in ``box``."""

    @staticmethod
    def forward(ctx, x: Tensor, box: dict, key: str) -> Tensor:  # type: ignore[override]
        ctx.box, ctx.key = box, key
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        _sync()                                    # CUDA: the GPU work before this node is done
        ctx.box[ctx.key] = time.perf_counter()
        return g, None, None


class WorkspaceTimer:
    """Forward and backward seconds spent inside ``modules`` during one step (see section 2)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.handles, self.fwd, self.stamps = [], 0.0, []
        for m in modules:
            self.handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._post))

    def reset(self) -> None:
        self.fwd, self.stamps = 0.0, []

    def _pre(self, module, args, kwargs):
        box: dict = {}
        self.stamps.append(box)
        _sync()
        module._bench_t0 = time.perf_counter()
        if args and isinstance(args[0], Tensor) and args[0].requires_grad:
            return (_Stamp.apply(args[0], box, "in"), *args[1:]), kwargs
        return None

    def _post(self, module, args, out):
        _sync()
        self.fwd += time.perf_counter() - module._bench_t0
        box = self.stamps[-1]
        if isinstance(out, Tensor):
            return _Stamp.apply(out, box, "out")
        if isinstance(out, tuple) and out and isinstance(out[0], Tensor):
            return (_Stamp.apply(out[0], box, "out"), *out[1:])
        return None

    def bwd(self) -> float:
        return sum(b["in"] - b["out"] for b in self.stamps if "in" in b and "out" in b)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def workspace_share(ait: nn.Module, batch: int, repeats: int, run: Run = EAGER) -> tuple[float, float, float]:
    """Median (share, forward share, backward share) of the workspace layers in an AiT step."""
    from modwire.nn.workspace import GlobalWorkspace

    modules = [m for m in ait.modules() if isinstance(m, GlobalWorkspace)]
    if not modules:
        raise RuntimeError(f"{type(ait).__name__} has no GlobalWorkspace module to time")
    x, y = images(ait, batch, seed=1, device=run.device)
    step = train_step(ait, x, y, run)
    timer = WorkspaceTimer(modules)
    step()                                               # warm-up
    rows = []
    for _ in range(repeats):
        timer.reset()
        _sync()
        t0 = time.perf_counter()
        step()
        _sync()
        total = time.perf_counter() - t0
        rows.append(((timer.fwd + timer.bwd()) / total, timer.fwd / total, timer.bwd() / total))
    timer.remove()
    return tuple(statistics.median(r[i] for r in rows) for i in range(3))  # type: ignore[return-value]


# ----------------------------------------------------------------------------- 3. top-k at Table 6 sizes

def gathered_topk(q: Tensor, k: Tensor, v: Tensor, topk: int) -> tuple[Tensor, Tensor]:
    """``attend(q, k, v, topk=topk, topk_softmax="all", return_weights=True)`` (AiT Eq. 3,
    ``top-k(softmax(·))``) computed on the selected keys only: the log-normaliser over all keys,
    the ``topk`` highest scores of each row gathered, ``w = exp(s_sel - lse)``, ``out = Σ w v[idx]``,
    then the weights scattered into a dense ``[..., Nq, Nk]`` (zero where not selected)."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5             # [..., Nq, Nk]
    idx = scores.detach().topk(topk, dim=-1).indices                     # [..., Nq, topk]
    w = (scores.gather(-1, idx) - scores.logsumexp(-1, keepdim=True)).exp()  # [..., Nq, topk]
    flat = idx.flatten(-2).unsqueeze(-1).expand(*idx.shape[:-2], idx.shape[-2] * topk, v.shape[-1])
    vs = v.gather(-2, flat).unflatten(-2, (idx.shape[-2], topk))         # v[idx]  [..., Nq, topk, dv]
    out = (w.unsqueeze(-2) @ vs).squeeze(-2)                              # [..., Nq, dv]
    return out, torch.zeros_like(scores).scatter(-1, idx, w)


def topk_inputs(heads: int, slots: int, head_dim: int, pool: int, seed: int = 0,
                device: str = "cpu") -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(heads, n, head_dim, generator=g).to(device).requires_grad_()  # type: ignore[return-value]
                 for n in (slots, pool, pool))


def topk_cost(heads: int, slots: int, head_dim: int, pool: int, k: int, repeats: int,
              run: Run = EAGER) -> dict[str, float]:
    q, kk, v = topk_inputs(heads, slots, head_dim, pool, device=run.device)
    scores = (q @ kk.transpose(-1, -2)).detach()
    a_out, a_w = attend(q, kk, v, topk=k, topk_softmax="all", return_weights=True)
    g_out, g_w = gathered_topk(q, kk, v, k)
    diff = max((a_out - g_out).abs().max().item(), (a_w - g_w).abs().max().item())
    print(f"\n3. top-k selection: {heads} heads x {slots} slots x {head_dim}-d over a pool of {pool} patches, "
          f"k = {k}")
    print(f"  max |attend top-k - gathered| = {diff:.2e} (outputs and weights)")

    def call(fn: Callable[[], tuple[Tensor, Tensor]], backward: bool) -> Callable[[], None]:
        def one() -> None:
            with run.cast():
                out, w = fn()
                loss = out.float().sum() + w.float().sum() if backward else None
            if backward:
                q.grad = kk.grad = v.grad = None
                loss.backward()
        return one
    fns = {"attend top-k": run.compiled(lambda: attend(q, kk, v, topk=k, topk_softmax="all", return_weights=True)),
           "dense softmax": run.compiled(lambda: attend(q, kk, v, topk=None, return_weights=True)),
           "gathered top-k": run.compiled(lambda: gathered_topk(q, kk, v, k))}
    timed = {f"{name}, fwd": call(fn, False) for name, fn in fns.items()}
    bare = run.compiled(lambda: scores.topk(k, dim=-1))
    timed["bare torch.topk, fwd"] = bare
    timed.update({f"{name}, fwd+bwd": call(fn, True) for name, fn in fns.items()})
    t = time_interleaved(timed, iters=repeats, warmup=run.warmup)
    for name, s in t.items():
        print(f"  {name:<26} {s * 1e3:>9.2f} ms")
    for mode in ("fwd", "fwd+bwd"):
        print(f"  attend top-k / dense softmax ({mode}): {t[f'attend top-k, {mode}'] / t[f'dense softmax, {mode}']:.2f}x; "
              f"gathered top-k / dense softmax: {t[f'gathered top-k, {mode}'] / t[f'dense softmax, {mode}']:.2f}x")
    share = t["bare torch.topk, fwd"] / t["attend top-k, fwd"]
    print(f"  torch.topk share of the attend top-k forward: {100 * share:.0f}%")
    return t


# ----------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="ait_micro and a small pool, few repeats (smoke test)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per side (default 5; 2 quick)")
    ap.add_argument("--batch", type=int, default=None, help="train-step batch (default 32; 8 quick)")
    ap.add_argument("--preset", default=None, help="AiT preset (default ait_small_cifar10; ait_micro quick)")
    ap.add_argument("--pool", type=int, default=None, help="top-k pool size (default 512 x 64 = 32768)")
    ap.add_argument("--skip-models", action="store_true", help="only section 3 (top-k)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    add_run_flags(ap)
    args = ap.parse_args()
    run = Run.from_args(ap, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (2 if args.quick else 5)
    batch = args.batch or (8 if args.quick else 32)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {os.getloadavg()[0]:.2f}, {run.describe()}")
    ratio = share = None
    if not args.skip_models:
        ait, vit = build_models(args.preset or ("ait_micro" if args.quick else "ait_small_cifar10"))
        ait, vit = ait.to(run.device), vit.to(run.device)
        ratio = ait_vs_vit(ait, vit, batch, repeats, run)
    if not args.skip_models and run.compile:
        print("\n2. workspace layers in the AiT step: not measured under --compile (no module boundary in the "
              "compiled step)")
        print(f"  1 - ViT / AiT step time (section 1): {100 * (1 - 1 / ratio):.1f}%")
    elif not args.skip_models:
        share, fwd, bwd = workspace_share(ait, batch, repeats, run)
        verdict = "" if args.quick else ("  (target <= 25%: met)" if share <= TARGET_SHARE else "  (target <= 25%: NOT met)")
        print(f"\n2. workspace layers in the AiT step (batch {batch}, median of {repeats} steps)")
        print(f"  forward {100 * fwd:.1f}%, backward {100 * bwd:.1f}% of the step")
        print(f"  workspace share of the AiT step: {100 * share:.1f}%{verdict}")
        print(f"  cross-check, 1 - ViT / AiT step time: {100 * (1 - 1 / ratio):.1f}%")
    pool = args.pool or (2048 if args.quick else 512 * 64)
    topk_cost(8, 32, 4, pool, 64 if args.quick else 512, repeats, run)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
