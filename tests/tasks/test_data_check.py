"""Unreadable files: ``check_dataset`` lists every one before a run; during a run an image loader
raises ``BadSampleError`` (path, reason) and ``SkipBadSamples`` + its collate drop such items, counted."""
import io
import json
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from modwire.tasks import build_dataset
from modwire.tasks.base import BadSampleError, DropBadSamples, SkipBadSamples
from modwire.tasks.check import check_dataset, check_image
from task_fixtures import write_mnist_m, write_pgm

HTML = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please sign in</body></html>\n"
LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"4d" * 32 + b"\nsize 20431\n"


def _jpeg_bytes(size=(32, 32)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture
def folders(tmp_path):
    """``train/{a,b}/``: 3 good PNGs per class (grey level 10 * item), an HTML page saved as ``a/3.jpg``,
    a truncated JPEG ``b/3.jpg``."""
    for c, cls in enumerate("ab"):
        (tmp_path / "train" / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (6, 6), (10 * (3 * c + i),) * 3).save(tmp_path / "train" / cls / f"{i}.png")
    (tmp_path / "train" / "a" / "3.jpg").write_bytes(HTML)
    jpeg = _jpeg_bytes()
    (tmp_path / "train" / "b" / "3.jpg").write_bytes(jpeg[:len(jpeg) - 300])    # cut in the pixel data
    return tmp_path


def test_check_lists_every_unreadable_file_with_its_reason(folders):
    report = check_dataset("image_folder", "train", {"root": str(folders), "image_size": 6}, workers=2)
    assert report.mode == "decode" and report.checked == report.items == 8 and not report.ok and report.exit_code == 1
    bad = {b.path: b for b in report.bad}
    html, cut = str(folders / "train" / "a" / "3.jpg"), str(folders / "train" / "b" / "3.jpg")
    assert sorted(bad) == [html, cut]
    assert bad[html].index == 3 and "a text file, not an image: it looks like an HTML page" in bad[html].reason
    assert bad[cut].index == 7 and "truncated" in bad[cut].reason.lower()
    text = report.summary()
    assert text.splitlines()[0].startswith("task 'image_folder', split 'train': 8 image files fully decoded with Pillow")
    assert "2 unreadable" in text and f"  {html}: a text file" in text and f"  {cut}: " in text
    assert json.loads(json.dumps(report.to_dict()))["bad"][0]["path"] in (html, cut)


def test_verify_mode_is_structural_only(folders):
    report = check_dataset("image_folder", "train", {"root": str(folders), "image_size": 6}, mode="verify")
    assert [b.path for b in report.bad] == [str(folders / "train" / "a" / "3.jpg")]  # a cut JPEG passes verify()
    assert check_image(folders / "train" / "b" / "3.jpg", "verify") is None
    assert "truncated" in check_image(folders / "train" / "b" / "3.jpg", "decode")
    assert check_image(folders / "train" / "a" / "0.png") is None


def test_a_clean_split_and_the_warnings_of_building_it(tmp_path):
    for i in range(2):
        (tmp_path / "train" / "only").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (i, i, i)).save(tmp_path / "train" / "only" / f"{i}.png")
    (tmp_path / "train" / "only" / "2.png").write_bytes(LFS)          # left out at build time, with a warning
    report = check_dataset("image_folder", "train", {"root": str(tmp_path)})
    assert report.ok and report.exit_code == 0 and report.checked == 2
    assert any("one class folder only" in w for w in report.warnings)
    assert any("1 git-lfs placeholder" in w and "git lfs pull" in w for w in report.warnings)
    assert "all readable" in report.summary() and "warnings while building the split" in report.summary()


def test_datasets_without_image_files_are_read_item_by_item(tmp_path):
    write_pgm(tmp_path, "test", n=3)
    (tmp_path / "PGM_neutral_test_1.npz").write_bytes(HTML)
    report = check_dataset("pgm", "test", {"root": str(tmp_path), "panel_size": 40})
    assert report.mode == "items" and report.checked == 3 and len(report.bad) == 1
    assert report.bad[0].index == 1 and report.bad[0].path == str(tmp_path / "PGM_neutral_test_1.npz")
    assert "HTML page" in report.bad[0].reason


