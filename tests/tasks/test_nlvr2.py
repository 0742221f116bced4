"""nlvr2_features: NLVR2 JSON lines + precomputed token features (NAC §4.4, App. G), on tiny
fixtures written here in the official format."""
import json
import pickle

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from torch.utils.data import DataLoader

from modwire.tasks import InputSpec, build_dataset, get_task
from modwire.tasks.loaders import nlvr2

NAME = "nlvr2_features"
D_IMG, D_TXT, N_TOK = 4, 3, 2
LINES = [
    {"identifier": "dev-850-0-0", "sentence": "There are two dogs.", "label": "True", "writer": "w1"},
    {"identifier": "dev-850-0-1", "sentence": "One image shows a cat.", "label": "False"},
    {"identifier": "dev-851-3-0", "sentence": "A boat is near a door.", "label": "False"},
    {"identifier": "dev-852-1-1", "sentence": "Exactly three balls.", "label": "True"},
]
SENT_LEN = {"dev-850-0-0": 1, "dev-850-0-1": 3, "dev-851-3-0": 2, "dev-852-1-1": 1}


def _write_json(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))


def _features(seed=0, d_img=D_IMG, d_txt=D_TXT):
    rng = np.random.default_rng(seed)
    pairs = sorted({ex["identifier"].rsplit("-", 1)[0] for ex in LINES})
    images = {f"{p}-img{k}.png": rng.normal(size=(N_TOK, d_img)).astype(np.float32) for p in pairs for k in (0, 1)}
    texts = {i: rng.normal(size=(m, d_txt)).astype(np.float16) for i, m in SENT_LEN.items()}
    return images, texts


def _save(path, arrays, fmt):
    if fmt == "safetensors":
        save_file(arrays, str(path))
    else:
        with open(path, "wb") as f:  # a file object keeps the name as given (np.savez would add .npz)
            np.savez(f, **arrays)


@pytest.fixture(params=["safetensors", "npz"])
def root(tmp_path, request):
    """dev.json + shared image / text feature files in one format; returns (root, images, texts)."""
    _write_json(tmp_path / "dev.json", LINES)
    images, texts = _features()
    ext = request.param
    _save(tmp_path / f"image_features.{ext}", images, ext)
    _save(tmp_path / f"text_features.{'npz' if ext == 'safetensors' else 'safetensors'}", texts,
          "npz" if ext == "safetensors" else "safetensors")  # the two files in different formats
    return tmp_path, images, texts


def small(root, split="dev", **kw):
    return build_dataset(NAME, split, **{"root": root, "image_dim": D_IMG, "text_dim": D_TXT, **kw})


def test_task_info_and_inputs():
    info = get_task(NAME)
    assert info.kind == "loader" and info.num_classes == 2 and info.collate is nlvr2.collate
    assert info.params["root"] is None and set(info.splits) >= {"train", "val", "dev", "test1"}
    assert info.inputs == {"x": InputSpec.vectors(None, 769), "condition": InputSpec.vectors(None, 512, padded=True)}
    assert info.resolve({"image_dim": 1024, "text_dim": 768, "side_column": False}).inputs == {
        "x": InputSpec.vectors(None, 1024), "condition": InputSpec.vectors(None, 768, padded=True)}


def test_items_equal_the_fixture_features_and_labels(root):
    path, images, texts = root
    ds = small(path)
    assert len(ds) == 4 and ds.image_tokens == N_TOK and ds.skipped == []
    assert [e.sentence for e in ds.examples] == [x["sentence"] for x in LINES]
    for i, line in enumerate(LINES):
        inp, y = ds[i]
        ident = line["identifier"]
        pair = ident.rsplit("-", 1)[0]
        assert set(inp) == {"x", "condition"} and y.dtype == torch.long and y.dim() == 0
        assert int(y) == (line["label"] == "True")
        x, c = inp["x"], inp["condition"]
        assert x.dtype == torch.float32 and x.shape == (2 * N_TOK, D_IMG + 1)
        assert torch.equal(x[:N_TOK, :D_IMG], torch.from_numpy(images[f"{pair}-img0.png"]))  # left first
        assert torch.equal(x[N_TOK:, :D_IMG], torch.from_numpy(images[f"{pair}-img1.png"]))
        assert x[:N_TOK, -1].tolist() == [0.0] * N_TOK and x[N_TOK:, -1].tolist() == [1.0] * N_TOK
        assert c.dtype == torch.float32 and torch.equal(c, torch.from_numpy(texts[ident].astype(np.float32)))
    no_side = small(path, side_column=False)
    assert torch.equal(no_side[2][0]["x"], ds[2][0]["x"][:, :D_IMG])


