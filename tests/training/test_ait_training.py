"""Training and evaluating an Associative Transformer through the CLI: the balance loss is
logged by name, the workspace memory survives SIGKILL + resume bit-exactly, ``modwire eval``
gives the same metrics twice and leaves the checkpoint's memory unchanged, and the trainer
redraws the memory at each epoch's start for Table 2's "reset memory"."""
import hashlib
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
COMMON = ("epochs=6", "checkpoint_every=2")  # 4 steps per epoch, 24 in all


def args(out, *extra):
    return ["train", "--set", f"out_dir={out}", "model.name=ait_micro", "data.task=toy_sets", "data.batch_size=16",
            "optim.lr=3e-3", "aux_loss_weights.balance=0.01", "progress=false", "log_every=1", *extra]


def run(*a):
    return subprocess.run([sys.executable, TOY_CLI, *a], env=ENV, capture_output=True, text=True, timeout=300)


def last_step(out: Path) -> int:
    link = out / "checkpoints" / "last"
    return int(re.search(r"-(\d+)", os.readlink(link)).group(1)) if link.is_symlink() else -1


def memories(out: Path) -> dict[str, torch.Tensor]:
    state = load_file(str(out / "checkpoints" / "last" / "model.safetensors"))
    return {k: v for k, v in state.items() if k.endswith("workspace.memory")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("ait_ref")
    ref = run(*args(out, *COMMON))
    assert ref.returncode == 0, ref.stderr
    return out


def test_training_logs_the_balance_loss_by_name_and_writes_the_memory(uninterrupted):
    records = [json.loads(line) for line in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    balance = [r["aux/balance"] for r in records if "aux/balance" in r]
    assert len(balance) == 24 and all(v > 0 for v in balance)
    mem = memories(uninterrupted)
    assert len(mem) == 2
    torch.manual_seed(0)
    for v in mem.values():                                   # written by Eq. 4: unit-norm slots, not the init
        torch.testing.assert_close(v.norm(dim=-1), torch.ones(v.shape[0]))


def test_sigkill_then_resume_restores_weights_and_memory_bit_exactly(tmp_path, uninterrupted):
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, TOY_CLI, *args(out, *COMMON, "data.params.delay=0.004")], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while last_step(out) < 4:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.02)
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert 4 <= last_step(out) < 24, "the kill landed mid-run"
    resumed = run(*args(out, *COMMON, "data.params.delay=0.004"), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    a = load_file(str(uninterrupted / "checkpoints" / "last" / "model.safetensors"))
    b = load_file(str(out / "checkpoints" / "last" / "model.safetensors"))
    assert any(k.endswith("workspace.memory") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_eval_twice_gives_the_same_metrics_and_leaves_the_memory_unchanged(uninterrupted):
    ckpt = uninterrupted / "checkpoints" / "best" / "model.safetensors"
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    first, second = run("eval", str(uninterrupted)), run("eval", str(uninterrupted))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    m1, m2 = json.loads(first.stdout.strip().splitlines()[-1]), json.loads(second.stdout.strip().splitlines()[-1])
    assert m1 == m2 and "top1" in m1 and "loss" in m1
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == digest
    # Tables 7-8: the same checkpoint without the memory forward (Figure 8 (2)); other model keys refused
    frozen = run("eval", str(uninterrupted), "--set", "model.overrides.eval_memory_forward=false")
    assert frozen.returncode == 0, frozen.stderr
    m3 = json.loads(frozen.stdout.strip().splitlines()[-1])
    assert m3["samples"] == m1["samples"] and m3["loss"] != m1["loss"]
    refused = run("eval", str(uninterrupted), "--set", "model.overrides.num_slots=4")
    assert refused.returncode != 0 and "evaluation options" in refused.stderr and "eval_memory_forward" in refused.stderr


def test_reset_memory_redraws_the_memory_when_each_epoch_starts_and_not_on_a_mid_epoch_resume(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(TOY_CLI).parent))
    import toy_task  # noqa: F401

    from modwire.models.ait import AiT
    from modwire.training import load_config, train

    calls = []
    real = AiT.start_epoch
    monkeypatch.setattr(AiT, "start_epoch", lambda self, epoch, g: (calls.append(epoch), real(self, epoch, g)))
    cfg = load_config(None, [f"out_dir={tmp_path}", "model.name=ait_micro", "model.overrides.memory_reset=epoch",
                             "data.task=toy_sets", "data.batch_size=16", "aux_loss_weights.balance=0.01",
                             "epochs=3", "keep_weights_every=4", "progress=false"])
    result = train(cfg)
    assert result["status"] == "finished" and calls == [0, 1, 2]
    # keep_weights_every: the weights (memory included) at steps 4, 8, 12, for analyses over training
    kept = sorted((tmp_path / "checkpoints").glob("weights-*"))
    assert [p.name for p in kept] == ["weights-00000004", "weights-00000008", "weights-00000012"]
    mems = [AiT.from_pretrained(p).workspaces[0].memory for p in kept]
    assert not torch.equal(mems[0], mems[1]) and torch.equal(mems[2], result["model"].workspaces[0].memory)


def test_the_ema_model_takes_the_live_memory(tmp_path):
    """AveragedModel averages parameters only; its buffers would stay at the first memory."""
    sys.path.insert(0, str(Path(TOY_CLI).parent))
    import toy_task  # noqa: F401

    from modwire.training import load_config, train

    cfg = load_config(None, [f"out_dir={tmp_path}", "model.name=ait_micro", "data.task=toy_sets",
                             "data.batch_size=16", "aux_loss_weights.balance=0.01", "epochs=1", "ema_decay=0.9",
                             "progress=false"])
    assert train(cfg)["status"] == "finished"
    ckpt = tmp_path / "checkpoints" / "last"
    live, ema = load_file(str(ckpt / "live.safetensors")), load_file(str(ckpt / "model.safetensors"))
    keys = [k for k in live if k.endswith("workspace.memory")]
    assert keys and all(torch.equal(live[k], ema[k]) for k in keys)
    weight = next(k for k in live if k.endswith(".weight"))
    assert not torch.equal(live[weight], ema[weight])                   # the parameters are averaged


def test_analyze_on_an_ait_run_says_what_applies_to_it(tmp_path, capsys):
    """Issue 24: ``modwire analyze`` on an AiT run runs its workspace analyses; module dropping needs a
    model that describes its modules, so ``--drop`` is refused with what applies instead."""
    import toy_task  # noqa: F401  (registers "toy_sets")
    from modwire import cli
    from modwire.training import load_config, train

    cfg = load_config(None, [f"out_dir={tmp_path}", "model.name=ait_micro", "data.task=toy_sets",
                             "data.batch_size=16", "max_steps=2", "progress=false"])
    assert train(cfg)["status"] == "finished"
    assert cli.main(["analyze", str(tmp_path), "--no-plots"]) == 0
    summary = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    assert summary["analyses"] == ["workspace"]
    assert "slot_maps" in json.loads((tmp_path / "analysis" / "workspace.json").read_text())["skipped"]  # no grid
    capsys.readouterr()
    assert cli.main(["analyze", str(tmp_path), "--no-plots", "--drop", "0"]) == 2
    err = capsys.readouterr().err
    assert "What applies to it: modwire analyze RUN" in err and "['eval_memory_forward']" in err
