"""The hermetic guard (tests/hermetic.py) itself: during the run a loader's default root finds nothing,
a read of the machine's datasets is refused, and a deliberately non-hermetic test fails."""
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import hermetic
import pytest

from modwire import demo
from modwire.tasks import build_dataset
from modwire.tasks.loaders.mnist import debian_fashion_mnist

ROOT = Path(__file__).resolve().parents[1]


def test_a_loader_with_a_default_root_finds_nothing(monkeypatch):
    empty = Path(os.environ["MODWIRE_SYSTEM_DATASETS"])
    assert empty.is_dir() and not any(empty.iterdir()) and hermetic.STATE.base in empty.parents
    assert debian_fashion_mnist() == empty / "fashion-mnist"
    with pytest.raises(ValueError, match=r"root=\.\.\. is required"):    # even where Debian's package is installed
        build_dataset("fashion_mnist", "test")
    assert demo.pick_data("auto").task == "digits"
    for name in ("XDG_CACHE_HOME", "TORCH_HOME", "SCIKIT_LEARN_DATA", "HF_HOME", "MPLCONFIGDIR", "TMPDIR"):
        assert hermetic.STATE.base in Path(os.environ[name]).parents
    assert hermetic.STATE.base in Path(tempfile.gettempdir()).parents
    monkeypatch.delenv("MODWIRE_SYSTEM_DATASETS")                        # outside the test run: Debian's path
    assert debian_fashion_mnist() == Path("/usr/share/datasets/fashion-mnist")


def test_a_read_of_the_machines_datasets_or_caches_is_refused():
    assert "/usr/share/datasets/" in hermetic.STATE.forbidden
    home_cache = os.path.join(os.path.expanduser("~"), ".cache", "torch", "hub", "weights.pth")
    with hermetic.expect_violation() as caught:
        with pytest.raises(hermetic.HermeticError, match="fashion-mnist"):
            open("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", "rb")
        with pytest.raises(hermetic.HermeticError):
            os.listdir("/usr/share/datasets")
        with pytest.raises(hermetic.HermeticError, match="weights.pth"):
            Path(home_cache).read_bytes()
    assert len(caught) == 3 and all("reads data from outside the repository" in c for c in caught)
    assert hermetic.forbidden_roots({"HOME": "/home/u", "MODWIRE_SYSTEM_DATASETS": "/data/sets"}) == (
        "/data/sets/", "/home/u/.cache/", "/home/u/.keras/", "/home/u/.torch/", "/home/u/scikit_learn_data/",
        "/usr/share/datasets/")


NON_HERMETIC = '''
import os
from pathlib import Path

from modwire.tasks import build_dataset

def test_reads_debians_fashion_mnist():
    Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz").read_bytes()

def test_catches_the_refusal_and_goes_on():
    try:
        open("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", "rb")
    except Exception:
        pass

def test_relies_on_a_default_root():
    assert len(build_dataset("fashion_mnist", "test")) == 10_000

def test_leaves_a_run_directory_in_the_repository():
    Path(LEFT).write_text("state for the next run")

def test_hermetic(tmp_path):
    (tmp_path / "x").write_text("fine")
'''


def test_the_guard_fails_a_deliberately_non_hermetic_test(tmp_path):
    left = ROOT / f".hermetic-selftest-{os.getpid()}"
    test_file = tmp_path / "test_non_hermetic.py"
    test_file.write_text(textwrap.dedent(NON_HERMETIC).replace("LEFT", repr(str(left))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), str(ROOT / "src"),
                                                                       os.environ.get("PYTHONPATH")]))}
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "hermetic", "-p", "no:cacheprovider",
                              str(test_file)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        left.unlink(missing_ok=True)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert re.search(r"\b3 failed, 2 passed\b", out), out
    assert "FAILED test_non_hermetic.py::test_reads_debians_fashion_mnist" in out
    assert "FAILED test_non_hermetic.py::test_catches_the_refusal_and_goes_on" in out     # though it caught it
    assert "FAILED test_non_hermetic.py::test_relies_on_a_default_root" in out and "root=... is required" in out
    assert "hermetic test run: open '/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz'" in out
    assert f"left 1 new file(s) in the repository (write to tmp_path): {left.name}" in out


MACHINE_PATHS = re.compile(r"/usr/share/datasets|Path\.home\(|expanduser\(['\"]~|['\"]/tmp/|scikit_learn_data")


def test_no_test_benchmark_or_experiment_names_a_machine_path():
    """The guard's run-time refusal, before run time: a literal path to the machine's data or temporary
    directory in a test, benchmark or experiment (the guard and this test name them to refuse them)."""
    files = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("src/modwire/experiments/*.py")]
    mine = {ROOT / "tests" / "hermetic.py", Path(__file__).resolve()}
    found = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}" for f in files if f not in mine
             for i, line in enumerate(f.read_text().splitlines(), 1) if MACHINE_PATHS.search(line)]
    assert not found, "\n".join(found)
