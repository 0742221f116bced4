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
