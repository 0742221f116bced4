"""Issue 36, item 2: a run on a real, small file system (a private tmpfs in a user and mount namespace:
``unshare -rm``; skipped where the machine does not allow one). The disk fills while a checkpoint is
written: one line naming the file, the bytes needed and free, and the checkpoint kept; no traceback;
exit 1. After space is freed the run resumes and finishes (its ``best`` written then). A read-only file
system is one line too (the analysis folder is checked before any work). The same faults made by a failing writer: ``test_files.py``,
``test_training_faults.py``."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import modwire

SCRIPT = r'''
import contextlib, io, json, os, subprocess, sys
from pathlib import Path
import toy_task  # noqa: F401
from modwire import cli
from modwire.training.checkpoint import checkpoint_step, load_state

fs, out = Path(sys.argv[1]), Path(sys.argv[2])
run, result = fs / "run", {}

def command(name, *args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(list(args))
    result[name] = {"code": code, "err": err.getvalue()}

fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT)       # leave about 1.2 MB: room for one checkpoint
os.write(fd, b"\0" * (os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize - 1_200_000))
os.close(fd)
command("train", "train", "--set", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
        "progress=false", f"out_dir={run}", "epochs=3", "log_every=1")
last = (run / "checkpoints" / "last").resolve()
result["last_step"] = checkpoint_step(last)
result["last_loads"] = load_state(last)["step"]                # checksums verified
result["metrics_parse"] = all(json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines())
result["leftovers"] = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("."))
(fs / "filler").unlink()                                      # space freed
command("resume", "train", "--resume", str(run))
result["best_step"] = checkpoint_step((run / "checkpoints" / "best").resolve())
subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
command("analyze_ro", "analyze", str(run), "--no-plots")
(out / "result.json").write_text(json.dumps(result))
'''


def _tmpfs_run(tmp_path: Path) -> dict:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare: cannot make a private small file system here")
    fs = tmp_path / "fs"
    fs.mkdir()
    (tmp_path / "script.py").write_text(SCRIPT)
    tests = Path(__file__).resolve().parents[1]
    src = Path(modwire.__file__).resolve().parents[1]
    inner = (f"mount -t tmpfs -o size=6m tmpfs {fs} || exit 77; "
             f"PYTHONPATH={src}:{tests} exec {sys.executable} {tmp_path / 'script.py'} {fs} {tmp_path}")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", inner], capture_output=True, text=True, timeout=600)
    if proc.returncode == 77 or "unshare failed" in proc.stderr or "Operation not permitted" in proc.stderr:
        pytest.skip(f"this machine does not allow a private tmpfs: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text())


def test_a_full_file_system_is_one_line_keeps_the_checkpoint_and_the_run_resumes(tmp_path):
    r = _tmpfs_run(tmp_path)
    train = r["train"]
    assert train["code"] == 1 and "Traceback" not in train["err"], train["err"]
    line = next(l for l in train["err"].splitlines() if l.startswith("modwire train: error:"))
    assert "could not write checkpoint" in line and "/best-00000004: no space left to write" in line
    assert "it needs about" in line and "bytes free on its file system" in line
    assert "the run's checkpoint 'last' (step 4," in line and line.endswith("is kept")
    assert r["last_step"] == r["last_loads"] == 4 and r["metrics_parse"] and r["leftovers"] == []
    resume = r["resume"]
    assert resume["code"] == 0 and "Traceback" not in resume["err"], resume["err"]
    assert r["best_step"] >= 4                      # written on resume if it was the step that failed
    ro = r["analyze_ro"]                            # the output folder is checked before any work: exit 2
    assert ro["code"] == 2 and "Traceback" not in ro["err"], ro["err"]
    assert ro["err"].strip().endswith("/run/analysis cannot be created: Read-only file system"), ro["err"]
