"""``--device``, ``--precision``, ``--compile``: one definition for the benchmark scripts that take them
(``bench_vit.py``, ``bench_nac.py``, ``bench_ni.py``, ``bench_ait.py``; each puts this directory on
``sys.path`` by being run from it)."""
from __future__ import annotations

import argparse
import contextlib
import torch

from modwire.analysis.flops import time_once


def add_run_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where every timed model runs (default cpu)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: torch.autocast(device, bfloat16) around every timed forward and loss (default fp32)")
    ap.add_argument("--compile", action="store_true", help="torch.compile every timed model (default mode) first")


def compile_static(fn):
    """``torch.compile(fn)`` in the default mode with static shapes: each batch size gets its own graph
    (compiled in the warm-up), none a dynamic one; the recompile limit is raised to hold them all."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(fn, dynamic=False)


class Run:
    """Where and how the timed models run: ``--device``, ``--precision``, ``--compile``."""

    def __init__(self, device: str = "cpu", precision: str = "fp32", compile: bool = False) -> None:
        self.device, self.precision, self.compile = device, precision, compile
        self.warmup = 3 if compile else 1        # compiled: the first calls compile (and may recompile once)

    @classmethod
    def from_args(cls, ap: argparse.ArgumentParser, args: argparse.Namespace) -> "Run":
        """The flags of :func:`add_run_flags`; ``--device cuda`` without a GPU is a usage error."""
        if args.device == "cuda" and not torch.cuda.is_available():
            ap.error("--device cuda asked for, but torch.cuda.is_available() is False "
                     f"(torch {torch.__version__}: no CUDA build or no visible GPU); run with --device cpu")
        return cls(args.device, args.precision, args.compile)

    def cast(self) -> contextlib.AbstractContextManager:
        """A fresh context per call: bf16 autocast on the device, or nothing."""
        if self.precision == "bf16":
            return torch.autocast(self.device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def compiled(self, fn):
        return compile_static(fn) if self.compile else fn

    def describe(self) -> str:
        """The flags for a header line."""
        where = f"cuda ({torch.cuda.get_device_name()})" if self.device == "cuda" else "cpu"
        return f"device {where}, {self.precision}, {'torch.compile' if self.compile else 'eager'}"

    def unit(self) -> tuple[str, float]:
        """The unit of achieved and peak rates: GFLOP/s on the CPU, TFLOP/s on a GPU."""
        return ("TFLOP/s", 1e12) if self.device == "cuda" else ("GFLOP/s", 1e9)

    def peak(self, quick: bool) -> tuple[float, str]:
        """The matmul peak in FLOP/s in this precision on this device, and how it was measured."""
        n, reps = ((4096, 5) if quick else (8192, 20)) if self.device == "cuda" else ((256, 3) if quick else (2048, 10))
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        a, b = (torch.randn(n, n, device=self.device, dtype=dtype) for _ in range(2))
        for _ in range(2):
            a @ b
        best = min(time_once(lambda: a @ b) for _ in range(reps))
        return 2 * n ** 3 / best, f"{self.precision} {n}x{n} GEMM, best of {reps}"


EAGER = Run()
