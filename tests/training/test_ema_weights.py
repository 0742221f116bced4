"""Issue 36, item 1: a checkpoint's weights are the weights its validation scored. With an EMA
(``ema_decay > 0``) training validates the EMA and picks ``best`` by it, so ``model.safetensors``
holds the EMA (what ``from_pretrained``, ``modwire eval``, ``analyze`` and ``finetune`` load) and
``live.safetensors`` the weights the optimizer trained (what a resume continues);
``--weights live`` asks for those."""
import json

import pytest
import torch
from safetensors.torch import load_file

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire import cli
from modwire.errors import UserError
from modwire.models import from_pretrained
from modwire.training import load_config, train
from modwire.training.ema import checkpoint_model, weight_files
from modwire.training.finetune_setup import pretrained_model
from modwire.tasks import describe_task
from training_helpers import signal_after_step

BASE = ["model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16", "progress=false",
        "optim.lr=3e-3", "optim.warmup_steps=0"]


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("ema") / "run"
    result = train(load_config(None, [*BASE, f"out_dir={run}", "epochs=3", "ema_decay=0.9"]))
    return run, result


def _eval(capsys, *args) -> dict:
    capsys.readouterr()
    assert cli.main(["eval", *map(str, args)]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_eval_scores_best_as_training_did(ema_run, capsys):
    run, result = ema_run
    key = next(k for k in result["best"] if k != "step")
    record, header = _eval(capsys, run)
    assert record["tag"] == "best" and record["step"] == result["best"]["step"] and record["weights"] == "ema"
    assert record[key] == pytest.approx(result["best"][key], abs=1e-6)          # what training recorded
    logged = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    val = next(r for r in logged if r.get("step") == record["step"] and f"val_{key}" in r)
    assert record["loss"] == pytest.approx(val["val_loss"], rel=1e-5)
    assert "weights: ema (what validation scored" in header
    live, header = _eval(capsys, run, "--weights", "live")
    assert live["weights"] == "live" and "live (asked for; validation scored the ema weights)" in header
    assert live["loss"] != pytest.approx(record["loss"], rel=1e-4)              # another set of weights


def test_from_pretrained_and_finetune_load_the_scored_weights(ema_run):
    run, _ = ema_run
    best = (run / "checkpoints" / "best").resolve()
    files, scored = weight_files(best)
    assert scored == "ema" and files == {"live": best / "live.safetensors", "ema": best / "model.safetensors"}
    ema, live = load_file(str(files["ema"])), load_file(str(files["live"]))
    assert any(not torch.equal(ema[k], live[k]) for k in ema)

    def same(model, saved):
        return all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())

    assert same(from_pretrained(best), ema)
    assert same(checkpoint_model(best)[0], ema) and same(checkpoint_model(best, "live")[0], live)
    info = describe_task("toy_sets", {})
    for weights, saved in ((None, ema), ("live", live), ("ema", ema)):
        cfg = load_config(None, [*BASE, f"finetune.init={run}", *([f"finetune.weights={weights}"] if weights else [])])
        assert same(pretrained_model(cfg, info), saved)


def test_resume_continues_the_live_weights_and_the_ema(ema_run, tmp_path, monkeypatch):
    """A run stopped part-way through an epoch and resumed ends with the weights of one never stopped."""
    run, result = ema_run
    part = tmp_path / "part"
    cfg = load_config(None, [*BASE, f"out_dir={part}", "epochs=3", "ema_decay=0.9"])
    signal_after_step(monkeypatch, 6)
    assert train(cfg)["status"] == "interrupted"
    monkeypatch.undo()
    assert train(cfg, resume=True)["step"] == result["step"]
    for name in ("model.safetensors", "live.safetensors"):
        a = load_file(str(run / "checkpoints" / "last" / name))
        b = load_file(str(part / "checkpoints" / "last" / name))
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_weights_of_a_run_without_ema(tmp_path, capsys):
    run = tmp_path / "plain"
    train(load_config(None, [*BASE, f"out_dir={run}", "max_steps=2"]))
    ckpt = (run / "checkpoints" / "last").resolve()
    assert weight_files(ckpt) == ({"live": ckpt / "model.safetensors"}, "live")
    assert not (ckpt / "live.safetensors").exists()
    record, header = _eval(capsys, run)
    assert record["weights"] == "live" and "live (the run kept no EMA)" in header
    with pytest.raises(UserError, match=r"weights='ema'.*kept no EMA.*ema_decay was 0"):
        checkpoint_model(ckpt, "ema")
    assert cli.main(["eval", str(run), "--weights", "ema"]) == 2
    assert "kept no EMA" in capsys.readouterr().err


def test_the_layout_before_issue_36_is_read_by_kind(tmp_path):
    """Before issue 36 ``model.safetensors`` held the live weights and ``ema.safetensors`` the EMA."""
    for name in ("model.safetensors", "ema.safetensors"):
        (tmp_path / name).write_bytes(b"")
    assert weight_files(tmp_path) == ({"live": tmp_path / "model.safetensors", "ema": tmp_path / "ema.safetensors"},
                                      "ema")


def test_analyze_and_finetune_say_which_weights_they_load(ema_run, tmp_path, capsys):
    run, _ = ema_run
    capsys.readouterr()
    assert cli.main(["analyze", str(run), "--no-plots", "--drop", "0", "--max-samples", "16", "--iters", "1",
                     "--out", str(tmp_path / "a")]) == 0
    assert "weights: ema (what validation scored" in capsys.readouterr().out
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["weights"] == "ema"
    assert cli.main(["analyze", str(run), "--no-plots", "--drop", "0", "--max-samples", "16", "--iters", "1",
                     "--out", str(tmp_path / "b"), "--weights", "live"]) == 0
    assert "weights: live (asked for; validation scored the ema weights)" in capsys.readouterr().out
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["weights"] == "live"
    assert cli.main(["finetune", str(run), "--task", "toy_sets", "--seeds", "0", "--epochs", "1", "--weights", "live", "--batch-size", "16",
                     "--out", str(tmp_path / "ft")]) == 0
    assert "(weights: live (asked for; validation scored the ema weights)); training all" in capsys.readouterr().err
