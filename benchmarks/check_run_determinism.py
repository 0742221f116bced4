"""Are two training runs of the same data bit-identical on this device, and do loader workers change a
run beyond that? (Issue 39: the worker tests of ``tests/training/test_loader_defaults.py`` compare runs
bit for bit; on an H200 their runs took the CUDA device and two of them failed, with no log kept.)

    PYTHONPATH=src python benchmarks/check_run_determinism.py [--device cuda] [--deterministic] [--quick]
        [--out FILE.json]

Per case (the tests' runs: ``nac_micro`` on ``toy_sets``; ``preact_resnet_micro`` on ``triangle`` with
``crop_flip``; batch 16, two epochs) three runs: no workers, no workers again, 2 workers. Prints max
|Δ weight| of *again − first* (the device's own run-to-run difference: the data are the same) and of
*workers − first*. Workers changed the data only if the second is non-zero where the first is zero.

``--deterministic``: ``torch.use_deterministic_algorithms(True, warn_only=True)`` (and
``CUBLAS_WORKSPACE_CONFIG=:4096:8``, set before CUDA starts): the runs then use deterministic kernels
where torch has them, and the ops without one are listed (torch's warnings).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
CASES = {"nac_micro/toy_sets": ["model.name=nac_micro", "data.task=toy_sets"],
         "preact_resnet_micro/triangle+crop_flip": ["model.name=preact_resnet_micro", "data.task=triangle",
                                                    "data.params={size: {train: 48, val: 16}}",
                                                    "data.augment=crop_flip"]}
RUNS = {"first": 0, "again": 0, "workers": 2}       # run name: data.num_workers


def max_diff(a: dict, b: dict) -> float:
    return max((x.double() - y.double()).abs().max().item() if x.numel() else 0.0
               for x, y in zip(a.values(), b.values()))


def run_case(overrides: list[str], device: str, epochs: int, out: Path) -> tuple[dict, list[str]]:
    """``{"again": max |Δ|, "workers": max |Δ|}`` against the first run, and torch's nondeterminism warnings."""
    import toy_task  # noqa: F401  (registers "toy_sets")
    from modwire.training import load_config, train

    weights = {}
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(io.StringIO()):  # run headers
        warnings.simplefilter("always")
        for name, workers in RUNS.items():
            cfg = load_config(None, [f"out_dir={out / name}", *overrides, "data.batch_size=16", f"epochs={epochs}",
                                     f"device={device}", f"data.num_workers={workers}", "progress=false"])
            weights[name] = train(cfg)["model"].state_dict()
    ops = sorted({str(w.message)[:120] for w in caught if "deterministic" in str(w.message)})
    return {name: max_diff(weights["first"], weights[name]) for name in ("again", "workers")}, ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--deterministic", action="store_true", help="torch's deterministic kernels (warn_only)")
    ap.add_argument("--quick", action="store_true", help="the first case, one epoch (smoke test)")
    ap.add_argument("--out", help="also write the rows as JSON here (with the machine)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here")
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")    # read when cuBLAS starts: before any run
        torch.use_deterministic_algorithms(True, warn_only=True)
    cases, epochs = (dict(list(CASES.items())[:1]), 1) if args.quick else (CASES, 2)
    rows = []
    print(f"device {args.device}, deterministic {args.deterministic}, torch {torch.__version__}")
    print(f"{'case':<40} {'max |again - first|':>20} {'max |workers - first|':>22}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (case, overrides) in enumerate(cases.items()):
            diffs, ops = run_case(overrides, args.device, epochs, Path(tmp) / str(i))
            rows.append({"case": case, "max_abs_again": diffs["again"], "max_abs_workers": diffs["workers"],
                         "nondeterministic_ops": ops})
            print(f"{case:<40} {diffs['again']:>20.3g} {diffs['workers']:>22.3g}")
            for op in ops:
                print(f"  no deterministic kernel: {op}")
    if args.out:
        from modwire.analysis.study import machine, write_json_atomic

        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        where = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                 "cudnn": torch.backends.cudnn.version(), "threads": torch.get_num_threads(),
                 "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                 "commit": commit}
        write_json_atomic(Path(args.out), {"machine": {**machine(), **where},
                                           "deterministic": args.deterministic, "epochs": epochs, "rows": rows})


if __name__ == "__main__":
    main()