def test_collate_pads_sentences_with_zero_rows(root):
    path, _, texts = root
    ds = small(path)
    batch, y = next(iter(DataLoader(ds, batch_size=4, collate_fn=get_task(NAME).collate)))
    assert set(batch) == {"x", "condition"} and y.tolist() == [1, 0, 0, 1]
    assert batch["x"].shape == (4, 2 * N_TOK, D_IMG + 1) and batch["condition"].shape == (4, 3, D_TXT)
    for b, line in enumerate(LINES):
        m = SENT_LEN[line["identifier"]]
        assert torch.equal(batch["condition"][b, :m], ds[b][0]["condition"])
        assert batch["condition"][b, m:].abs().sum() == 0
        assert torch.equal(batch["x"][b], ds[b][0]["x"])


def test_pickled_dataset_reopens_its_files(root):
    path, _, _ = root
    ds = small(path)
    ds[0]  # opens the handles
    clone = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker receives
    assert torch.equal(clone[3][0]["x"], ds[3][0]["x"]) and torch.equal(clone[3][0]["condition"],
                                                                        ds[3][0]["condition"])


def test_split_names_layouts_and_explicit_paths(tmp_path):
    images, texts = _features()
    _write_json(tmp_path / "data" / "test1.json", [dict(x, identifier=x["identifier"].replace("dev", "test1"))
                                                  for x in LINES])
    rename = lambda d: {k.replace("dev", "test1"): v for k, v in d.items()}  # noqa: E731
    _save(tmp_path / "test1_image_features.safetensors", rename(images), "safetensors")
    _save(tmp_path / "image_features.safetensors", {}, "safetensors")  # shared file: the per-split one wins
    (tmp_path / "feats").mkdir()
    _save(tmp_path / "feats" / "t.npz", rename(texts), "npz")
    for split in ("test", "test1"):
        ds = small(tmp_path, split, text_features="feats/t.npz")
        assert len(ds) == 4 and ds.examples[0].images == ("test1-850-0-img0.png", "test1-850-0-img1.png")
    # image keys without the .png extension are accepted
    _write_json(tmp_path / "dev.json", LINES)
    _save(tmp_path / "dev_image_features.npz", {k[:-4]: v for k, v in images.items()}, "npz")
    _save(tmp_path / "dev_text_features.npz", texts, "npz")
    ds = small(tmp_path, "val")
    assert torch.equal(ds[0][0]["x"][:N_TOK, :D_IMG], torch.from_numpy(images["dev-850-0-img0.png"]))


# ----------------------------------------------------------------------------- errors


def test_root_and_missing_files_list_every_path_tried(tmp_path):
    with pytest.raises(ValueError, match="root=... is required"):
        build_dataset(NAME, "dev")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        small(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError) as e:
        small(tmp_path, "val")
    assert str(tmp_path / "dev.json") in str(e.value) and str(tmp_path / "data" / "dev.json") in str(e.value)
    _write_json(tmp_path / "dev.json", LINES)
    with pytest.raises(FileNotFoundError, match="no image features file") as e:
        small(tmp_path)
    for name in ("dev_image_features.safetensors", "dev_image_features.npz", "image_features.safetensors",
                 "image_features.npz"):
        assert str(tmp_path / name) in str(e.value)
    images, _ = _features()
    _save(tmp_path / "image_features.npz", images, "npz")
    with pytest.raises(FileNotFoundError, match="no text features file") as e:
        small(tmp_path, text_features="elsewhere.safetensors")
    assert str(tmp_path / "elsewhere.safetensors") in str(e.value)


def test_identifier_without_features(root):
    path, images, texts = root
    del texts["dev-851-3-0"]
    del images["dev-852-1-img1.png"]
    _save(path / "dev_text_features.npz", texts, "npz")
    _save(path / "dev_image_features.npz", images, "npz")
    with pytest.raises(ValueError, match="2 of 4 examples") as e:
        small(path)
    msg = str(e.value)
    assert "dev-851-3-0 (dev.json line 3): no key text 'dev-851-3-0'" in msg
    assert "dev-852-1-1 (dev.json line 4): no key image 'dev-852-1-img1.png'" in msg
    assert str(path / "dev_image_features.npz") in msg and "skip_missing=True" in msg
    ds = small(path, skip_missing=True)
    assert [e.identifier for e in ds.examples] == ["dev-850-0-0", "dev-850-0-1"]
    assert ds.skipped == ["dev-851-3-0", "dev-852-1-1"]