def test_mnist_m_image_files_are_checked_inside_the_digits_multitask(tmp_path):
    write_mnist_m(tmp_path / "mm", n=3)
    (tmp_path / "mm" / "mnist_m_test" / "00000001.png").write_bytes(HTML)
    report = check_dataset("digits_multitask", "test", {"mnist_m_root": str(tmp_path / "mm"), "sources": ["mnist_m"]})
    assert report.mode == "decode" and report.checked == 3
    assert [(b.index, b.path) for b in report.bad] == [(1, str(tmp_path / "mm" / "mnist_m_test" / "00000001.png"))]


def test_check_refuses_an_unknown_mode(folders):
    with pytest.raises(ValueError, match=r"mode must be one of \['decode', 'verify', 'items'\], got 'fast'"):
        check_dataset("image_folder", "train", {"root": str(folders)}, mode="fast")


# ---------------------------------------------------------------- during training

def test_image_loaders_raise_bad_sample_error_with_path_and_reason(folders, tmp_path):
    ds = build_dataset("image_folder", "train", root=folders, image_size=6)
    with pytest.raises(BadSampleError, match=r"3.jpg: not an image Pillow can decode: a text file") as e:
        ds[3]
    assert e.value.path == folders / "train" / "a" / "3.jpg" and "HTML page" in e.value.reason
    assert e.value.task == "image_folder" and isinstance(e.value, ValueError)
    again = pickle.loads(pickle.dumps(e.value))                 # as a DataLoader worker hands it over
    assert type(again) is BadSampleError and again.path == e.value.path and str(again) == str(e.value)
    write_mnist_m(tmp_path / "mm", n=2)
    (tmp_path / "mm" / "mnist_m_train" / "00000000.png").write_bytes(LFS)
    with pytest.raises(BadSampleError, match=r"a git-lfs placeholder of content that was never fetched.*git lfs pull"):
        build_dataset("mnist_m", "train", root=tmp_path / "mm")[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_drops_bad_items_from_their_batch_and_counts_them(folders, workers):
    ds = SkipBadSamples(build_dataset("image_folder", "train", root=folders, image_size=6))
    loader = DataLoader(ds, batch_size=4, shuffle=False, num_workers=workers, collate_fn=ds.collate_fn())
    batches = list(loader)
    assert [len(y) for _, y in batches] == [3, 3]                 # items 3 and 7 dropped
    assert [y.tolist() for _, y in batches] == [[0, 0, 0], [1, 1, 1]]
    grey = [round(float(v) * 255) for x, _ in batches for v in x[:, 0, 0, 0]]
    assert grey == [0, 10, 20, 30, 40, 50]
    assert ds.skipped == 2
    recent = sorted(ds.recent())                                  # workers record in the order they finish
    assert recent == [(3, folders / "train" / "a" / "3.jpg"), (7, folders / "train" / "b" / "3.jpg")]
    assert ds.summary().startswith("skipped 2 unreadable samples (data.bad_samples: skip), e.g. ")
    assert f"3: {recent[0][1]}" in ds.summary() and f"7: {recent[1][1]}" in ds.summary()
    assert ds.classes == ["a", "b"]                               # the dataset's attributes pass through


def test_a_batch_of_bad_items_only_collates_to_none_and_the_wrapper_pickles(folders):
    ds = SkipBadSamples(build_dataset("image_folder", "train", root=folders, image_size=6))
    collate = pickle.loads(pickle.dumps(ds.collate_fn()))
    assert collate([ds[3], ds[7]]) is None and ds.skipped == 2
    x, y = collate([ds[0], ds[3]])
    assert x.shape == (1, 3, 6, 6) and y.tolist() == [0]
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.skipped == 3 and len(copy) == 8
    assert DropBadSamples(lambda items: len(items))([None, 1, 2]) == 2
    with pytest.raises(BadSampleError):                           # "stop": the error itself
        ds.dataset[3]
    assert torch.equal(ds[0][0], ds.dataset[0][0])
