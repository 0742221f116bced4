"""Neural Interpreter speed (issue 11, item 7): batched functions vs a per-function loop, NI vs
a ViT of equal width and depth, and NI time vs the number of functions.

    OMP_NUM_THREADS=1 python benchmarks/bench_ni.py [--batch 32] [--repeats 5] [--quick]
    python benchmarks/bench_ni.py --device cuda --precision bf16 --compile [--sections 2]

Model: NI Table 4 (digits: 192-d, codes 192, 1 script × 8 function iterations × 1 LOC, 5
functions, 4 heads × 128 key features, MLP 192, types in 24-d, τ = 1.4, relative positions
with per-function biases) on 32×32 RGB images in 4×4 patches: 64 patch tokens + 3 CLS tokens =
67 tokens. Weights are random; only speed (and agreement of the two forms) is measured.

1. **Batched vs loop.** modwire runs every function on one ``[B, U, N, d]`` grid
   (``Script.interpret``). The loop form below (:func:`interpret_loop`) computes the same
   Eq. 9-11 one function at a time, ``U`` passes over ``[B, 1, N, d]``, with the model's own
   LOCs, codes, ``C`` and positional biases, and is swapped into the same model instance. The
   max abs difference of the two outputs is printed, then forward (eval, ``no_grad``) and train
   step (forward + backward) times at several batch sizes. Target: loop / batched >= 3× at
   U = 5. Both forms do the same FLOPs; the batched one saves ``U - 1`` of every ``U`` operator
   calls (dispatch, Python, small-kernel overhead), so its advantage shrinks as the batch grows.
2. **NI vs ViT.** The NI above against NI Table 5's ViT (192-d, depth 8, 3 heads × 64, MLP 192,
   same embedding, CLS tokens and relative positions): same width, and depth 8 = ``n_s · n_i ·
   n_l`` LOC applications. Forward and train step, with the counted GFLOPs per sample.
3. **Functions.** NI forward time for U ∈ {1, 2, 4, 8, 16, 32}, relative to U = 1.

Every comparison is timed interleaved (A, B, A, B, ...; one warm-up call each) and reports
medians and their ratio from the same run (``modwire.analysis.time_interleaved``). Section 2 also
prints the achieved rate (counted model FLOPs of the forward, or of forward + backward for the
train step, over the median time) and its share of the matmul peak measured on this device in
this precision (an ``n×n`` GEMM, best of several: 2048 on the CPU, 8192 on a GPU).

``--device cuda`` moves models and inputs to the GPU (refused when CUDA is not available; CUDA is
synchronised around every timed call). ``--precision bf16`` runs the forward and the loss of every
model under ``torch.autocast(device, bfloat16)`` (the backward outside it, as PyTorch recommends)
and measures the bf16 peak. ``--compile`` times ``torch.compile`` (default mode) of every model,
both sides of each comparison, compiled by three untimed warm-up calls each (with ``--compile`` the
loop form runs on a copy of the model with the same weights, so each form has its own compiled
code). FLOPs are counted on the eager models; the agreement check of section 1 runs eager, fp32.
``--sections`` picks sections (e.g. ``2`` for the rate alone: compiling every model of section 3
takes minutes).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import types
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from runflags import EAGER, Run, add_run_flags
from modwire.analysis import count_flops, time_interleaved
from modwire.models.neural_interpreter import NeuralInterpreter, NeuralInterpreterConfig, Script
from modwire.models.registry import get_config
from modwire.models.vit import ViT, ViTConfig

TARGET_LOOP = 3.0
FUNCTION_COUNTS = (1, 2, 4, 8, 16, 32)


def ni_config(num_functions: int = 5, *, quick: bool = False) -> NeuralInterpreterConfig:
    """The ``ni_digits`` preset (NI Table 4; ``ni_micro`` with ``quick``) with ``num_functions``
    functions, answering through all its CLS tokens (no per-sample ``task``)."""
    return get_config("ni_micro" if quick else "ni_digits", num_functions=num_functions, task_input=False)


def vit_config(c: NeuralInterpreterConfig, *, quick: bool = False) -> ViTConfig:
    """The ``vit_digits`` preset (NI Table 5: 3 heads × 64, MLP 192) at the NI's width, depth
    (``n_s · n_i · n_l`` layers), CLS tokens and embedding."""
    depth = c.num_scripts * c.num_iterations * c.num_locs
    over = {"num_heads": 2, "ffn_hidden": c.ffn_hidden, "pos_dim": c.pos_dim} if quick else {}
    return get_config("vit_digits", d_model=c.d_model, num_layers=depth, num_cls_tokens=c.num_cls_tokens,
                      num_classes=c.num_classes, task_input=False, tokenizer=c.tokenizer, **over)


# ----------------------------------------------------------------------------- the per-function loop

def _function_bias(bias: Tensor | None, u: int) -> Tensor | None:
    """Function ``u``'s positional bias: ``[U, H, N, N] → [1, H, N, N]``; a shared ``[H, N, N]`` as is."""
    return bias[u:u + 1] if bias is not None and bias.dim() == 4 else bias


