"""Issue 26, item 11: ``modwire data check`` lists every unreadable file of a dataset before training
(exit 1), checks every split the task has (a split that does not exist is reported, not fatal), and
exits 0 on readable data."""
import json

from PIL import Image

from modwire import cli


def _folders(root, bad=True):
    for split in ("train", "val"):
        for c in "ab":
            (root / split / c).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(root / split / c / f"{i}.png")
    if bad:
        (root / "train" / "a" / "page.jpg").write_text("<html><body>Sign in</body></html>")


def test_data_check_lists_the_unreadable_file_and_exits_1(tmp_path, capsys):
    _folders(tmp_path)
    code = cli.main(["data", "check", "--task", "image_folder", "--set", f"data.params.root={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 1
    assert "split 'train': 7 image files" in out and "1 unreadable" in out and "page.jpg" in out
    assert "HTML page" in out and "split 'val': 6 image files" in out and "all readable" in out
    assert "split 'test': not checked" in out


def test_data_check_json_and_a_clean_dataset_exit_0(tmp_path, capsys):
    _folders(tmp_path, bad=False)
    code = cli.main(["data", "check", "--task", "image_folder", "--split", "train", "--json",
                     "--set", f"data.params.root={tmp_path}"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and list(data["reports"]) == ["train"] and data["reports"]["train"]["bad"] == []


def test_a_split_asked_for_by_name_must_exist(tmp_path, capsys):
    _folders(tmp_path, bad=False)
    assert cli.main(["data", "check", "--task", "image_folder", "--split", "test",
                     "--set", f"data.params.root={tmp_path}"]) == 2
    assert "no folder for split 'test'" in capsys.readouterr().err
