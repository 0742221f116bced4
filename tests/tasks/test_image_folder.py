"""The generic image-folder task on tiny fixture folders of 5x7 PNGs written here."""
import json

import pytest
import torch
from PIL import Image

from modwire.models.inputs import InputSpec
from modwire.tasks import build_dataset, describe_task
from modwire.training import load_config, train

# class -> the colours of its images (one 5x7 PNG each); class names sort as ant < bee < cow
COLOURS = {"bee": [(0, 255, 0), (10, 200, 30)], "ant": [(255, 0, 0), (200, 10, 10)], "cow": [(0, 0, 255), (30, 60, 90)]}


def write_folders(root, splits=("train", "test"), classes=COLOURS, grey_class="cow"):
    for split in splits:
        for name, colours in classes.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i, rgb in enumerate(colours):
                im = Image.new("RGB", (5, 7), rgb)
                if name == grey_class and i == 1:
                    im = im.convert("L")  # a grayscale file among RGB ones
                im.save(root / split / name / f"{i}.png")
    (root / "train" / "ant" / "notes.txt").write_text("not an image")  # ignored: not an image suffix
    return root


@pytest.fixture
def root(tmp_path):
    return write_folders(tmp_path)


def test_description_counts_the_class_folders(root):
    info = describe_task("image_folder", {"root": str(root)})
    assert info.num_classes == 3 and info.inputs == InputSpec.image(3, 32, 32)
    info = describe_task("image_folder", {"root": str(root), "image_size": 8, "channels": 1})
    assert info.inputs == InputSpec.image(1, 8, 8)


def test_items_values_and_class_mapping(root):
    ds = build_dataset("image_folder", "train", root=str(root), image_size=8, resize="stretch")
    assert ds.classes == ["ant", "bee", "cow"] and len(ds) == 6
    for i, (path, label) in enumerate(ds.samples):
        x, y = ds[i]
        assert x.shape == (3, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.long
        name, k = path.parent.name, int(path.stem)
        assert int(y) == ds.classes.index(name)
        rgb = COLOURS[name][k]
        if name == "cow" and k == 1:  # stored as grayscale: Pillow's luma, replicated to RGB
            rgb = (round(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]),) * 3
        expected = torch.tensor(rgb, dtype=torch.float32).div(255)[:, None, None].expand(3, 8, 8)
        assert torch.allclose(x, expected, atol=1 / 255), (name, k)  # a flat colour stays flat when resized


def test_grayscale_channel_and_val_falls_back_to_test(root):
    ds = build_dataset("image_folder", "val", root=str(root), image_size=16, channels=1)
    x, y = ds[0]
    assert x.shape == (1, 16, 16) and ds.samples[0][0].parent.parent.name == "test"
    r, g, b = COLOURS["ant"][0]
    assert torch.allclose(x, torch.full_like(x, (0.299 * r + 0.587 * g + 0.114 * b) / 255), atol=1e-5)


def test_mismatched_class_sets_are_an_error_listing_the_differences(tmp_path):
    write_folders(tmp_path, splits=("train",))
    write_folders(tmp_path, splits=("test",), classes={"ant": [(1, 2, 3)], "bee": [(1, 2, 3)], "dog": [(1, 2, 3)]})
    with pytest.raises(ValueError, match=r"only in train/: \['cow'\]; only in test/: \['dog'\]"):
        describe_task("image_folder", {"root": str(tmp_path)})
    with pytest.raises(ValueError, match="differ from those of train/"):
        build_dataset("image_folder", "train", root=str(tmp_path))


def test_two_training_steps_of_a_micro_nac_with_mixup_use_the_real_class_count(root, tmp_path):
    cfg = load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=nac_micro", "data.task=image_folder",
                             f"data.params.root={root}", "data.params.image_size=8", "data.val_split=test",
                             "model.overrides.tokenizer.stem_channels=8", "model.overrides.tokenizer.conv_channels=8",
                             "model.overrides.tokenizer.pos_dim=8",
                             "data.batch_size=2", "data.mixup=true", "max_steps=2", "progress=false"])
    result = train(cfg)
    saved = json.loads((tmp_path / "run" / "checkpoints" / "last" / "config.json").read_text())
    assert result["step"] == 2 and saved["num_classes"] == 3  # nac_micro's preset has 5
    assert (saved["tokenizer"]["kind"], saved["tokenizer"]["image_size"], saved["tokenizer"]["in_channels"]) == \
        ("conv", 8, 3)
