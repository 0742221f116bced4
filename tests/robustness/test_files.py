"""Issue 26, items 1, 2, 4 and 9: every rewrite of a run file is atomic (a kill during the metrics
rewrite on resume loses nothing), a full disk is a clear error that keeps what was there, a torn last
metrics line is dropped on resume, weight files carry checksums verified on load, and files follow the
user's umask."""
import errno
import re
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import toy_task  # noqa: F401  (registers "toy_sets")
import modwire
from modwire import cli, from_pretrained
from modwire.errors import UserError
from modwire.files import DiskFullError, append_line, atomic_write_text, read_lines
from modwire.training import load_config, train
from modwire.training.checkpoint import CheckpointWriteError

SRC = Path(__file__).resolve().parents[2] / "src"


def cfg(out, *extra):
    return load_config(None, [f"out_dir={out}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                              "epochs=2", "optim.lr=3e-3", "progress=false", "log_every=1", *extra])


# ----------------------------------------------------------------------------- atomic rewrites

KILLED_MID_WRITE = textwrap.dedent("""
    import builtins, io, os, signal, sys
    from pathlib import Path

    real_open = io.open

    class Dying:                                 # writes half of what it is given, then SIGKILL
        def __init__(self, f):
            self.f = f
        def write(self, data):
            self.f.write(data[:len(data) // 2])
            self.f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        def __getattr__(self, name):
            return getattr(self.f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    def dying_open(file, mode="r", *a, **k):
        f = real_open(file, mode, *a, **k)
        return Dying(f) if ("w" in mode or "a" in mode) and "metrics" in str(file) else f

    builtins.open = io.open = dying_open
    from modwire.training.feedback import MetricsLog
    MetricsLog(Path(sys.argv[1]), True, 3).close()   # resume at step 3: drop the records after it
""")


def test_a_kill_during_the_metrics_rewrite_on_resume_keeps_every_record(tmp_path):
    """The rewrite that drops records after the resumed step, killed in the middle of writing: the
    file still holds every record (the former in-place rewrite left half a file)."""
    full = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 1001))
    (tmp_path / "metrics.jsonl").write_text(full)
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path)],
                          env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == full


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text("old\n")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(DiskFullError, match=r"no space left to write .*config.yaml: it needs about 4 bytes, "
                                            r"[\d,]+ bytes free on its file system; the previous version is kept"):
        atomic_write_text(path, "new\n")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


# ----------------------------------------------------------------------------- full disks

def test_safetensors_reporting_a_full_disk_is_a_clear_error_keeping_the_previous_checkpoint(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    import safetensors.torch as st

    run, real, calls = tmp_path / "run", st.save_file, []

    def save_until_full(tensors, filename, *a, **k):
        calls.append(filename)
        if len(calls) >= 2:          # the second checkpoint's weights: the disk is full
            Path(filename).write_bytes(b"partial")
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                  'message: "No space left on device" })')
        return real(tensors, filename, *a, **k)

    monkeypatch.setattr(st, "save_file", save_until_full)
    with pytest.raises(CheckpointWriteError, match=r"last-00000004: no space left to write .*: it needs about "
                                                   r"[\d,]+ bytes.*the run's checkpoint 'last' \(step 2, "
                                                   r".*last-00000002\) is kept"):
        train(cfg(run, "checkpoint_every=2"))
    monkeypatch.undo()
    assert os.readlink(run / "checkpoints" / "last") == "last-00000002"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last", "last-00000002"]
    assert train(cfg(run, "checkpoint_every=2"), resume=True)["step"] == 8


