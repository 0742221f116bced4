"""Issue 25, the trainer's ``precision`` and ``compile`` options: a bf16 autocast run on the CPU stays
finite and tracks the fp32 run's losses; a ``compile: true`` run trains to the same losses as eager
(both graphs compiled once), records the option in its config and keeps it on resume; fp16 runs on
CUDA with a grad scaler (skipped without a GPU; its refusal elsewhere: tests/robustness)."""
import json

import pytest
import torch

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire.training import load_config, train
from modwire.training.checkpoint import load_state
from modwire.training.resume import run_config


def _cfg(out, *extra):
    return load_config(None, [f"out_dir={out}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                              "epochs=3", "optim.lr=3e-3", "progress=false", "log_every=1", *extra])


def _losses(run):
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_a_bf16_run_stays_finite_and_tracks_fp32(tmp_path):
    train(_cfg(tmp_path / "fp32"))
    bf16 = train(_cfg(tmp_path / "bf16", "precision=bf16"))
    a, b = torch.tensor(_losses(tmp_path / "fp32")), torch.tensor(_losses(tmp_path / "bf16"))
    assert len(a) == len(b) == 12 and torch.isfinite(b).all() and torch.isfinite(torch.tensor(bf16["val"]["loss"]))
    assert (a - b).abs().max() < 0.05 * a.abs().max()        # bf16 rounding, not another trajectory
    assert b[-3:].mean() < b[:3].mean()                       # and it learns


@pytest.mark.slow
def test_a_compiled_run_matches_eager_and_keeps_the_option_on_resume(tmp_path):
    # a ViT: deterministic in train mode (NAC samples its kernel in training, and compiled code draws
    # other random numbers than eager)
    train(_cfg(tmp_path / "eager", "epochs=2", "model.name=vit_micro"))
    compiled = train(_cfg(tmp_path / "compiled", "epochs=2", "model.name=vit_micro", "compile=true"))
    assert compiled["status"] == "finished"
    a, b = torch.tensor(_losses(tmp_path / "eager")), torch.tensor(_losses(tmp_path / "compiled"))
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    again = run_config(tmp_path / "compiled", ["epochs=3"])    # the run's own config: compile stays on
    assert again.compile is True
    result = train(again, resume=True, allow_change=["epochs"])
    assert result["step"] == 12 and torch.isfinite(torch.tensor(_losses(tmp_path / "compiled"))).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast with a grad scaler runs on CUDA only")
def test_fp16_on_cuda_uses_a_grad_scaler(tmp_path):
    out = train(_cfg(tmp_path / "fp16", "precision=fp16", "device=cuda"))
    assert out["status"] == "finished" and torch.isfinite(torch.tensor(_losses(tmp_path / "fp16"))).all()
    scaler = load_state(tmp_path / "fp16" / "checkpoints" / "last")["scaler"]
    assert scaler and scaler["scale"] > 1            # enabled: a loss scale, saved for resume
    train(_cfg(tmp_path / "fp32", "device=cuda"))
    assert not load_state(tmp_path / "fp32" / "checkpoints" / "last")["scaler"]   # none without fp16


FLEX_CPU = ["model.name=vit_micro", "model.overrides.attention_backend=flex", "device=cpu", "epochs=1"]


def test_compiling_flex_attention_on_the_cpu_is_refused_before_the_run_writes(tmp_path):
    """torch's inductor cannot lower FlexAttention inside a model on the CPU (issue 39): a CPU run with
    ``compile`` and ``attention_backend: flex`` is refused by name, before its directory exists (without
    ``compile`` the same model trains, the next test: on the CPU its training calls take SDPA, the same maths)."""
    from modwire.errors import UserError

    with pytest.raises(UserError, match=r"attention_backend is 'flex'.*attention_backend=sdpa"):
        train(_cfg(tmp_path / "compiled", *FLEX_CPU, "compile=true"))
    assert not (tmp_path / "compiled").exists()


@pytest.mark.slow
def test_flex_attention_on_the_cpu_trains_without_compile(tmp_path):
    """The run the refusal above points away from still trains eager (its evaluation compiles FlexAttention
    itself, seconds on the CPU: slow)."""
    assert train(_cfg(tmp_path / "eager", *FLEX_CPU))["status"] == "finished"
