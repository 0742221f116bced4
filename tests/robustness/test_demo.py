"""The probe, demo area: bad arguments to ``python -m modwire.demo`` and the ``digits``
task are clear errors (usage error, exit 2, or a ValueError naming what was expected),
never a traceback, and the demo never deletes a directory it did not make."""
import pytest

from modwire import demo
from modwire.tasks import build_dataset
from modwire.tasks.loaders.digits import build_digits


@pytest.mark.parametrize("argv, message", [
    (["--models", "nac_huge"], "invalid choice: 'nac_huge'"),
    (["--drop", "0,1.5"], "--drop: every fraction must be a number in [0, 1)"),
    (["--models", "nac_small"], "--models goes with --race or --forward"),
    (["--steps", "-1"], "--steps must be >= 0"),
])
def test_demo_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_refuses_an_out_dir_it_did_not_make_and_deletes_nothing(tmp_path, capsys):
    other = tmp_path / "my_runs"
    (other / "nac_small").mkdir(parents=True)
    for argv in (["--out-dir", str(other), "--steps", "1"], ["--race", "--out-dir", str(other)]):
        with pytest.raises(SystemExit) as e:
            demo.main(argv)
        assert e.value.code == 2 and (other / "nac_small").is_dir()
        assert "not empty and was not made by the demo" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        demo.main(["--out-dir", str(tmp_path / "file")])
    assert "is a file, expected a directory" in capsys.readouterr().err


@pytest.mark.parametrize("size", [12, 0, -8, 4, 32.0, True, "32"])
def test_digits_bad_size_names_what_was_expected(size):
    with pytest.raises(ValueError, match=rf"task 'digits': parameter 'size': got {size!r}[ ,].*expected an int(eger "
                                         rf">= 8 and a multiple of 8 \(the images are 8x8\)| like its default 32)"):
        build_dataset("digits", "train", size=size)


def test_digits_bad_split_is_named():
    with pytest.raises(ValueError, match="has splits"):
        build_dataset("digits", "validation")
    with pytest.raises(ValueError, match="digits: split must be 'train', 'val' or 'test', got 'dev'"):
        build_digits("dev")
