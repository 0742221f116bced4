"""The global workspace's pool under DistributedDataParallel (AiT §4.1; issue 12, item 1), on 2 CPU
processes (gloo), each holding half of one batch (``tests/ddp_ait_worker.py``):

* ``pool="global"`` (all-gathered, differentiable): the paper's squashed pool of the *global*
  batch. Each half's logits, the memory update (AiT Eq. 4) and, after DDP's gradient averaging,
  every gradient equal one process running the whole batch with ``pool="batch"``.
* ``pool="batch"`` (the paper's squash of the *local* batch): each process sees only its half, so
  each half's logits equal one process running that half alone; DDP's averaged gradients are the
  mean of the two half-batch runs' gradients; every process stores the Eq. 4 update with the
  mean of the two processes' ``γ̂`` (so no process's write is lost to DDP's buffer broadcast).
* ``pool="sample"``: no sample depends on another, so the halves equal the whole-batch run,
  memory included.

Also: an evaluation forward on rank 0 alone (the trainer validates on rank 0 while the other
ranks wait at a barrier) neither hangs nor depends on the other process.
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ddp_ait_worker as w

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "ddp_ait_worker.py")
TOL = {"atol": 2e-5, "rtol": 1e-4}


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ait_ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-port", "29547", WORKER, str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)          # torchrun and both workers (their own session)
        _, stderr = proc.communicate()
        pytest.fail(f"the 2-process AiT run hung (an all-gather that the other process never joins, e.g. in "
                    f"the rank-0-only evaluation?): {stderr[-2000:]}")
    errors = [l for l in stderr.splitlines() if l.startswith("[rank") and "Error" in l]
    assert proc.returncode == 0, "\n".join(errors[:4]) + "\n" + stderr[-3000:]
    return out


def load(out: Path, pool: str, rank: int) -> dict:
    return torch.load(out / f"{pool}-rank{rank}.pt", weights_only=False)


def single(pool: str, x: torch.Tensor, y: torch.Tensor) -> dict:
    model = w.build(pool)
    return w.step(model, model, x, y)


def memory_buffers(res: dict) -> dict[str, torch.Tensor]:
    mem = {k: v for k, v in res["buffers"].items() if k.endswith("memory")}
    assert mem, f"no workspace memory buffer among {sorted(res['buffers'])}"
    return mem


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    assert a.keys() == b.keys(), f"{what}: names differ: {sorted(a.keys() ^ b.keys())}"
    for k in a:
        torch.testing.assert_close(a[k], b[k], **TOL, msg=lambda m, k=k: f"{what} {k}: {m}")


def averaged_memory(pool: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Eq. 4 with the mean over the two processes' ``γ̂`` (each from its own half's pool; per-sample
    pools: the mean over the half's samples), from the initial memory."""
    hats = []
    for r in (0, 1):
        model, got = w.build(pool), {}
        for name, ws in model.named_modules():
            if hasattr(ws, "write") and hasattr(ws, "memory"):
                real = ws.write
                ws.write = lambda *a, real=real, name=name, **k: (got.setdefault(name, real(*a, **k)), got[name])[1]
        model.train()(w.half(x, r))
        hats.append({n: h[0].detach().mean(0) for n, h in got.items()})
    fresh = w.build(pool)
    return {f"{n}.memory": ws.update(ws.memory, (hats[0][n] + hats[1][n]) / 2).detach()
            for n, ws in fresh.named_modules() if n in hats[0]}


def workspace_names(model: nn.Module) -> list[str]:
    from modwire.nn.workspace import GlobalWorkspace

    prefixes = [n for n, m in model.named_modules() if isinstance(m, GlobalWorkspace)]
    assert prefixes, "the AiT has no GlobalWorkspace module"
    return [n for n, _ in model.named_parameters() if any(n.startswith(p + ".") for p in prefixes)]


@pytest.mark.slow
def test_global_pool_on_two_processes_equals_one_process_on_the_whole_batch(ddp_runs):
    model = w.build("batch")
    x, y = w.data(model)
    ref = single("batch", x, y)
    ranks = [load(ddp_runs, "global", r) for r in (0, 1)]
    for r, res in enumerate(ranks):
        torch.testing.assert_close(res["logits"], w.half(ref["logits"], r), **TOL)
        assert_same(memory_buffers(res), memory_buffers(ref), f"rank {r} memory after the update")
        for k, v in ref["aux"].items():          # the balance loss of the global pool's selection
            torch.testing.assert_close(res["aux"][k], v, **TOL)
        # DDP averages (CE_0 + 2·0.01·balance + CE_1) / 2 = the whole batch's mean CE + 0.01·balance
        assert_same(res["grads"], ref["grads"], f"rank {r} gradient")
    names = workspace_names(model)
    assert names and all(n in ranks[0]["grads"] for n in names)    # the workspace trains
    assert any(ref["grads"][n].abs().max() > 0 for n in names)
    # the other half's patches really compete: the local pool would give other logits
    local = load(ddp_runs, "batch", 0)
    assert (local["logits"] - ranks[0]["logits"]).abs().max() > 1e-4


@pytest.mark.slow
def test_batch_pool_on_two_processes_pools_each_half_alone(ddp_runs):
    x, y = w.data(w.build("batch"))
    refs = [single("batch", w.half(x, r), w.half(y, r)) for r in (0, 1)]
    ranks = [load(ddp_runs, "batch", r) for r in (0, 1)]
    for r in (0, 1):
        torch.testing.assert_close(ranks[r]["logits"], refs[r]["logits"], **TOL)
        assert_same(memory_buffers(ranks[r]), averaged_memory("batch", x), f"rank {r} memory (mean γ̂)")
        mean = {k: (refs[0]["grads"][k] + refs[1]["grads"][k]) / 2 for k in refs[0]["grads"]}
        assert_same(ranks[r]["grads"], mean, f"rank {r} DDP-averaged gradient")
    m0 = memory_buffers(refs[0])                  # a half alone writes another memory: averaging happened
    assert any((m0[k] - v).abs().max() > 1e-6 for k, v in memory_buffers(ranks[0]).items())


@pytest.mark.slow
def test_sample_pool_on_two_processes_equals_one_process(ddp_runs):
    x, y = w.data(w.build("sample"))
    ref = single("sample", x, y)
    for r in (0, 1):
        res = load(ddp_runs, "sample", r)
        torch.testing.assert_close(res["logits"], w.half(ref["logits"], r), **TOL)
        assert_same(memory_buffers(res), memory_buffers(ref), f"rank {r} memory (mean γ̂ of all samples)")


@pytest.mark.slow
@pytest.mark.parametrize("pool", w.POOLS)
def test_evaluation_on_rank_zero_alone_needs_no_other_process(ddp_runs, pool):
    """The trainer validates on rank 0 only: the run above did not hang, and rank 0's evaluation
    equals one process evaluating the same model (same weights, same updated memory)."""
    model = w.build("batch" if pool == "global" else pool)
    x, y = w.data(model)
    if pool == "global":       # rank 0's memory after the global step = the whole-batch step's
        w.step(model, model, x, y)
    else:                      # the memory every process stored: Eq. 4 with the processes' mean γ̂
        model.load_state_dict({**model.state_dict(), **averaged_memory(pool, x)})
    torch.testing.assert_close(load(ddp_runs, pool, 0)["eval_logits"], w.evaluate(model, w.half(x, 0)), **TOL)
