"""Command-line usage a user types without reading the help twice: each form either does
what it says or is refused; none is silently ignored."""
import pytest

from modwire import cli


@pytest.mark.parametrize("command", [["train", "c.yaml"], ["eval", "runs/x"], ["analyze", "runs/x"]])
def test_repeated_set_options_all_apply(command):
    # `--set a=1 --set b=2` used to keep only the last option's keys: a=1 was dropped silently
    args = cli._parser().parse_args([*command, "--set", "optim.lr=nan", "x=1", "--set", "out_dir=runs/o"])
    assert args.overrides == ["optim.lr=nan", "x=1", "out_dir=runs/o"]


def test_repeated_set_reaches_validation(tmp_path, capsys):
    code = cli.main(["train", "--set", "optim.lr=nan", "--set", f"out_dir={tmp_path / 'run'}"])
    assert code == 2
    assert "config key 'optim.lr': got nan" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_resume_with_overwrite_is_refused_and_nothing_is_deleted(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "last-00000002").mkdir(parents=True)
    (run / "checkpoints" / "last-00000002" / "state.pt").write_bytes(b"kept")
    (run / "checkpoints" / "last").symlink_to("last-00000002")
    (run / "config.yaml").write_text(f"out_dir: {run}\n")
    assert cli.main(["train", "--resume", str(run), "--overwrite"]) == 2
    assert "--resume continues the run in" in capsys.readouterr().err
    assert (run / "checkpoints" / "last" / "state.pt").read_bytes() == b"kept"


def test_device_cuda_without_a_gpu_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # also on a machine with a GPU
    code = cli.main(["train", "--set", "device=cuda", "model.name=nac_micro", f"out_dir={tmp_path / 'run'}"])
    assert code == 2
    assert "config key 'device': got 'cuda', but torch" in capsys.readouterr().err


@pytest.mark.parametrize("bug", [KeyError("internal"), TypeError("bad call"), RuntimeError("boom")])
def test_a_bug_in_modwire_shows_its_traceback_and_says_so(monkeypatch, capsys, bug):
    """Issue 24: only a UserError is the user's mistake (exit 2, one line); anything else is a bug."""
    from modwire import cli

    def broken(args):
        raise bug

    monkeypatch.setattr(cli, "cmd_list", broken)
    assert cli.main(["list", "models"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "internal error" in err and "a bug in modwire" in err


def test_a_user_error_is_one_line_with_exit_2(tmp_path, capsys):
    from modwire import cli

    run = tmp_path / "run"
    assert cli.main(["train", "--set", "model.name=nac_micr", "data.task=triangle", f"out_dir={run}"]) == 2
    assert not run.exists()                     # nothing touched the disk (not even the run lock)
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "nac_micro" in err


@pytest.mark.parametrize("command", [["list", "models"], ["list", "tasks"], ["reproduce", "--list"]])
def test_a_closed_stdout_ends_quietly(command):
    """Issue 36, item 3: `modwire list models | head -1`: the reader has gone before the output is written;
    the command stops with 141 (as a Unix tool stopped by SIGPIPE), no traceback, no "bug in modwire"."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(cli.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "modwire", *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=Path(src).parent, env=env)
    proc.stdout.close()                     # the reader quits before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == cli.SIGPIPE_EXIT and err == "", err


def test_a_closed_stdout_inside_a_command_is_not_called_a_bug(monkeypatch, capsys):
    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "cmd_list", closed)
    assert cli.main(["list", "models"]) == cli.SIGPIPE_EXIT
    assert capsys.readouterr().err == ""
