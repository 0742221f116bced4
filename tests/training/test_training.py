import json
import signal

import pytest
import torch
from safetensors.torch import load_file

import toy_task  # noqa: F401  (registers "toy_sets")
from training_helpers import signal_after_step
from modwire import cli
from modwire.training import load_config, train
from modwire.training.optim import lr_at, param_groups


def cfg(tmp_path, *extra):
    return load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=nac_micro", "data.task=toy_sets",
                              "data.batch_size=16", "epochs=3", "optim.lr=3e-3", "progress=false",
                              "log_every=1", *extra])


def test_train_logs_checkpoints_and_eval_reproduces_the_metric(tmp_path, capsys):
    result = train(cfg(tmp_path))
    run = tmp_path / "run"
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 3 * 4 and all(torch.isfinite(torch.tensor(losses)))
    vals = [r for r in records if "val_top1" in r]
    assert len(vals) == 3 and vals[-1] == {"step": 12, "epoch": 3, **{f"val_{k}": v for k, v in result["val"].items()}}
    for tag in ("last", "best"):
        d = run / "checkpoints" / tag
        assert {p.name for p in d.iterdir()} == {"config.json", "model.safetensors", "state.pt", "checkpoint.json", "manifest.json"}
    assert (run / "config.yaml").is_file()
    # `modwire eval` on the last checkpoint reproduces the metric the run reported for it
    assert cli.main(["eval", str(run / "checkpoints" / "last")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["top1"] == pytest.approx(result["val"]["top1"]) and out["loss"] == pytest.approx(result["val"]["loss"])
    # --max-samples scores the first N samples only: the same as evaluating those N by hand
    assert cli.main(["eval", str(run / "checkpoints" / "last"), "--max-samples", "5"]) == 0
    first5 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    from modwire.analysis.runs import load_run
    from modwire.training import evaluate, make_loader
    _, model, info, dataset = load_run(run / "checkpoints" / "last", [])
    subset = torch.utils.data.Subset(dataset, range(5))
    by_hand = evaluate(model, make_loader(subset, 5, None, info, 0, drop_last=False), info, torch.device("cpu"))
    assert first5["samples"] == 5 and first5["loss"] == pytest.approx(by_hand["loss"])
    assert first5["loss"] != pytest.approx(out["loss"])


def test_training_learns_the_toy_task(tmp_path):
    result = train(cfg(tmp_path, "epochs=8", "data.params.size=256", "data.batch_size=32",
                       "model.overrides.kernel.train_mode=sample"))
    assert result["val"]["top1"] > 0.8  # chance is 0.5


def _same_weights(a, b):
    assert list(a) == list(b)  # zip below would stop silently at the shorter one
    for (n, x), (_, y) in zip(a.items(), b.items()):
        assert torch.equal(x, y), n


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_saves_and_resume_continues_exactly(tmp_path, monkeypatch, signum):
    full = train(cfg(tmp_path / "a", "checkpoint_every=3"))["model"]
    signal_after_step(monkeypatch, 5, signum)
    stopped = train(cfg(tmp_path / "b", "checkpoint_every=3"))
    assert stopped["status"] == "interrupted" and stopped["step"] == 5
    assert stopped["exit_code"] == 128 + signum          # 130 (SIGINT), 143 (SIGTERM)
    monkeypatch.undo()
    state = torch.load(tmp_path / "b" / "run" / "checkpoints" / "last" / "state.pt", weights_only=True)
    assert state["step"] == 5 and state["epoch"] == 1 and state["micro"] == 1
    resumed = train(cfg(tmp_path / "b", "checkpoint_every=3"), resume=True)
    assert resumed["status"] == "finished" and resumed["step"] == 12
    _same_weights(full.state_dict(), resumed["model"].state_dict())
    steps = [[json.loads(l)["step"] for l in (tmp_path / d / "run" / "metrics.jsonl").read_text().splitlines()]
             for d in ("a", "b")]
    assert steps[0] == steps[1]


def test_grad_accumulation_matches_a_full_batch_step(tmp_path, monkeypatch):
    # Compare the gradient handed to the optimizer (Adam's first step is ≈ lr·sign(g),
    # which would amplify rounding differences of near-zero gradients).
    grads = []
    real_step = torch.optim.AdamW.step

    def spy(self, *a, **k):
        grads.append([p.grad.clone() for g in self.param_groups for p in g["params"] if p.grad is not None])
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    common = ["max_steps=1", "model.overrides.kernel.train_mode=expected", "optim.grad_clip=0"]
    train(cfg(tmp_path / "a", *common))
    train(cfg(tmp_path / "b", *common, "grad_accum=4"))
    assert len(grads) == 2 and len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


def test_param_groups_exclude_signatures_codes_and_1d(tmp_path):
    import modwire
    model = modwire.create_model("nac_micro")
    decay, no_decay = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    no = {names[id(p)] for p in no_decay["params"]}
    assert {"generator.processors.signatures", "generator.processors.codes", "generator.outputs.codes"} <= no
    assert all(model.get_parameter(n).ndim <= 1 or "signatures" in n or "codes" in n for n in no)
    assert "propagators.0.ffn.fn.fc1.weight" in {names[id(p)] for p in decay["params"]}


def test_cosine_schedule_with_warmup():
    c = load_config(None, ["optim.lr=1.0", "optim.warmup_steps=10", "optim.warmup_lr=0.0", "optim.min_lr=0.1"])
    assert lr_at(0, 110, c.optim) == 0.0 and lr_at(5, 110, c.optim) == pytest.approx(0.5)
    assert lr_at(10, 110, c.optim) == pytest.approx(1.0)
    assert lr_at(60, 110, c.optim) == pytest.approx(0.55) and lr_at(110, 110, c.optim) == pytest.approx(0.1)


def test_cosine_schedule_reaches_min_lr_at_decay_steps_then_stays():
    """NI App. A.1.5 / Table 4: anneal over decay_steps (< total), then keep the minimum."""
    c = load_config(None, ["optim.lr=1.0", "optim.min_lr=0.1", "optim.decay_steps=100"])
    assert lr_at(0, 150, c.optim) == 1.0 and lr_at(50, 150, c.optim) == pytest.approx(0.55)
    assert lr_at(100, 150, c.optim) == pytest.approx(0.1) and lr_at(149, 150, c.optim) == pytest.approx(0.1)


def test_ema_and_bf16(tmp_path):
    result = train(cfg(tmp_path, "ema_decay=0.9", "precision=bf16", "epochs=1"))
    ckpt = tmp_path / "run" / "checkpoints" / "last"
    # model.safetensors: the weights validation scored (the EMA); live.safetensors: the trained ones
    ema, live = load_file(str(ckpt / "model.safetensors")), load_file(str(ckpt / "live.safetensors"))
    model = result["model"].state_dict()
    assert ema.keys() == live.keys() == model.keys()
    assert all(torch.equal(live[k], model[k]) for k in live)
    assert any(not torch.equal(ema[k], model[k]) for k in ema)


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="optim.lrr"):
        load_config(None, ["optim.lrr=1"])
    with pytest.raises(ValueError, match="'precision'.*'fp8'.*bf16"):
        load_config(None, ["precision=fp8"])
    with pytest.raises(KeyError, match="unknown task 'toy_set'.*toy_sets"):
        train(cfg(tmp_path, "data.task=toy_set"))
    with pytest.raises(KeyError, match="unknown model 'nac_mikro'"):
        train(cfg(tmp_path, "model.name=nac_mikro"))


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["frobnicate"])
    assert e.value.code == 2
    assert cli.main(["train", "--set", "data.task=nope", f"out_dir={tmp_path}"]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err
    assert cli.main(["eval", str(tmp_path / "missing")]) == 2
    assert "expected a run directory" in capsys.readouterr().err


def test_resume_rejects_a_tampered_state_file(tmp_path):
    train(cfg(tmp_path, "epochs=1"))
    state = tmp_path / "run" / "checkpoints" / "last" / "state.pt"
    state.write_bytes(state.read_bytes()[:100])  # truncated
    with pytest.raises(ValueError, match="state.pt is corrupted"):          # caught by the sha256 manifest
        train(cfg(tmp_path, "epochs=2"), resume=True, allow_change=["epochs"])
    for name in ("manifest.json", "checkpoint.json"):   # an older checkpoint: neither file (one without the other
        (tmp_path / "run" / "checkpoints" / "last" / name).unlink()              # is refused: tests/robustness)
    with pytest.raises(ValueError, match="not a readable modwire training state"):
        train(cfg(tmp_path, "epochs=2"), resume=True, allow_change=["epochs"])


def test_progress_without_a_tty_is_plain_lines_with_loss_throughput_and_metrics(tmp_path, capsys):
    train(cfg(tmp_path, "progress=true", "epochs=2", "log_every=2"))
    err = capsys.readouterr().err
    assert "\r" not in err                                        # no progress-bar redraws in a log file
    steps = [l for l in err.splitlines() if l.startswith("nac_micro on toy_sets: step")]
    assert [l.split()[4] for l in steps] == ["2/8", "4/8", "6/8", "8/8"]   # every log_every steps
    assert "samples_per_s=" in steps[0] and "val_top1=" in steps[-1]
    assert "validation 1/4 batches" in err and "validation 4/4 batches" in err
    for item in ("run directory:", "64 train / 64 val samples", "parameters:", "4 per epoch", "cpu", "fp32"):
        assert item in err, item


def test_progress_on_a_terminal_is_a_bar_for_steps_and_one_for_validation(tmp_path, monkeypatch, capsys):
    import io

    from modwire.training import feedback

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    real = feedback.Feedback.__init__
    monkeypatch.setattr(feedback.Feedback, "__init__", lambda self, **k: real(self, **k, stream=term))
    train(cfg(tmp_path, "progress=true", "epochs=2"), )
    out = term.getvalue()
    assert "nac_micro on toy_sets: 100%" in out and "8/8" in out and "val_top1=" in out
    assert "validation" in out and "batch" in out and "run directory:" in out
    assert capsys.readouterr().out == ""                  # stdout stays for the result (JSON)


def test_resume_names_a_changed_parameter_grouping_instead_of_torchs_bare_mismatch(tmp_path):
    """A checkpoint written when the parameters were grouped otherwise (e.g. before weight decay
    left the biases out) is refused naming both groupings and what to do; a matching one loads."""
    from modwire.errors import UserError
    from modwire.training.state import load_optimizer

    w, b = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
    one = torch.optim.AdamW([w, b], lr=0.1)
    two = torch.optim.AdamW([{"params": [w]}, {"params": [b], "weight_decay": 0.0}], lr=0.1)
    with pytest.raises(UserError, match=r"hold \[2\] tensors in the checkpoint and \[1, 1\] in this run"):
        load_optimizer(two, one.state_dict(), tmp_path / "ckpt")
    (w * b).sum().backward()
    two.step()
    again = torch.optim.AdamW([{"params": [w]}, {"params": [b], "weight_decay": 0.0}], lr=0.1)
    load_optimizer(again, two.state_dict(), tmp_path / "ckpt")
    assert torch.equal(again.state_dict()["state"][0]["exp_avg"], two.state_dict()["state"][0]["exp_avg"])
