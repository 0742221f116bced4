"""NAC speed benchmarks: the factorized read-in, and NAC vs Perceiver IO throughput.

Run ``python benchmarks/bench_nac.py`` (a few minutes on 2 CPU cores) or with
``--quick`` (tiny sizes, < 20 s, a smoke test: its ratios mean nothing). Every
claim is a ratio of two timings taken in the same run, because absolute times on
a shared CPU are noisy; the matmul peak puts the absolute numbers in context.

Sections:

1. **Machine.** torch version, thread count, and the fp32 matmul peak of this
   machine (best of ten 2048×2048 products after warm-up), in GFLOP/s. It is
   measured again next to section 3 and the better value is used for "% peak".

2. **Read-in: factorized vs literal (NAC Eq. 4-5).** In the NAC read-in every
   processor module ``u`` attends to the input tokens with keys and values
   conditioned on its *own* code: ``k_uj = ModFC(x_j, c_u)``. Written literally
   that is ``B·U·N`` ModFC rows (keys and values of shape ``[B, U, N, d]``);
   because ModFC is linear in ``x`` it can be folded into the queries and the
   value projection instead (``method="factorized"``, see
   ``modwire.nn.attention``), which costs about as much as an ordinary
   cross-attention. We time the forward of one ``ModulatedAttention`` with
   ``kv_code="receiver"`` at NAC Table 4 dimensions (d_model 384, 320 processor
   modules, 64 tokens of width 384 = 320 conv channels + 64 positions, 1 head,
   d_code 384) under both methods on the same inputs, report the speed-up and
   the max abs difference of the outputs (they are equal up to rounding), and
   the same for forward+backward. For context the whole ``ReadIn`` block
   (attention + ModFFN, which both methods share) is timed too.
   Acceptance: literal / factorized >= 30x (attention forward).

3. **NAC vs Perceiver IO (NAC Table 4).** Inference forward throughput of
   ``nac_tiny_imagenet`` and its baseline ``perceiver_io_tiny_imagenet`` on
   ``[B, 3, 64, 64]`` images. The two models are timed interleaved
   (A, B, A, B, ...) and the median per model is kept, so slow phases of the
   machine hit both. FLOPs of one forward are counted with
   ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and
   attention only; elementwise work such as the ModFC modulation and LayerNorm
   is not counted, so "GFLOP/s achieved" is a lower bound of the work done).
   FlopCounterMode has no formula for the CPU fused attention kernel
   (``aten._scaled_dot_product_flash_attention_for_cpu``);
   ``modwire.analysis.flops.count_flops`` adds one.
   A train-mode forward+backward ratio (NAC samples a fresh kernel per layer and
   example in train mode) is printed as well, at ``--train-batch``.
   Acceptance: NAC / PIO inference throughput >= 0.8.

   The "faults/fwd" column counts minor page faults per forward: on CPU every
   large temporary that glibc malloc serves with a fresh ``mmap`` is
   page-faulted in again on first touch, which can cost as much as the matmuls.
   Section 1 prints the ``MALLOC_*``/``LD_PRELOAD`` settings in effect for that
   reason (e.g. ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large>`` keeps freed
   memory for reuse), and the load average, since other work on a 2-core
   machine skews every timing.

Device, precision, compile (issue 25), for every section and both sides of each comparison:
``--device cuda`` moves modules and inputs to the GPU (refused when CUDA is not available;
every timed call is synchronised; page faults print "n/a", the CPU-use line is left out, and
the peak is measured with an 8192×8192 GEMM on the device, rates in TFLOP/s).
``--precision bf16`` runs forwards and losses under ``torch.autocast(device, bfloat16)``
(backwards outside it, as PyTorch recommends) and measures the *bf16* matmul peak for
"% peak". ``--compile`` wraps the timed modules in ``torch.compile`` (default mode, static
shapes: one graph per batch size), compiled by three untimed warm-up calls each before the
interleaved timing. FLOPs are counted on the eager modules and the agreement check of section 2
runs eager in fp32.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from typing import Callable

import torch

import modwire
from modwire.nn import ModulationSpec, ReadIn
from modwire.analysis.flops import count_flops  # FlopCounterMode + a CPU SDPA formula
from runflags import Run, add_run_flags

READIN_TARGET = 30.0   # literal / factorized, attention forward
THROUGHPUT_TARGET = 0.8  # NAC / PIO images per second, inference


# ---------------------------------------------------------------------------- measuring helpers

def minor_faults() -> int:
    """Minor page faults of this process so far (first touches of freshly mapped memory)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def process_cpu() -> float:
    """User + system CPU seconds of this process (all threads)."""
    t = os.times()
    return t.user + t.system


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_once(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call (CUDA synchronised before and after)."""
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - start


def time_interleaved(fns: dict[str, Callable[[], object]], iters: int, warmup: int = 1,
                     faults: dict[str, float] | None = None) -> dict[str, float]:
    """Median seconds per call of each function, timed round-robin (A, B, A, B, ...)
    so that slow phases of a shared machine hit all of them alike. If ``faults`` is
    given, it receives the median minor page faults per call of each function."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    flts: dict[str, list[int]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            f0 = minor_faults()
            times[name].append(time_once(fn))
            flts[name].append(minor_faults() - f0)
    if faults is not None:
        faults.update({name: statistics.median(f) for name, f in flts.items()})
    return {name: statistics.median(t) for name, t in times.items()}


def matmul_peak(n: int, reps: int, device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """GFLOP/s of an ``n×n @ n×n`` product in ``dtype`` on ``device``: best of ``reps`` after two warm-ups."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(2):
        a @ b
    best = min(time_once(lambda: a @ b) for _ in range(reps))
    return 2 * n ** 3 / best / 1e9


# ---------------------------------------------------------------------------- device, precision, compile













def warmups(args: argparse.Namespace) -> str:
    return f"{args.warmup} warm-up" + ("s" if args.warmup > 1 else "")




def verdict(value: float, target: float, quick: bool) -> str:
    if quick:
        return f"target >= {target:g} (not checked with --quick)"
    return f"target >= {target:g}: {'PASS' if value >= target else 'FAIL'}"


# ---------------------------------------------------------------------------- sections

def peak_size(args) -> tuple[int, int]:
    if args.device == "cuda":
        return (4096, 5) if args.quick else (8192, 20)
    return (256, 3) if args.quick else (2048, 10)


def peak(args) -> float:
    """The matmul peak in FLOP/s for the chosen device and precision."""
    n, reps = peak_size(args)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    return matmul_peak(n, reps, args.device, dtype) * 1e9


def section_machine(args) -> float:
    n, reps = peak_size(args)
    unit, scale = args.run.unit()
    best = peak(args)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"python {sys.version.split()[0]}, {args.run.describe()}")
    alloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "LD_PRELOAD"}
    print(f"allocator settings: {alloc or 'glibc malloc defaults'}; "
          f"load average (1 min) {os.getloadavg()[0]:.2f} (other work on the machine skews timings)")
    print(f"{args.precision} matmul peak ({n}x{n} @ {n}x{n}, best of {reps}): {best / scale:,.1f} {unit}")
    return best


def section_read_in(args) -> None:
    # NAC Table 4: d_model 384, U_p 320, 8x8 = 64 tokens of 320 + 64 = 384, 1 read-in head, d_code 384.
    dim, modules, tokens, token_dim, code_dim, hidden = (
        (32, 24, 16, 32, 32, 64) if args.quick else (384, 320, 64, 384, 384, 1536))
    b, iters = args.readin_batch, args.iters
    torch.manual_seed(0)
    block = ReadIn(dim, token_dim, 1, hidden, mod=ModulationSpec("nac", code_dim))
    attn = block.attn.fn  # ModulatedAttention(dim, 1, kv_dim=token_dim, kv_code="receiver")
    states = torch.randn(modules, dim)            # batch-free, like θ⁰
    x = torch.randn(b, tokens, token_dim)
    codes = torch.randn(modules, code_dim)
    block, states, x, codes = (t.to(args.device) for t in (block, states, x, codes))
    cast = args.run.cast
    run = {False: (attn, block), True: (args.run.compiled(attn), args.run.compiled(block))}  # timed: True
    print(f"B={b}, U={modules} modules of width {dim}, N={tokens} tokens of width {token_dim}, "
          f"1 head, d_code {code_dim}; median of {iters} after {warmups(args)}")

    def attn_fwd(method, timed=False):
        a = run[timed][0]

        def fwd():
            with cast():
                return a(states, x, code_q=codes, method=method)[0]
        return fwd

    def block_fwd(method, timed=False):
        blk = run[timed][1]

        def fwd():
            with cast():
                return blk(states, x, codes=codes, method=method)[0]
        return fwd

    def attn_fwd_bwd(method, timed=False):
        a = run[timed][0]

        def fwd_bwd():
            attn.zero_grad(set_to_none=True)
            with cast():
                loss = a(states, x, code_q=codes, method=method)[0].float().square().mean()
            loss.backward()
        return fwd_bwd

    with torch.inference_mode():
        out = {m: attn(states, x, code_q=codes, method=m)[0] for m in ("factorized", "literal")}   # eager, fp32
    err = (out["factorized"] - out["literal"]).abs().max().item()
    scale = out["literal"].abs().max().item()

    rows = [("attention forward", attn_fwd, False),              # (what, fn maker, needs grad)
            ("attention forward+backward", attn_fwd_bwd, True),
            ("ReadIn block forward (attn+ModFFN)", block_fwd, False)]
    print(f"{'':<36}{'factorized':>12}{'literal':>12}{'GFLOP f':>10}{'GFLOP l':>10}{'literal/fact':>14}")
    ratios = {}
    for what, make, grad in rows:
        ctx = torch.enable_grad if grad else torch.inference_mode
        with ctx():
            # interleave the two methods so noise hits both alike
            t = time_interleaved({m: make(m, timed=True) for m in ("factorized", "literal")}, iters,
                                 warmup=args.warmup)
        flops = {m: count_flops(make(m), grad) for m in ("factorized", "literal")}
        ratio = t["literal"] / t["factorized"]
        ratios[what] = ratio
        print(f"{what:<36}{t['factorized'] * 1e3:>10.1f}ms{t['literal'] * 1e3:>10.1f}ms"
              f"{flops['factorized'] / 1e9:>10.2f}{flops['literal'] / 1e9:>10.2f}{ratio:>13.1f}x")
    print(f"max |factorized - literal| = {err:.2e} (max |output| = {scale:.2e})")
    print(f"read-in speed-up (attention forward): {ratios['attention forward']:.1f}x   "
          f"{verdict(ratios['attention forward'], READIN_TARGET, args.quick)}")


def section_models(args) -> None:
    names = (("nac_small", "perceiver_io_small") if args.quick
             else ("nac_tiny_imagenet", "perceiver_io_tiny_imagenet"))
    torch.manual_seed(0)
    models = {n: modwire.create_model(n).eval() for n in names}
    c = models[names[0]].config
    x = torch.randn(args.batch, c.tokenizer.in_channels, c.tokenizer.image_size, c.tokenizer.image_size)
    models = {n: m.to(args.device) for n, m in models.items()}
    x = x.to(args.device)
    timed = {n: args.run.compiled(m) for n, m in models.items()}
    cast = args.run.cast
    unit, scale = args.run.unit()
    cuda = args.device == "cuda"

    def forward(m):
        def fwd():
            with cast():
                return m(x)
        return fwd
    print(f"inference forward, eval mode, torch.inference_mode, images {list(x.shape)}; "
          f"interleaved, median of {args.iters} after {warmups(args)}")
    with torch.inference_mode():
        fns = {n: forward(m) for n, m in timed.items()}
        faults: dict[str, float] = {}
        cpu0, wall0 = process_cpu(), time.perf_counter()
        t = time_interleaved(fns, args.iters, warmup=args.warmup, faults=faults)
        cpu_use = (process_cpu() - cpu0) / (time.perf_counter() - wall0)
    flops = {n: count_flops(lambda m=m: m(x)) for n, m in models.items()}   # eager: the same FLOPs
    # The CPU speed of a shared VM drifts over minutes: re-measure the peak next to the
    # models and take the better of the two, so that "% peak" is not flattered.
    again = peak(args)
    best = max(args.peak, again)
    print(f"matmul peak re-measured: {again / scale:,.1f} {unit}; % peak below is of {best / scale:,.1f} {unit}"
          + (f" ({args.precision})" if args.precision != "fp32" or cuda else ""))
    print(f"{'model':<30}{'params':>13}{'GFLOP/fwd':>11}{'s/fwd':>9}{'img/s':>9}{unit:>10}{'% peak':>8}"
          f"{'faults/fwd':>12}")
    rates = {}
    for n in names:
        rates[n] = args.batch / t[n]
        achieved = flops[n] / t[n]
        fault = "n/a" if cuda else f"{faults[n]:,.0f}"      # page faults: host memory only
        print(f"{n:<30}{models[n].num_parameters():>13,}{flops[n] / 1e9:>11.1f}{t[n]:>9.2f}"
              f"{rates[n]:>9.2f}{achieved / scale:>10.1f}{100 * achieved / best:>7.1f}%{fault:>12}")
    if not cuda:
        print(f"CPU use of this process while timing: {cpu_use:.2f} of {torch.get_num_threads()} threads "
              f"(clearly less means other work competed for the cores)")
    nac, pio = names
    ratio = rates[nac] / rates[pio]
    print(f"throughput NAC / PIO (inference): {ratio:.2f}   {verdict(ratio, THROUGHPUT_TARGET, args.quick)}")
    print(f"FLOP ratio NAC / PIO: {flops[nac] / flops[pio]:.3f} (counted ops only)")

    if args.train_batch <= 0:
        return
    xt = torch.randn(args.train_batch, *x.shape[1:]).to(args.device)
    for m in models.values():
        m.train()

    def fwd_bwd(n):
        def run():
            models[n].zero_grad(set_to_none=True)
            with cast():
                loss = timed[n](xt).float().logsumexp(dim=-1).mean()
            loss.backward()
        return run

    tt = time_interleaved({n: fwd_bwd(n) for n in names}, args.iters, warmup=args.warmup)
    print(f"train mode forward+backward (kernel sampling on), batch {args.train_batch}: "
          + ", ".join(f"{n} {args.train_batch / tt[n]:.2f} img/s" for n in names)
          + f"; NAC / PIO {tt[pio] / tt[nac]:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64, help="images per forward, NAC vs PIO (default 64)")
    ap.add_argument("--readin-batch", type=int, default=8, help="batch of the read-in comparison (default 8)")
    ap.add_argument("--train-batch", type=int, default=16,
                    help="batch of the train-mode forward+backward comparison; 0 skips it (default 16)")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per measurement (default 3)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes (nac_small/perceiver_io_small, small read-in); a smoke test, < 20 s")
    add_run_flags(ap)
    args = ap.parse_args(argv)
    args.run = Run.from_args(ap, args)
    args.warmup = args.run.warmup
    if args.quick:  # shrink whatever was left at its default
        for name, small in (("batch", 4), ("readin_batch", 2), ("train_batch", 2), ("iters", 1)):
            if getattr(args, name) == ap.get_default(name):
                setattr(args, name, small)
    for name in ("batch", "readin_batch", "iters"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")

    print("== 1. machine ".ljust(100, "="))
    args.peak = section_machine(args)
    dims = "tiny --quick sizes" if args.quick else "NAC Table 4 dimensions"
    print(f"== 2. read-in, factorized vs literal (NAC Eq. 4-5), {dims} ".ljust(100, "="))
    section_read_in(args)
    print(f"== 3. NAC vs Perceiver IO, {dims} ".ljust(100, "="))
    section_models(args)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
