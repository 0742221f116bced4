"""Issue 26, item 4: a run has an identity (``RUN_DIR/run_id``) that each of its checkpoints carries; a
resume refuses a ``last`` checkpoint another run wrote (copied or linked in by hand)."""
import json
import os
import shutil

import pytest

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire.errors import UserError
from modwire.training import load_config, train
from modwire.training.checkpoint import load_state
from training_helpers import train_toy_run


def _cfg(out, *extra):
    return load_config(None, [f"out_dir={out}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                              "progress=false", *extra])


def _records(run):
    return (run / "metrics.jsonl").read_text().splitlines()


def test_each_checkpoint_carries_its_runs_id_and_another_runs_checkpoint_is_refused(tmp_path):
    a = train_toy_run(tmp_path / "a", "max_steps=2")
    ident = (a / "run_id").read_text().strip()
    assert len(ident) == 32 and int(ident, 16) >= 0
    last = a / "checkpoints" / "last"
    assert json.loads((last / "checkpoint.json").read_text())["run_id"] == ident
    assert load_state(last)["run_id"] == ident
    b = train_toy_run(tmp_path / "b", "max_steps=2", "seed=1")
    other = (b / "run_id").read_text().strip()
    assert other != ident                                            # a new run, a new identity
    own, before = last.resolve(), _records(a)
    shutil.copytree(b / "checkpoints" / "last", a / "checkpoints" / "last-99999999")
    for target in ("last-99999999", str((b / "checkpoints" / "last").resolve())):   # copied in, or linked
        last.unlink()
        os.symlink(target, last)
        with pytest.raises(UserError, match=rf"written by another run \(run id {other}; this run's is {ident}.*"
                                            r"copied or linked in by hand.*finetune.init="):
            train(_cfg(a, "max_steps=3"), resume=True, allow_change=["max_steps"])
        assert _records(a) == before                                 # nothing written
    last.unlink()
    os.symlink(own.name, last)                                       # its own checkpoint back: resumes
    assert train(_cfg(a, "max_steps=3"), resume=True, allow_change=["max_steps"])["step"] == 3
    assert (a / "run_id").read_text().strip() == ident
    assert json.loads((last / "checkpoint.json").read_text())["run_id"] == ident


def test_a_lost_id_file_is_taken_from_the_checkpoint_and_overwrite_makes_a_new_one(tmp_path):
    run = train_toy_run(tmp_path / "a", "max_steps=2")
    ident = (run / "run_id").read_text().strip()
    (run / "run_id").unlink()
    assert train(_cfg(run, "max_steps=3"), resume=True, allow_change=["max_steps"])["step"] == 3
    assert (run / "run_id").read_text().strip() == ident
    train(_cfg(run, "max_steps=2"), overwrite=True)
    assert (run / "run_id").read_text().strip() != ident


def test_a_best_checkpoint_of_another_run_is_refused_on_resume_and_by_eval(tmp_path, capsys):
    """Issue 36, item 5: ``best`` swapped for another run's (copied in, or linked) is refused by a resume,
    which would keep it as this run's best, and by eval / analyze / finetune, which would score it as
    this run's; each error names both run ids."""
    from modwire import cli

    a = train_toy_run(tmp_path / "a", "max_steps=2")
    b = train_toy_run(tmp_path / "b", "max_steps=2", "seed=1")
    mine, theirs = ((r / "run_id").read_text().strip() for r in (a, b))
    best = a / "checkpoints" / "best"
    own = os.readlink(best)
    shutil.copytree(b / "checkpoints" / "best", a / "checkpoints" / "best-99999999")
    for target in ("best-99999999", str((b / "checkpoints" / "best").resolve())):
        best.unlink()
        os.symlink(target, best)
        with pytest.raises(UserError, match=rf"--resume .*checkpoint .*written by another run \(run id {theirs}; "
                                            rf"this run's is {mine}"):
            train(_cfg(a, "max_steps=3"), resume=True, allow_change=["max_steps"])
        for command in (["eval", str(a)], ["analyze", str(a), "--no-plots", "--drop", "0"],
                        ["finetune", str(a), "--task", "toy_sets", "--seeds", "0", "--epochs", "1"]):
            assert cli.main(command) == 2, command
            err = capsys.readouterr().err
            assert f"run {a}: checkpoint" in err and f"written by another run (run id {theirs}" in err, err
            assert "Traceback" not in err
    best.unlink()
    os.symlink(own, best)
    assert cli.main(["eval", str(a)]) == 0                          # its own best back: scored
    assert train(_cfg(a, "max_steps=3"), resume=True, allow_change=["max_steps"])["step"] == 3
