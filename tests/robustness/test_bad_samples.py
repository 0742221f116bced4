"""Issue 26, item 11: an unreadable image during training stops the run with a clear error naming the
file (``data.bad_samples: stop``, the default), or is dropped from its batch and counted in
``metrics.jsonl`` (``skip``). Item 8: a relative data root is recorded absolute."""
import json

import pytest
from PIL import Image

from modwire.training import load_config, train


def _folders(root):
    for split in ("train", "val"):
        for c in "ab":
            (root / split / c).mkdir(parents=True)
            for i in range(8):
                Image.new("RGB", (8, 8), (30 * i, 80 if c == "a" else 160, 0)).save(root / split / c / f"{i}.png")
    (root / "train" / "a" / "9.png").write_text("<html><body>Sign in to download</body></html>")


def cfg(tmp_path, *extra):
    return load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=vit_micro", "data.task=image_folder",
                              f"data.params.root={tmp_path / 'data'}", "data.params.image_size=16",
                              "data.batch_size=6", "epochs=2", "progress=false", "log_every=1", *extra])


def test_an_unreadable_image_stops_the_run_naming_the_file(tmp_path):
    _folders(tmp_path / "data")
    with pytest.raises(ValueError, match=r"9\.png.*HTML"):
        train(cfg(tmp_path))


def test_skip_drops_it_and_counts_it(tmp_path):
    _folders(tmp_path / "data")
    out = train(cfg(tmp_path, "data.bad_samples=skip"))
    assert out["status"] == "finished"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    counts = [r.get("bad_samples_skipped", 0) for r in records if "loss" in r]
    assert counts[-1] == 2 and counts == sorted(counts)             # one bad file, read once per epoch


def test_a_relative_data_root_is_recorded_absolute_and_a_resume_elsewhere_reads_the_same_data(tmp_path,
                                                                                           monkeypatch):
    """Issue 26, item 8: recorded as given, a relative root made a resume from another directory read
    other data (or none)."""
    from modwire import cli

    (tmp_path / "work").mkdir()
    _folders(tmp_path / "work" / "data")
    (tmp_path / "work" / "data" / "train" / "a" / "9.png").unlink()
    monkeypatch.chdir(tmp_path / "work")
    c = load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=vit_micro", "data.task=image_folder",
                           "data.params.root=data", "data.params.image_size=16", "data.batch_size=6", "epochs=1",
                           "progress=false"])
    train(c)
    recorded = (tmp_path / "run" / "config.yaml").read_text()
    assert f"root: {tmp_path / 'work' / 'data'}" in recorded
    train(c, resume=True, allow_change=["epochs"])       # the relative form still equals the recorded run
    monkeypatch.chdir(tmp_path)                           # elsewhere: "data" would not exist here
    assert cli.main(["train", "--resume", str(tmp_path / "run"), "--set", "epochs=2", "--allow-change", "epochs"]) == 0
