"""Training across processes: SIGKILL / SIGTERM + resume, SIGINT, the run lock, and 2-process DDP (gloo, CPU)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TOY_CLI = str(Path(__file__).resolve().parents[1] / "toy_cli.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def args(out, *extra):
    return ["train", "--set", f"out_dir={out}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
            "optim.lr=3e-3", "progress=false", "log_every=1", *extra]


def run(*a, **kw):
    return subprocess.run([sys.executable, TOY_CLI, *a], env=ENV, capture_output=True, text=True, timeout=300, **kw)


def last_step(out: Path) -> int:
    link = out / "checkpoints" / "last"
    return int(re.search(r"-(\d+)", os.readlink(link)).group(1)) if link.is_symlink() else -1


def start_and_wait_for_checkpoint(out, min_step, *extra):
    proc = subprocess.Popen([sys.executable, TOY_CLI, *args(out, *extra)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while last_step(out) < min_step:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.02)
    return proc


def weights(out):
    return load_file(str(out / "checkpoints" / "last" / "model.safetensors"))


COMMON = ("epochs=6", "checkpoint_every=2")  # 24 steps


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    ref = run(*args(out, *COMMON))
    assert ref.returncode == 0, ref.stderr
    return out


# SIGTERM in-process (cheaper) is in test_training.py; this one runs the real CLI process.
@pytest.mark.parametrize("signum", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_stopped_between_checkpoints_then_resumed_equals_uninterrupted(tmp_path, uninterrupted, signum):
    """SIGKILL: the last checkpoint survives. SIGTERM (a cluster scheduler's stop): a checkpoint
    of the last finished step is written and the process exits 143. Both resume bit-identically."""
    out = tmp_path / "stopped"
    proc = start_and_wait_for_checkpoint(out, 4, *COMMON, "data.params.delay=0.004")
    time.sleep(0.05)
    proc.send_signal(signum)
    proc.wait(timeout=60)
    assert proc.returncode == (-9 if signum == signal.SIGKILL else 143)
    stopped_at = last_step(out)
    assert 4 <= stopped_at < 24, "the signal landed mid-run"
    if signum == signal.SIGKILL:    # the config form ...
        resumed = run(*args(out, *COMMON, "data.params.delay=0.004"), "--resume")
    else:                           # ... and the run-directory form (the run's own config.yaml)
        resumed = run("train", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["step"] == 24
    a, b = weights(uninterrupted), weights(out)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not any(p.name.endswith(".tmp") for p in (out / "checkpoints").iterdir())


def test_second_run_on_a_directory_refuses_and_sigint_saves_and_exits_130(tmp_path):
    out = tmp_path / "run"
    proc = start_and_wait_for_checkpoint(out, 2, "epochs=50", "checkpoint_every=2", "data.params.delay=0.004")
    second = run(*args(out, "epochs=50", "checkpoint_every=2", "data.params.delay=0.004"), "--resume")
    assert second.returncode == 1
    assert f"is in use by another run (pid={proc.pid} host=" in second.stderr
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["status"] == "interrupted" and last_step(out) == result["step"] >= 2


def one_and_two_processes(tmp_path, common, port: int) -> None:
    """The same config trained by one process (``tmp_path/one``) and by torchrun with two (``two``)."""
    single = run(*args(tmp_path / "one", *common))
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(port), TOY_CLI, *args(tmp_path / "two", *common)],
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]


def first_loss(out):
    return next(json.loads(l)["loss"] for l in (out / "metrics.jsonl").read_text().splitlines() if "loss" in l)


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_two_process_ddp_step_equals_single_process(tmp_path):
    common = ("max_steps=1", "optim.name=sgd", "optim.grad_clip=0", "model.overrides.kernel.train_mode=expected")
    one_and_two_processes(tmp_path, common, 29533)
    assert first_loss(tmp_path / "two") == pytest.approx(first_loss(tmp_path / "one"), rel=1e-5)
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5, msg=k)


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.parametrize("option", ["precision=bf16", "compile=true"])
def test_two_process_ddp_with_bf16_or_compile_equals_one_process(tmp_path, option):
    """Issue 25: the trainer's precision and compile options work under torchrun (2 CPU processes, gloo):
    the first step's loss and the weights after it match one process with the same option."""
    common = ("max_steps=1", "optim.name=sgd", "optim.grad_clip=0", "model.name=vit_micro", option)
    one_and_two_processes(tmp_path, common, 29534)
    tol = 2e-2 if option == "precision=bf16" else 1e-5        # bf16: two half-batches rounded apart
    assert first_loss(tmp_path / "two") == pytest.approx(first_loss(tmp_path / "one"), rel=tol)
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-3 if option == "precision=bf16" else 1e-6, rtol=1e-3, msg=k)