def interpret_loop(self: Script, x: Tensor, codes: Tensor, C: Tensor, biases: Sequence[Tensor | None], *,
                   folds: Sequence[dict[str, Tensor]] | None = None, record: bool = False) -> tuple[Tensor, list]:
    """``Script.interpret`` (NI Eq. 9-11) one function at a time: for each ``u``, the LOC stack on
    ``x_u = x`` ``[B, 1, N, d]`` with code ``c_u`` (or, where the LOCs take folded weights, function
    ``u``'s slice ``[1, d_out, d_in]`` of each) and ``C_u·``, then ``Σ_u C_ui LOCs(x)_ui``; the same
    residual modes. Same submodules, same math, ``U`` passes instead of one."""
    folded = all(hasattr(loc, "folds") for loc in self.locs)     # LOC(x, folds, C, ...) rather than (x, code, C)
    if folded and folds is None:
        folds = [loc.folds(codes) for loc in self.locs]
    y = torch.zeros_like(x)
    for u in range(C.shape[1]):
        xs, cu = x.unsqueeze(1), C[:, u:u + 1]                                   # [B, 1, N, d] [B, 1, N]
        per_loc = ([{k: f[u:u + 1] for k, f in fold.items()} for fold in folds] if folded
                   else [codes[u:u + 1].unsqueeze(-2)] * len(self.locs))         # [1, d_out, d_in] or [1, 1, dc]
        for loc, bias, mod in zip(self.locs, biases, per_loc):
            xs, _ = loc(xs, mod, cu, eps=self.eps, bias=_function_bias(bias, u))
        y = y + cu.transpose(1, 2) * xs[:, 0]                                       # C_ui LOCs(x)_ui  [B, N, d]
    if self.residual == "identity":
        y = x + y
    elif self.residual == "update":
        y = y + (1 - C.sum(1)).unsqueeze(-1) * x
    return y, []


def set_loop(model: NeuralInterpreter, on: bool) -> None:
    """Swap the loop form into (or out of) every script of ``model``: one instance, same weights."""
    for script in model.scripts:
        if on:
            script.interpret = types.MethodType(interpret_loop, script)
        else:
            script.__dict__.pop("interpret", None)


# ----------------------------------------------------------------------------- timing helpers

