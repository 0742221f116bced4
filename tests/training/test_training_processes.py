"""Training across processes: SIGKILL + resume, SIGINT, and 2-process DDP (gloo, CPU)."""
import json
import os
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
    return int(os.readlink(link).rsplit("-", 1)[1]) if link.is_symlink() else -1


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


def test_sigkill_between_checkpoints_then_resume_equals_uninterrupted(tmp_path):
    common = ("epochs=6", "checkpoint_every=2")  # 24 steps
    ref = run(*args(tmp_path / "ref", *common))
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "killed"
    proc = start_and_wait_for_checkpoint(out, 4, *common, "data.params.delay=0.004")
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = last_step(out)
    assert 4 <= killed_at < 24, "the kill landed mid-run"
    resumed = run(*args(out, *common), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["step"] == 24
    a, b = weights(tmp_path / "ref"), weights(out)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not any(p.name.endswith(".tmp") for p in (out / "checkpoints").iterdir())


def test_sigint_saves_a_checkpoint_and_exits_130(tmp_path):
    out = tmp_path / "run"
    proc = start_and_wait_for_checkpoint(out, 2, "epochs=50", "checkpoint_every=2", "data.params.delay=0.004")
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["status"] == "interrupted" and last_step(out) == result["step"] >= 2


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_two_process_ddp_step_equals_single_process(tmp_path):
    common = ("max_steps=1", "optim.name=sgd", "optim.grad_clip=0", "model.overrides.kernel_train_mode=expected")
    single = run(*args(tmp_path / "one", *common))
    assert single.returncode == 0, single.stderr
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", "29533", TOY_CLI, *args(tmp_path / "two", *common)],
                         env=ENV, capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]

    def first_loss(out):
        return next(json.loads(l)["loss"] for l in (out / "metrics.jsonl").read_text().splitlines() if "loss" in l)

    assert first_loss(tmp_path / "two") == pytest.approx(first_loss(tmp_path / "one"), rel=1e-5)
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5, msg=k)