@pytest.mark.parametrize("content, problem", [
    (b"<!DOCTYPE html>\n<html><body>Sign in to continue</body></html>", "text file"),
    (b"dev-850-0-img0.png 0.1 0.2 0.3\n", "text file"),
    ("<html><head><title>Accès refusé — réessayez plus tard</title>".encode(), "text file"),
    (b"", "empty"),
    (b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", "single .npy"),
    (pickle.dumps({"a": 1}), "neither safetensors nor .npz"),
])
def test_feature_file_that_is_not_binary_features(root, content, problem):
    path, _, _ = root
    (path / "dev_image_features.npz").write_bytes(content)
    with pytest.raises(ValueError, match=problem) as e:
        small(path)
    assert str(path / "dev_image_features.npz") in str(e.value) and "Expected layout" in str(e.value)


def test_npz_object_arrays_are_refused_not_unpickled(root):
    path, images, texts = root
    texts = {k: v.astype(np.float32) for k, v in texts.items()}
    texts["dev-850-0-0"] = np.array([{"not": "an array"}], dtype=object)
    _save(path / "dev_text_features.npz", texts, "npz")
    with pytest.raises(ValueError, match="'dev-850-0-0' is unreadable"):
        small(path)


@pytest.mark.parametrize("line, problem", [
    ('{"identifier": "dev-9-0-0", "label": "True"', "line 3 is not valid JSON"),
    ('["dev-9-0-0", "True"]', "line 3 must be an object"),
    ('{"identifier": "dev-9-0-0", "sentence": "x"}', "line 3 must be an object with 'identifier' and 'label'"),
    ('{"identifier": "dev-9-0-0", "label": "yes"}', "line 3 \\(dev-9-0-0\\): label 'yes'"),
    ('{"identifier": "dev-9-0-0", "label": 1}', "label 1 is not"),
    ('{"identifier": "dev-9-0-0", "label": "true"}', "label 'true' is not"),
    ('{"identifier": "dev_9_0_0", "label": "True"}', "line 3: identifier 'dev_9_0_0'"),
])
def test_malformed_json_lines_name_file_and_line(root, line, problem):
    path, _, _ = root
    _write_json(path / "dev.json", [LINES[0], LINES[1], line, LINES[2]])
    with pytest.raises(ValueError, match=problem) as e:
        small(path)
    assert str(path / "dev.json") in str(e.value)


def test_json_booleans_and_blank_lines_are_accepted(root):
    path, _, _ = root
    _write_json(path / "dev.json", [dict(LINES[0], label=False), "", dict(LINES[1], label=True)])
    ds = small(path)
    assert [int(ds[i][1]) for i in range(2)] == [0, 1] and [e.line for e in ds.examples] == [1, 3]


def test_widths_and_shapes_are_checked(root):
    path, images, texts = root
    with pytest.raises(ValueError, match="data.params.image_dim=4 data.params.text_dim=3") as e:
        build_dataset(NAME, "dev", root=path)  # defaults: CLIP widths 768 / 512
    assert "model.overrides" not in str(e.value)  # the model follows the task's description
    fixed = get_task(NAME).resolve({"image_dim": 4, "text_dim": 3}).inputs
    assert (fixed["x"].dim, fixed["condition"].dim) == (5, 3)  # + the side column
    images["dev-851-3-img1.png"] = np.zeros((N_TOK + 1, D_IMG), np.float32)  # a later image, other token count
    images["dev-852-1-img0.png"] = np.zeros((N_TOK, D_IMG), np.int64)
    texts["dev-850-0-1"] = np.zeros((0, D_TXT), np.float32)
    _save(path / "dev_image_features.safetensors", images, "safetensors")
    _save(path / "dev_text_features.safetensors", texts, "safetensors")
    ds = small(path)
    ds[0]
    with pytest.raises(ValueError, match=r"'dev-850-0-1' holds float32 \[0, 3\], expected float \[m >= 1, 3\]"):
        ds[1]
    with pytest.raises(ValueError, match=r"'dev-851-3-img1.png' holds float32 \[3, 4\], expected float \[2, 4\]"):
        ds[2]
    with pytest.raises(ValueError, match=r"'dev-852-1-img0.png' holds int64"):
        ds[3]
    with pytest.raises(ValueError, match=r"parameter 'image_dim': got 0, expected an integer >= 1"):
        small(path, image_dim=0)


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_truncated_feature_file(root, fmt):
    path, images, _ = root
    file = path / f"dev_image_features.{fmt}"
    _save(file, images, fmt)
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(ValueError, match=f"malformed file {file}: unreadable {fmt} file"):
        small(path)