def call(model: nn.Module, x: Tensor, *, train: bool, loop: bool | None = None,
         cast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
    """One timed call: an inference forward, or forward + backward of the summed logits (forward and
    loss under ``cast()``)."""
    def run() -> None:
        if loop is not None:
            set_loop(model, loop)
        model.train(train)
        if train:
            model.zero_grad(set_to_none=True)
            with cast():
                loss = model(x).float().sum()
            loss.backward()
        else:
            with torch.no_grad(), cast():
                model(x)
    return run


def images(c, batch: int, device: str = "cpu") -> Tensor:
    e = c.tokenizer
    return torch.randn(batch, e.in_channels, e.image_size, e.image_size).to(device)


def loop_vs_batched(model: NeuralInterpreter, batches: Sequence[int], repeats: int, train_batch: int,
                    run: Run = EAGER) -> float:
    c = model.config
    x = images(c, max(2, min(batches)), run.device)
    model.eval()
    with torch.no_grad():
        set_loop(model, False)
        batched = model(x)
        set_loop(model, True)
        looped = model(x)
        set_loop(model, False)
    flops = {}
    for loop in (False, True):
        set_loop(model, loop)
        flops[loop] = count_flops(lambda: model(x), grad=True) / len(x)
    set_loop(model, False)
    print(f"\n1. batched functions vs per-function loop (U = {c.num_functions}, {c.num_iterations} iterations)")
    print(f"  max |batched - loop| = {(batched - looped).abs().max().item():.2e} "
          f"(logits of magnitude {batched.abs().max().item():.2e})")
    print(f"  GFLOPs per sample: batched {flops[False] / 1e9:.4f}, loop {flops[True] / 1e9:.4f} "
          f"(loop / batched {flops[True] / flops[False]:.3f}: the same work)")
    print(f"  {'mode':<10} {'batch':>5} {'batched s':>10} {'loop s':>10} {'loop/batched':>13}")
    rows = [(False, b) for b in batches] + ([(True, train_batch)] if train_batch else [])
    at_main = None
    if run.compile:                      # one compiled module per form: a copy with the same weights loops
        looped_model = copy.deepcopy(model)
        set_loop(looped_model, True)
        forms = {"batched": (run.compiled(model), None), "loop": (run.compiled(looped_model), None)}
    else:                                # eager: the same instance, the form swapped in before each call
        forms = {"batched": (model, False), "loop": (model, True)}
    for train, b in rows:
        x = images(c, b, run.device)
        t = time_interleaved({name: call(m, x, train=train, loop=loop, cast=run.cast)
                              for name, (m, loop) in forms.items()}, iters=repeats, warmup=run.warmup)
        set_loop(model, False)
        r = t["loop"] / t["batched"]
        print(f"  {'train' if train else 'inference':<10} {b:>5} {t['batched']:>10.4f} {t['loop']:>10.4f} {r:>12.2f}x")
        if not train and b == batches[-1]:
            at_main = r
    return at_main


def ni_vs_vit(ni: NeuralInterpreter, vit: ViT, batch: int, repeats: int, run: Run = EAGER,
              quick: bool = False) -> None:
    x = images(ni.config, batch, run.device)
    # grad=True: under no_grad, FlopCounterMode's module tracker fails on a parameter passed as a
    # module input (the NI's positional tables e_row / e_col go through each function's ModLin)
    flops = {name: count_flops(lambda m=m: m.eval()(x[:1]), grad=True) for name, m in (("NI", ni), ("ViT", vit))}
    pn, pv = (sum(p.numel() for p in m.parameters()) for m in (ni, vit))
    print(f"\n2. NI (U = {ni.config.num_functions}) vs ViT of equal width {ni.config.d_model} and depth "
          f"{len(vit.blocks)}, batch {batch}")
    print(f"  parameters: NI {pn / 1e6:.3f}M, ViT {pv / 1e6:.3f}M; GFLOPs per sample: NI {flops['NI'] / 1e9:.3f}, "
          f"ViT {flops['ViT'] / 1e9:.3f} (NI / ViT {flops['NI'] / flops['ViT']:.2f})")
    print(f"  {'mode':<10} {'NI s':>9} {'ViT s':>9} {'NI time / ViT time':>19}")
    timed = {"NI": run.compiled(ni), "ViT": run.compiled(vit)}
    achieved = {}
    for train in (False, True):
        t = time_interleaved({n: call(m, x, train=train, cast=run.cast) for n, m in timed.items()},
                             iters=repeats, warmup=run.warmup)
        mode = "train" if train else "inference"
        print(f"  {mode:<10} {t['NI']:>9.4f} {t['ViT']:>9.4f} {t['NI'] / t['ViT']:>18.2f}x")
        for name, m in (("NI", ni), ("ViT", vit)):     # counted on the eager model, one sample, times the batch
            per_sample = flops[name] if not train else count_flops(call(m, x[:1], train=True), grad=True)
            achieved[mode, name] = per_sample * batch / t[name]
    peak, how = run.peak(quick)
    unit, scale = run.unit()
    print(f"  achieved, counted model FLOPs / median time (% of the {how}: {peak / scale:,.1f} {unit}):")
    for mode in ("inference", "train"):
        print(f"    {mode:<10} " + ", ".join(f"{name} {achieved[mode, name] / scale:,.2f} {unit} "
                                            f"({100 * achieved[mode, name] / peak:.1f}%)" for name in ("NI", "ViT")))


def function_sweep(counts: Sequence[int], batch: int, repeats: int, *, quick: bool, run: Run = EAGER) -> None:
    models = {}
    for u in counts:
        torch.manual_seed(0)
        models[u] = NeuralInterpreter(ni_config(u, quick=quick)).eval().to(run.device)
    x = images(models[counts[0]].config, batch, run.device)
    t = time_interleaved({u: call(run.compiled(m), x, train=False, cast=run.cast) for u, m in models.items()},
                         iters=repeats, warmup=run.warmup)
    print(f"\n3. NI inference time vs number of functions U, batch {batch}")
    print(f"  {'U':>4} {'s/forward':>10} {'vs U=1':>8} {'per function':>13}")
    for u in counts:
        print(f"  {u:>4} {t[u]:>10.4f} {t[u] / t[counts[0]]:>7.2f}x {t[u] / t[counts[0]] / u:>12.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny NI / ViT, few repeats (smoke test, < 10 s)")
    ap.add_argument("--batch", type=int, default=None, help="batch of sections 1-2 (default 32; 4 quick)")
    ap.add_argument("--sweep-batch", type=int, default=None, help="batch of section 3 (default 8; 2 quick)")
    ap.add_argument("--train-batch", type=int, default=None, help="section 1's train step batch (default 8; 0 skips)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per side (default 5; 2 quick)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    add_run_flags(ap)
    ap.add_argument("--sections", default="123", help="which sections to run, e.g. 2 or 12 (default 123)")
    args = ap.parse_args()
    if not set(args.sections) <= set("123") or not args.sections:
        ap.error(f"--sections takes digits from 1, 2, 3, got {args.sections!r}")
    run = Run.from_args(ap, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    q = args.quick
    batch = args.batch or (4 if q else 32)
    sweep_batch = args.sweep_batch or (2 if q else 8)
    train_batch = args.train_batch if args.train_batch is not None else (2 if q else 8)
    repeats = args.repeats or (2 if q else 5)
    malloc = {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, malloc settings {malloc or 'glibc defaults'}, "
          f"load average {os.getloadavg()[0]:.2f}, {run.describe()}")
    torch.manual_seed(0)
    ni = NeuralInterpreter(ni_config(quick=q)).to(run.device)
    batches = sorted({1, 8, batch}) if not q else [batch]
    r = loop_vs_batched(ni, batches, repeats, train_batch, run) if "1" in args.sections else None
    if "2" in args.sections:
        torch.manual_seed(0)
        ni_vs_vit(ni, ViT(vit_config(ni.config, quick=q)).to(run.device), batch, repeats, run, quick=q)
    if "3" in args.sections:
        function_sweep(FUNCTION_COUNTS[:3] if q else FUNCTION_COUNTS, sweep_batch, repeats, quick=q, run=run)
    if r is not None:
        verdict = "" if q else ("  PASS" if r >= TARGET_LOOP else "  FAIL")
        print(f"\nbatched-functions speed-up at U = {ni.config.num_functions}, batch {batch}, inference: {r:.2f}x "
              f"(target >= {TARGET_LOOP}x){verdict}")
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
