"""Faults a run must survive without losing data or giving a raw traceback (issue 9, item 2-5):
locks, resume rules, corrupted and unwritable checkpoints, interrupts during validation,
``modwire eval``'s choice of checkpoint and its JSON, out-of-range labels."""
import errno
import json
import os
import shutil
import signal

import pytest
import torch

import toy_task  # noqa: F401  (registers "toy_sets")
from training_helpers import signal_after_step
from modwire import cli, from_pretrained
from modwire.tasks import InputSpec, TaskInfo, register_task
from modwire.training import load_config, train
from modwire.training.checkpoint import CheckpointWriteError, load_weights
from modwire.training.lock import RunLock, RunLockedError


def cfg(out, *extra):
    return load_config(None, [f"out_dir={out}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                              "epochs=2", "optim.lr=3e-3", "progress=false", "log_every=1", *extra])


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


# ----------------------------------------------------------------------------- the run lock

def test_a_second_run_on_a_locked_directory_refuses_naming_the_holder(tmp_path):
    with RunLock(tmp_path / "run"):
        with pytest.raises(RunLockedError, match=rf"in use by another run \(pid={os.getpid()} host="):
            train(cfg(tmp_path / "run"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_run_refused_before_it_writes_leaves_no_directory(tmp_path):
    """Checks that need the data (a batch larger than the split) come after the lock, which creates
    the run directory: a refused run removes what it created, and an existing directory is kept."""
    with pytest.raises(ValueError, match="smaller than one global batch"):
        train(cfg(tmp_path / "new" / "run", "data.batch_size=128"))
    assert not (tmp_path / "new" / "run").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(ValueError, match="smaller than one global batch"):
        train(cfg(tmp_path / "kept", "data.batch_size=128"))
    assert (tmp_path / "kept").is_dir()


def test_resume_writes_the_best_checkpoint_a_stopped_run_recorded_but_never_wrote(tmp_path):
    """A run stopped between writing ``last`` and ``best`` (a full disk, a kill) recorded its best at
    that step; on resume ``best`` is written from ``last`` (same weights) before anything else."""
    run = tmp_path / "run"
    result = train(cfg(run, "epochs=1"))
    best = run / "checkpoints" / "best"
    step = result["best"]["step"]
    assert step == result["step"] == 4
    target = best.resolve()
    best.unlink()
    shutil.rmtree(target)                                            # as if the save of best had failed
    train(cfg(run, "epochs=1"), resume=True)
    assert best.is_symlink() and best.resolve().name == f"best-{step:08d}"
    same_weights(from_pretrained(best), from_pretrained(run / "checkpoints" / "last"))


def test_a_stale_lock_of_a_dead_process_does_not_block(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text("pid=999999 host=gone\n")
    assert train(cfg(tmp_path / "run", "max_steps=1"))["status"] == "finished"
    assert f"pid={os.getpid()}" in (tmp_path / "run" / ".lock").read_text()


def test_cli_reports_a_locked_run_directory_with_exit_1(tmp_path, capsys):
    with RunLock(tmp_path / "run"):
        assert cli.main(["train", "--set", f"out_dir={tmp_path / 'run'}", "data.task=toy_sets",
                         "model.name=nac_micro"]) == 1
    assert "is in use by another run" in capsys.readouterr().err


# ----------------------------------------------------------------------------- resume rules

def test_resume_refuses_a_changed_learning_rate_listing_the_key(tmp_path):
    run = tmp_path / "run"
    train(cfg(run, "epochs=1"))
    before = (run / "config.yaml").read_text()
    with pytest.raises(ValueError, match=r"optim.lr: 0.003 → 0.01.*optim.lr would change the model, data or "
                                         r"optimizer"):
        train(cfg(run, "epochs=1", "optim.lr=0.01"), resume=True)
    with pytest.raises(ValueError, match=r"epochs: 1 → 2.*--allow-change epochs"):
        train(cfg(run), resume=True)
    with pytest.raises(ValueError, match="--allow-change optim.lr: only keys"):
        train(cfg(run, "optim.lr=0.01"), resume=True, allow_change=["optim.lr"])
    assert cli.main(["train", "--resume", str(run), "--set", "optim.lr=0.01"]) == 2
    assert (run / "config.yaml").read_text() == before          # never rewritten


def test_resume_run_dir_with_an_allowed_change_is_recorded_not_written_into_config_yaml(tmp_path, capsys):
    run = tmp_path / "run"
    train(cfg(run, "epochs=1"))
    before = (run / "config.yaml").read_text()
    assert cli.main(["train", "--resume", str(run), "--set", "epochs=2", "--allow-change", "epochs"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["step"] == 8
    assert (run / "config.yaml").read_text() == before
    (record,) = [json.loads(l) for l in (run / "resumes.jsonl").read_text().splitlines()]
    assert record["step"] == 4 and record["changes"] == {"epochs": [1, 2]}
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == list(range(1, 9))                            # continued from step 4, not restarted
    # the effective config now has epochs=2: resuming again needs no flag and has nothing to do
    assert cli.main(["train", "--resume", str(run)]) == 0


def test_a_fresh_run_does_not_overwrite_an_earlier_run(tmp_path):
    run = tmp_path / "run"
    train(cfg(run, "max_steps=1"))
    with pytest.raises(ValueError, match="already holds a run.*--resume"):
        train(cfg(run, "max_steps=1"))
    assert train(cfg(run, "max_steps=2", "optim.lr=0.01"), overwrite=True)["step"] == 2
    assert "lr: 0.01" in (run / "config.yaml").read_text()


def _tree(root):
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if p.name != ".lock"}


@pytest.mark.parametrize("bad,key", [("model.overrides.num_layers=banana", "num_layers"),
                                     ("model.overrides.no_such_field=1", "no_such_field"),
                                     ("data.params.no_such_param=1", "no_such_param")])
def test_overwrite_with_a_bad_override_leaves_the_earlier_run_byte_for_byte(tmp_path, capsys, bad, key):
    """Issue 24: ``--overwrite`` deleted the earlier run and then failed on the new config."""
    run = tmp_path / "run"
    train(cfg(run, "max_steps=1"))
    before = _tree(run)
    args = ["out_dir=" + str(run), "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16", "progress=false"]
    assert cli.main(["train", "--overwrite", "--set", *args, bad]) == 2
    assert key in capsys.readouterr().err
    assert _tree(run) == before


def test_a_checkpoint_that_does_not_match_the_model_says_so_in_one_line(tmp_path):
    import modwire

    run = tmp_path / "run"
    train(cfg(run, "max_steps=1"))
    bigger = modwire.create_model("nac_micro", num_layers=3, num_classes=2,
                                  tokenizer={"kind": "linear", "input_dim": 8})
    with pytest.raises(ValueError) as e:
        load_weights(bigger, run / "checkpoints" / "last" / "model.safetensors")
    msg = str(e.value)
    assert "\n" not in msg and "does not match the model: model config (saved vs model) [num_layers: 2 vs 3]; " \
                               "missing [propagators.2." in msg


# ----------------------------------------------------------------------------- corrupted and unwritable checkpoints

def test_bytes_overwritten_inside_a_tensor_are_detected(tmp_path, capsys):
    run = tmp_path / "run"
    train(cfg(run, "max_steps=2"))
    weights = run / "checkpoints" / "last" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-20:-12] = bytes(8)                                   # inside the last tensor's data
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model.safetensors is corrupted"):
        train(cfg(run, "max_steps=2"), resume=True)
    with pytest.raises(ValueError, match="model.safetensors is corrupted"):
        from_pretrained(run / "checkpoints" / "last")
    assert cli.main(["eval", str(run / "checkpoints" / "last")]) == 2
    assert "model.safetensors is corrupted" in capsys.readouterr().err


def test_disk_full_keeps_the_previous_checkpoint_and_no_temporary_files(tmp_path, monkeypatch):
    from modwire.training import checkpoint

    run = tmp_path / "run"
    real_open, calls = open, []

    def open_until_full(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        if str(path).endswith("state.pt"):
            calls.append(path)
            if len(calls) >= 2:   # the second checkpoint's state.pt: the disk is full after 7 bytes
                f.write(b"partial")
                f.close()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return f

    monkeypatch.setattr(checkpoint, "open", open_until_full, raising=False)
    with pytest.raises(CheckpointWriteError, match=r"could not write checkpoint .*last-00000004: no space left to "
                                                   r"write .*: it needs about [\d,]+ bytes, [\d,]+ bytes free on its "
                                                   r"file system; the run's checkpoint 'last' \(step 2, "
                                                   r".*last-00000002\) is kept"):
        train(cfg(run, "checkpoint_every=2"))
    monkeypatch.undo()
    assert os.readlink(run / "checkpoints" / "last") == "last-00000002"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last", "last-00000002"]
    assert train(cfg(run, "checkpoint_every=2"), resume=True)["step"] == 8   # and it resumes


def test_an_unwritable_run_directory_is_a_clear_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["train", "--set", f"out_dir={blocker / 'run'}", "data.task=toy_sets",
                     "model.name=nac_micro"]) == 1
    err = capsys.readouterr().err
    assert f"modwire train: error: cannot write the run directory {blocker / 'run'}" in err
    assert "Traceback" not in err and "bug in modwire" not in err


# ----------------------------------------------------------------------------- interrupts

def test_an_interrupt_during_validation_stops_within_a_batch_and_resume_redoes_it(tmp_path, monkeypatch):
    from modwire.training.feedback import Feedback

    ref = train(cfg(tmp_path / "ref"))
    batches = []

    def interrupt_first_validation(self, done, total):
        batches.append(done)
        if len(batches) == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Feedback, "validation", interrupt_first_validation)
    stopped = train(cfg(tmp_path / "run"))
    assert stopped["status"] == "interrupted" and stopped["exit_code"] == 143 and stopped["step"] == 4
    assert batches == [1]                                       # the next batch was not evaluated
    monkeypatch.undo()
    state = torch.load(tmp_path / "run" / "checkpoints" / "last" / "state.pt", weights_only=True)
    assert state["val_pending"] and state["epoch"] == 1
    resumed = train(cfg(tmp_path / "run"), resume=True)
    same_weights(ref["model"], resumed["model"])
    assert resumed["best"] == ref["best"]
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == (tmp_path / "ref" / "metrics.jsonl").read_text() \
        or [json.loads(l)["step"] for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == \
        [json.loads(l)["step"] for l in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- modwire eval

def test_eval_scores_last_when_it_is_newer_than_best_and_says_so(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    signal_after_step(monkeypatch, 6)                           # best at step 4 (epoch 1), stopped at 6
    assert train(cfg(run))["status"] == "interrupted"
    monkeypatch.undo()
    capsys.readouterr()
    assert cli.main(["eval", str(run)]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out.splitlines()[-1])
    assert out["tag"] == "last" and out["step"] == 6 and out["checkpoint"].endswith("last-00000006")
    assert "'last' (step 6) is newer than 'best' (step 4) and its latest steps were never validated" in captured.err
    # a finished run whose final validation scored lower keeps scoring 'best', and says why
    finished = tmp_path / "finished"
    import modwire.training.supervised as trainer

    scores, real_evaluate = iter([0.5, 0.7, 0.6]), trainer.evaluate   # epoch 3 scores below epoch 2, whatever
    monkeypatch.setattr(trainer, "evaluate", lambda model, loader, info, *a, **k: {   # the weights' luck
        **real_evaluate(model, loader, info, *a, **k), info.metrics[0]: next(scores)})
    result = train(cfg(finished, "epochs=3"))
    monkeypatch.undo()
    assert result["best"]["step"] == 8 and result["step"] == 12    # epoch 3 did not improve on epoch 2
    capsys.readouterr()
    assert cli.main(["eval", str(finished)]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out.splitlines()[-1])
    assert out["tag"] == "best" and out["step"] == 8
    assert "'last' (step 12) was validated and scored lower" in captured.err


def test_eval_json_is_valid_when_a_metric_is_nan(tmp_path, monkeypatch, capsys):
    import modwire.training as training

    run = tmp_path / "run"
    train(cfg(run, "max_steps=1"))
    monkeypatch.setattr(training, "evaluate", lambda *a, **k: {"loss": float("nan"), "top1": float("inf")})
    capsys.readouterr()
    assert cli.main(["eval", str(run)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]

    def no_constants(name):
        raise AssertionError(f"bare {name} in JSON output")

    out = json.loads(line, parse_constant=no_constants)
    assert out["loss"] is None and out["top1"] is None and out["tag"] == "best"


# ----------------------------------------------------------------------------- bad labels

class BadLabels(torch.utils.data.Dataset):
    def __init__(self, split, label=2):
        self.label = label

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.randn(6, 8), torch.tensor(self.label if i == 5 else 0)


@pytest.mark.parametrize("label", [2, -1])
def test_a_label_outside_the_class_range_names_task_label_and_class_count(tmp_path, monkeypatch, label):
    from modwire.tasks import base

    monkeypatch.setattr(base, "_TASKS", dict(base._TASKS))      # registered for this test only
    register_task(TaskInfo("toy_bad_labels", "generator", "test task with a label out of range", 2,
                           InputSpec.vectors(6, 8), params={"label": 2}), BadLabels)
    with pytest.raises(ValueError, match=rf"task 'toy_bad_labels' gave label {label}, but the model has 2 classes"):
        train(cfg(tmp_path / "run", "data.task=toy_bad_labels", f"data.params.label={label}"))


def test_fp16_without_cuda_is_a_config_error_naming_bf16(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("fp16 is allowed on a CUDA device")
    with pytest.raises(ValueError, match=r"'precision': fp16 needs a CUDA device.*bf16"):
        train(cfg(tmp_path / "run", "precision=fp16"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_from_pretrained_on_a_run_directory_points_at_its_checkpoints(tmp_path):
    train(cfg(tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match=r"training run directory: load .*checkpoints/best"):
        from_pretrained(tmp_path / "run")
    assert from_pretrained(tmp_path / "run" / "checkpoints" / "best").num_classes == 2


def test_resume_after_the_last_link_was_deleted_names_the_checkpoint_left(tmp_path, capsys):
    run = tmp_path / "run"
    train(cfg(run))
    target = (run / "checkpoints" / "last").resolve().name
    (run / "checkpoints" / "last").unlink()
    assert cli.main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"ln -sfn {target} {run / 'checkpoints' / 'last'}" in err and "Traceback" not in err
    (run / "checkpoints" / "last").symlink_to(target)                   # the fix the message gives
    assert cli.main(["train", "--resume", str(run)]) == 0