def _write_then_full(room):
    """``os.write`` that lands ``room`` bytes, then finds the disk full (a short write, then ENOSPC)."""
    real, calls = os.write, []

    def write(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, bytes(data[:room]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write


def test_a_full_disk_while_appending_metrics_leaves_no_torn_line_and_a_clear_cli_error(tmp_path, monkeypatch,
                                                                                     capsys):
    log = tmp_path / "log.jsonl"
    append_line(log, '{"step": 1}')
    monkeypatch.setattr("modwire.files.os.write", _write_then_full(5))
    with pytest.raises(DiskFullError, match="no space left to write .*log.jsonl: it needs about 12 bytes"):
        append_line(log, '{"step": 2}')
    monkeypatch.undo()
    assert log.read_text() == '{"step": 1}\n'         # cut back: no half record

    run = tmp_path / "run"
    from modwire.training import feedback
    calls = []
    real_append = feedback.append_line

    def full_at_fifth(path, line):
        calls.append(line)
        if len(calls) == 5:
            raise DiskFullError(f"no space left to write {path}: it needs about 80 bytes, 0 bytes free on its "
                                f"file system; the previous version is kept")
        real_append(path, line)

    monkeypatch.setattr(feedback, "append_line", full_at_fifth)
    config = run.parent / "c.yaml"
    config.write_text(f"out_dir: {run}\nmodel: {{name: nac_micro}}\ndata: {{task: toy_sets, batch_size: 16}}\n"
                      f"epochs: 2\nprogress: false\nlog_every: 1\n")
    assert cli.main(["train", str(config)]) == 1
    err = capsys.readouterr().err
    assert "modwire train: error: no space left to write" in err and "Traceback" not in err


def test_a_torn_last_metrics_line_is_dropped_with_a_warning_on_resume(tmp_path):
    run = tmp_path / "run"
    train(cfg(run, "epochs=1"))
    metrics = run / "metrics.jsonl"
    records = read_lines(metrics)
    with metrics.open("a") as f:
        f.write('{"step": 99, "lo')                    # a kill (or a full disk) mid-append
    with pytest.warns(UserWarning, match="metrics.jsonl: its last line was cut off"):
        out = train(cfg(run, "epochs=2"), resume=True, allow_change=["epochs"])
    assert out["status"] == "finished"
    after = read_lines(metrics)
    assert after[:len(records)] == records and all(json.loads(line) for line in after)
    assert not any('"lo' in line and "loss" not in line for line in after)


# ----------------------------------------------------------------------------- checksums, permissions

def test_save_pretrained_writes_checksums_that_from_pretrained_verifies(tmp_path):
    model = modwire.create_model("nac_micro")
    d = model.save_pretrained(tmp_path / "m")
    manifest = json.loads((d / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["model.safetensors"]          # config.json stays editable
    from_pretrained(d)                                  # intact: loads
    raw = bytearray((d / "model.safetensors").read_bytes())
    raw[-3] ^= 0x40                                     # one bit inside a tensor
    (d / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(UserError, match=r"model.safetensors is corrupted: its sha256 differs"):
        from_pretrained(d)


def test_a_damaged_fid_classifier_is_a_clear_error(tmp_path):
    from modwire.training.gan_metrics import ClassifierFID, FeatureClassifier

    import numpy as np

    scorer = ClassifierFID(FeatureClassifier(1, 3), np.zeros(4), np.eye(4), "cpu")
    scorer.save(tmp_path / "fid_classifier")
    ClassifierFID.load(tmp_path / "fid_classifier", 1, 3, "cpu")     # intact
    (tmp_path / "fid_classifier" / "real_stats.safetensors").write_bytes(b"<html>not a file</html>")
    with pytest.raises(UserError, match=r"the FID classifier in .*fid_classifier cannot be used .*real_stats."
                                        r"safetensors is corrupted.*delete .*fid_classifier and evaluate again"):
        ClassifierFID.load(tmp_path / "fid_classifier", 1, 3, "cpu")


def test_written_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        run = tmp_path / "run"
        train(cfg(run, "epochs=1", "ema_decay=0.9"))
        d = modwire.create_model("nac_micro").save_pretrained(tmp_path / "m")
    finally:
        os.umask(old)
    files = [d / "model.safetensors", d / "config.json", d / "manifest.json", run / "metrics.jsonl",
             run / "config.yaml", *(run / "checkpoints" / "last").resolve().iterdir()]
    assert "live.safetensors" in {f.name for f in files}
    modes = {str(f.relative_to(tmp_path)): oct(f.stat().st_mode & 0o777) for f in files}
    assert set(modes.values()) == {"0o644"}, modes


@pytest.mark.parametrize("code,said", [(errno.ENOSPC, r"no space left to write /x/y: it has [\d,]+ bytes free|free space unknown"),
                                       (errno.EROFS, r"cannot write /x/y: Read-only file system"),
                                       (errno.EACCES, r"cannot access /x/y: Permission denied")])
def test_a_failed_write_or_access_is_one_sentence_naming_the_file(code, said):
    """The central handler's wording (modwire.files.write_error): a read refused with EACCES is not
    called a write; any other OSError is not its to word (None: the command then reports a bug)."""
    from modwire.files import write_error

    assert re.search(said, write_error(OSError(code, os.strerror(code), "/x/y")))
    assert write_error(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/x/y")) is None
