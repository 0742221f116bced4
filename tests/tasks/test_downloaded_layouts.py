"""Datasets as public copies come: one class folder, a valid file of another corpus, extra Tiny-ImageNet
folders and validation rows, an empty idx file before the real one, a byte-order mark, named WikiText
files, git-lfs / git-annex placeholders. Tiny fixtures written here in the official layouts."""
import os
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from modwire.tasks import build_dataset, describe_task
from modwire.tasks.loaders import images as images_module
from modwire.tasks.loaders import wikitext
from task_fixtures import write_idx, write_mnist

LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"4d" * 32 + b"\nsize 20431\n"
ANNEX_POINTER = b"/annex/objects/SHA256E-s20431--" + b"ab" * 32 + b".png\n"


def _png(path, rgb, size=(6, 6)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, rgb).save(path)


def _annex_link(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("../../.git/annex/objects/Ab/Cd/SHA256E-s1--x.png/SHA256E-s1--x.png", path)


# ---------------------------------------------------------------- item 7: one class, a corpus of another vocabulary

def test_a_single_class_folder_is_named_in_a_warning(tmp_path):
    _png(tmp_path / "train" / "cats" / "0.png", (10, 20, 30))
    _png(tmp_path / "train" / "cats" / "1.png", (40, 50, 60))
    with pytest.warns(UserWarning, match=rf"{tmp_path / 'train'} holds one class folder only, 'cats'"):
        ds = build_dataset("image_folder", "train", root=tmp_path, image_size=6)
    assert len(ds) == 2 and int(ds[1][1]) == 0 and round(float(ds[1][0][2, 0, 0]) * 255) == 60
    _png(tmp_path / "train" / "dogs" / "0.png", (0, 0, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(build_dataset("image_folder", "train", root=tmp_path, image_size=6)) == 3


def _corpus(root, train, valid, test=" a b . \n", bom=False):
    d = root / "wikitext-2"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        (d / f"wiki.{name}.tokens").write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return root


def test_a_split_mostly_out_of_the_vocabulary_is_named_with_its_share(tmp_path):
    root = _corpus(tmp_path, train=" the cat sat on the mat . \n" * 3, valid=" der Hund lief weg . \n")
    with pytest.warns(UserWarning, match=r"80.0% of the 5 words of split 'val' \(.*wiki.valid.tokens\) are not in "
                                         r"the vocabulary of the train file .*wiki.train.tokens and become <unk>"):
        val = build_dataset("wikitext2", "val", root=root, seq_len=2)
    vocab = val.vocab
    assert val.ids.tolist() == [vocab.index(w) for w in ["<unk>"] * 4 + [".", "<eos>"]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # "a b ." is 2 of 3 words out: 66.7% > 50% warns...
        build_dataset("wikitext2", "train", root=root, seq_len=2)   # ...but train itself never is
    with pytest.warns(UserWarning, match=r"66.7% of the 3 words of split 'test'"):
        build_dataset("wikitext2", "test", root=root, seq_len=2)


# ---------------------------------------------------------------- item 10: Tiny-ImageNet with extra folders

WNIDS = [f"n{i:08d}" for i in range(200)]
EXTRA = ["n99999991", "n99999992"]


def _tiny(root, wnids=WNIDS, train=WNIDS + EXTRA, rows=()):
    """``wnids.txt`` = ``wnids``; empty ``train/<wnid>/`` folders for ``train``; one validation image per
    row ``(wnid, grey level)``."""
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for w in train:
        (root / "train" / w / "images").mkdir(parents=True)
    lines = []
    for i, (w, grey) in enumerate(rows):
        Image.new("RGB", (64, 64), (grey,) * 3).save(root / "val" / "images" / f"val_{i}.png")
        lines.append(f"val_{i}.png\t{w}\t0\t0\t10\t10\n")
    (root / "val" / "val_annotations.txt").write_text("".join(lines))


def test_extra_tiny_imagenet_folders_and_their_validation_rows_are_named_and_skipped(tmp_path):
    rows = [(WNIDS[3], 30), (EXTRA[0], 60), (WNIDS[199], 90), (EXTRA[1], 120), (EXTRA[0], 150), (WNIDS[0], 180)]
    _tiny(tmp_path, rows=rows)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        val = build_dataset("tiny_imagenet", "val", root=tmp_path)
    said = [str(w.message) for w in caught]
    assert any(f"ignored 2 folders of {tmp_path / 'train'} that are not a class of {tmp_path / 'wnids.txt'}: "
               f"{EXTRA[0]}, {EXTRA[1]}" in m for m in said), said
    assert any(f"skipped 3 of the 6 rows of {tmp_path / 'val' / 'val_annotations.txt'} name a wnid that is not one "
               f"of the 200 classes" in m and f"{EXTRA[0]} (2 rows), {EXTRA[1]} (1 row)" in m for m in said), said
    assert val.classes == WNIDS and len(val) == 3
    assert [int(val[i][1]) for i in range(3)] == [3, 199, 0]
    assert [round(float(val[i][0][0, 5, 5]) * 255) for i in range(3)] == [30, 90, 180]


def test_more_than_200_listed_ids_name_those_without_validation_rows(tmp_path):
    _tiny(tmp_path, wnids=WNIDS + EXTRA, rows=[(w, 0) for w in WNIDS])
    with pytest.raises(ValueError, match=rf"202 WordNet ids with a train/<wnid>/ folder, expected 200.*2 of them have "
                                         rf"no row in .*val_annotations.txt.*: {EXTRA[0]}, {EXTRA[1]}"):
        build_dataset("tiny_imagenet", "val", root=tmp_path)


def test_tiny_imagenet_train_placeholders_are_left_out_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(images_module, "TINY_CLASSES", 2)
    _tiny(tmp_path, wnids=["n1", "n2"], train=["n1", "n2"], rows=[("n2", 7)])
    _png(tmp_path / "train" / "n1" / "images" / "a.png", (1, 2, 3), (64, 64))
    _png(tmp_path / "train" / "n2" / "images" / "b.png", (4, 5, 6), (64, 64))
    (tmp_path / "train" / "n2" / "images" / "c.png").write_bytes(LFS)
    with pytest.warns(UserWarning, match=r"left out 1 of the 3 image files .*1 git-lfs placeholder .*c.png.*git lfs pull"):
        train = build_dataset("tiny_imagenet", "train", root=tmp_path)
    assert len(train) == 2 and [int(train[i][1]) for i in range(2)] == [0, 1]
    assert round(float(train[1][0][2, 0, 0]) * 255) == 6


# ---------------------------------------------------------------- item 12: MNIST candidates, BOM, files=, placeholders

def test_an_empty_idx_file_before_the_real_one_is_skipped_and_named(tmp_path):
    data = write_mnist(tmp_path, n=3)                                     # train-images-idx3-ubyte.gz
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"")               # tried first: empty
    with pytest.warns(UserWarning, match=r"read .*train-images-idx3-ubyte.gz, skipping the unreadable .* found before "
                                         r"it: .*train-images-idx3-ubyte \(the file is empty, not an idx file"):
        ds = build_dataset("mnist", "train", root=tmp_path)
    x, y = ds[2]
    assert int(y) == int(data["train"][1][2])
    assert torch.equal((x[0, 2:30, 2:30] * 255).round().to(torch.uint8), torch.from_numpy(data["train"][0][2]))


def test_when_no_idx_candidate_is_readable_each_is_named(tmp_path):
    write_mnist(tmp_path, n=3)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"")
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"<html>gone</html>")
    with pytest.raises(ValueError, match=r"none of the 2 candidates .* is readable: .*train-images-idx3-ubyte: the "
                                         r"file is empty.*train-images-idx3-ubyte.gz: a text file"):
        build_dataset("mnist", "train", root=tmp_path)
    (tmp_path / "raw").mkdir()
    write_idx(tmp_path / "raw" / "train-images-idx3-ubyte.gz", np.full((3, 28, 28), 9, np.uint8))
    with pytest.warns(UserWarning, match="skipping the unreadable"):        # <root>/raw/ is tried after <root>/
        assert float(build_dataset("mnist", "train", root=tmp_path)[0][0][0, 10, 10]) == pytest.approx(9 / 255)


def test_a_byte_order_mark_is_not_a_word(tmp_path):
    root = _corpus(tmp_path, train="the cat sat . \n", valid="the cat . \n", bom=True)
    vocab = wikitext.vocabulary(root)
    assert vocab[:2] == ("the", "cat") and not any("\ufeff" in w for w in vocab)
    val = build_dataset("wikitext2", "val", root=root, seq_len=2)
    assert val.ids.tolist() == [vocab.index(w) for w in ("the", "cat", ".", "<eos>")]


def test_wikitext_files_are_named_by_a_task_parameter(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "tr.txt").write_text("one two three two . \n", encoding="utf-8")
    (tmp_path / "corpus" / "va.txt").write_text("two one . \n", encoding="utf-8")
    files = {"train": "corpus/tr.txt", "valid": "corpus/va.txt"}           # relative to root
    assert describe_task("wikitext2", {"root": str(tmp_path), "files": files}).num_classes == 6   # 5 words + <eos>
    val = build_dataset("wikitext2", "val", root=tmp_path, files=files, seq_len=2)
    vocab = val.vocab
    assert vocab[:4] == ("one", "two", "three", ".") and val.ids.tolist() == [1, 0, 3, 4]
    with pytest.raises(FileNotFoundError, match=r"no wiki.test.tokens; tried"):   # not named: the default place
        build_dataset("wikitext2", "test", root=tmp_path, files=files, seq_len=2)
    with pytest.raises(KeyError, match=r"parameter 'files': unknown split 'tarin'.*Did you mean \['train'\]"):
        describe_task("wikitext2", {"root": str(tmp_path), "files": {"tarin": "corpus/tr.txt"}})
    with pytest.raises(TypeError, match=r"parameter 'files': got 'corpus/tr.txt' \(str\), expected a mapping"):
        build_dataset("wikitext2", "train", root=tmp_path, files="corpus/tr.txt")
    with pytest.raises(TypeError, match=r"parameter 'files'.train: got 3, expected the path of a text file"):
        build_dataset("wikitext2", "train", root=tmp_path, files={"train": 3})
    with pytest.raises(FileNotFoundError, match=r"files.train: no file .*corpus/missing.txt"):
        build_dataset("wikitext2", "train", root=tmp_path, files={"train": "corpus/missing.txt"})


def test_placeholders_in_an_image_folder_are_named_with_how_to_fetch_them(tmp_path):
    for cls, rgb in (("a", (200, 0, 0)), ("b", (0, 0, 200))):
        _png(tmp_path / "train" / cls / "0.png", rgb)
    (tmp_path / "train" / "a" / "1.png").write_bytes(LFS)
    (tmp_path / "train" / "b" / "1.png").write_bytes(ANNEX_POINTER)
    _annex_link(tmp_path / "train" / "b" / "2.png")
    with pytest.warns(UserWarning) as record:
        ds = build_dataset("image_folder", "train", root=tmp_path, image_size=6)
    said = " ".join(str(w.message) for w in record)
    assert "left out 3 of the 5 image files" in said
    assert "2 git-annex placeholders" in said and "git annex get" in said
    assert "1 git-lfs placeholder" in said and "git lfs pull" in said and "1.png" in said
    assert len(ds) == 2 and [int(ds[i][1]) for i in range(2)] == [0, 1]
    assert round(float(ds[1][0][2, 3, 3]) * 255) == 200
    (tmp_path / "train" / "a" / "0.png").write_bytes(LFS)
    (tmp_path / "train" / "b" / "0.png").unlink()
    _annex_link(tmp_path / "train" / "b" / "0.png")
    with pytest.raises(FileNotFoundError, match=r"all 5 image files under .*train are placeholders") as e:
        build_dataset("image_folder", "train", root=tmp_path, image_size=6)
    assert "3 git-annex placeholders" in str(e.value) and "git annex get" in str(e.value)
    assert "2 git-lfs placeholders" in str(e.value) and "git lfs pull" in str(e.value)


def test_placeholders_in_imagenet_class_folders(tmp_path):
    _png(tmp_path / "train" / "n01" / "a.png", (0, 0, 0))
    _png(tmp_path / "val" / "n01" / "a.png", (9, 9, 9))
    (tmp_path / "val" / "n01" / "b.png").write_bytes(LFS)
    with pytest.warns(UserWarning, match=r"imagenet: left out 1 of the 2 image files .*git-lfs"):
        val = build_dataset("imagenet", "val", root=tmp_path, image_size=6)
    assert len(val) == 1 and round(float(val[0][0][1, 2, 2]) * 255) == 9


# ---------------------------------------------------------------- item 13: ImageNet's layout, values round trip

def test_imagenet_train_and_val_folders_labels_and_pixels(tmp_path):
    rng = np.random.default_rng(0)
    pixels = {}
    for split, wnids in (("train", ["n03", "n01", "n02"]), ("val", ["n02", "n03"])):
        for w in wnids:
            arr = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            (tmp_path / split / w).mkdir(parents=True)
            Image.fromarray(arr).save(tmp_path / split / w / "x.png")           # lossless
            pixels[split, w] = arr
    val = build_dataset("imagenet", "val", root=tmp_path, image_size=8)
    assert val.classes == ["n01", "n02", "n03"]                 # sorted train folders, whatever val holds
    assert [int(val[i][1]) for i in range(2)] == [1, 2]
    for i, w in enumerate(["n02", "n03"]):
        assert torch.equal((val[i][0] * 255).round().to(torch.uint8), torch.from_numpy(pixels["val", w]).permute(2, 0, 1))
    train = build_dataset("imagenet", "train", root=tmp_path, image_size=8)
    assert [int(train[i][1]) for i in range(3)] == [0, 1, 2] and train.targets.tolist() == [0, 1, 2]
    assert torch.equal((train[0][0] * 255).round().to(torch.uint8), torch.from_numpy(pixels["train", "n01"]).permute(2, 0, 1))
