"""The benchmark scripts stay runnable (tiny sizes; their ratios are not checked here:
speed targets live in the benchmarks, not in timed unit tests)."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_nac_quick_runs_and_reports_every_section():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nac.py"), "--quick"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert re.search(r"fp32 matmul peak .*: [\d,.]+ GFLOP/s", out)
    err = float(re.search(r"max \|factorized - literal\| = ([\d.e+-]+)", out).group(1))
    assert err < 1e-4  # the two read-in methods agree
    assert re.search(r"read-in speed-up \(attention forward\): [\d.]+x", out)
    assert re.search(r"throughput NAC / PIO \(inference\): [\d.]+", out)


def test_bench_block_sparse_quick_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_block_sparse.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    diffs = [float(d) for d in re.findall(r"x +([\d.e+-]+) +\(built in", out)]
    assert len(diffs) == 12 and max(diffs) < 1e-5  # block-sparse == dense masked attention
    assert re.search(r"attention speed-up at 90% removed, block \d+: [\d.]+x", out)
    assert "whole ProcessorLayer" in out


def test_bench_graph_quick_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_graph.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    diff = float(re.search(r"max \|difference\| \(float64\) ([\d.e+-]+)", out).group(1))
    assert diff < 1e-9  # matmul Eq. 9 == literal Eq. 9
    assert re.search(r"slowest match at U=\d+: [\d.]+ s", out)


def test_bench_sparsify_quick_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sparsify.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r"NAC speed-up at 87.5% modules dropped: [\d.]+x", out)
    assert re.search(r"Perceiver IO speed-up at 87.5% latents dropped: [\d.]+x", out)


def test_bench_startup_runs_and_prints_a_row_per_preset():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_startup.py"), "--presets", "*micro",
                          "--repeat", "1"], capture_output=True, text=True, timeout=120, check=True).stdout
    rows = re.findall(r"^(\w+) +[\d.]+M +[\d.]+s +[\d.]+s +[\d.]+x +[\d.]+s +[\d.]+s$", out, flags=re.M)
    assert rows == ["nac_conditional_micro", "nac_micro", "perceiver_io_micro"]


def test_bench_input_checks_runs_and_reports_the_ratio():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_input_checks.py"), "--pairs", "2",
                          "--batch", "2"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r"with / without checks \(median of 2 interleaved pairs\): [\d.]+", out)
    assert re.search(r"check_input alone: \d+ us = [\d.]+% of a forward", out)
