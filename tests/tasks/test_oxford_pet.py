"""oxford_pet: the official Oxford-IIIT Pet layout (images/*.jpg, annotations/trainval.txt and
test.txt), on a tiny fixture written here: labels, class names, RGB conversion of grayscale /
RGBA / CMYK files, resizing, and errors that name the expected layout."""
import numpy as np
import pytest
import torch
from PIL import Image

from modwire.tasks import InputSpec, build_dataset, describe_task, get_task
from modwire.tasks.loaders import pets

# (image name, CLASS-ID, SPECIES, BREED-ID, how the file is written)
TRAIN = [("Abyssinian_1", 1, 1, 1, "rgb"), ("Abyssinian_2", 1, 1, 1, "gray"),
         ("beagle_10", 13, 2, 2, "rgba_png"), ("yorkshire_terrier_3", 37, 2, 25, "cmyk")]
TEST = [("beagle_11", 13, 2, 2, "rgb"), ("Bengal_5", 2, 1, 2, "rgb")]
COLOR = (200, 40, 90)


def _write(path, how):
    size = (40, 20)                                               # wide: stretching differs from cropping
    if how == "gray":
        im = Image.new("L", size, 77)
    elif how == "cmyk":
        im = Image.new("CMYK", size, (0, 255, 255, 0))            # pure red
    else:
        im = Image.new("RGBA" if how == "rgba_png" else "RGB", size, COLOR + ((128,) if how == "rgba_png" else ()))
        im.paste((0, 255, 0) + ((255,) if how == "rgba_png" else ()), (0, 0, 5, 20))   # a green left edge
    im.save(path, format="PNG" if how == "rgba_png" else "JPEG", quality=100)         # PNG data named .jpg


def _listing(rows):
    lines = ["#Image CLASS-ID SPECIES BREED ID", "#ID: 1:37 Class ids"]
    return "\n".join(lines + [f"{name} {c} {s} {b}" for name, c, s, b, _ in rows]) + "\n"


@pytest.fixture
def pet_root(tmp_path):
    base = tmp_path / "oxford-iiit-pet"
    (base / "images").mkdir(parents=True)
    (base / "annotations").mkdir()
    for name, *_, how in TRAIN + TEST:
        _write(base / "images" / f"{name}.jpg", how)
    (base / "annotations" / "trainval.txt").write_text(_listing(TRAIN))
    (base / "annotations" / "test.txt").write_text(_listing(TEST))
    return tmp_path                                               # the parent of oxford-iiit-pet/ works too


def test_task_info():
    info = get_task("oxford_pet")
    assert info.kind == "loader" and info.num_classes == 37 and info.splits == ("train", "test")
    assert info.inputs == InputSpec.image(3, 224, 224) and info.params["resize"] == "stretch"
    assert describe_task("oxford_pet", {"image_size": 64}).inputs == InputSpec.image(3, 64, 64)


def test_labels_are_class_ids_minus_one_and_names_come_from_the_image_names(pet_root):
    train = build_dataset("oxford_pet", "train", root=pet_root, image_size=16)
    assert [int(train[i][1]) for i in range(len(train))] == [0, 0, 12, 36]      # file order, comments skipped
    assert train.classes[0] == "Abyssinian" and train.classes[12] == "beagle"
    assert train.classes[36] == "yorkshire_terrier" and train.classes[1] == "class_2"   # Bengal: only in test
    test = build_dataset("oxford_pet", "test", root=pet_root / "oxford-iiit-pet", image_size=16)
    assert [int(y) for _, y in (test[0], test[1])] == [12, 1] and test.classes[1] == "Bengal"


def test_every_file_becomes_rgb_in_0_1(pet_root):
    train = build_dataset("oxford_pet", "train", root=pet_root, image_size=16)
    xs = [train[i][0] for i in range(4)]
    assert all(x.shape == (3, 16, 16) and x.dtype == torch.float32 for x in xs)
    right = slice(8, 16)                                          # away from the green edge
    torch.testing.assert_close(xs[0][:, :, right].mean((1, 2)), torch.tensor(COLOR) / 255, atol=3 / 255, rtol=0)
    torch.testing.assert_close(xs[1], torch.full((3, 16, 16), 77 / 255), atol=1 / 255, rtol=0)   # gray -> R=G=B
    torch.testing.assert_close(xs[2][:, :, right].mean((1, 2)), torch.tensor(COLOR) / 255, atol=1 / 255, rtol=0)
    red = xs[3].mean((1, 2))                                      # CMYK (0, 255, 255, 0) is red
    assert red[0] > 0.95 and red[1] < 0.05 and red[2] < 0.05


def test_stretch_keeps_the_whole_photo_and_center_crop_drops_the_sides(pet_root):
    """The green left eighth of a 40×20 photo: 2 of 16 columns when stretched, gone after a centre crop."""
    green = lambda x: (x[1] > 0.8) & (x[0] < 0.2)                 # noqa: E731
    stretched = build_dataset("oxford_pet", "test", root=pet_root, image_size=16)[0][0]
    cropped = build_dataset("oxford_pet", "test", root=pet_root, image_size=16, resize="center_crop")[0][0]
    assert green(stretched)[:, :2].float().mean() > 0.9 and not green(stretched)[:, 3:].any()
    assert not green(cropped).any()


def test_missing_or_incomplete_directories_name_the_layout(pet_root, tmp_path):
    with pytest.raises(ValueError, match=r"root=\.\.\. is required") as e:
        build_dataset("oxford_pet", "train")
    assert "annotations/trainval.txt" in str(e.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"no split list annotations/test.txt for split 'test'") as e:
        build_dataset("oxford_pet", "test", root=empty)
    assert "Expected layout" in str(e.value) and "images/<Image>.jpg" in str(e.value) and "is empty" in str(e.value)
    base = pet_root / "oxford-iiit-pet"
    (base / "images" / "beagle_10.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of the 4 images listed in annotations/trainval.txt are not in "
                                                r"images/ \(e.g. \['beagle_10.jpg'\]\)"):
        build_dataset("oxford_pet", "train", root=pet_root)
    for name in (base / "images").iterdir():
        name.unlink()
    (base / "images").rmdir()
    with pytest.raises(FileNotFoundError, match="no images/ folder next to"):
        build_dataset("oxford_pet", "test", root=pet_root)


@pytest.mark.parametrize("line, problem", [
    ("Abyssinian_1 1 1", r"line 3 has 3 fields, expected 4"),
    ("Abyssinian_1 one 1 1", r"line 3: CLASS-ID, SPECIES and BREED-ID must be integers"),
    ("Abyssinian_1 38 1 1", r"line 3: CLASS-ID must lie in 1..37 and SPECIES be 1 \(cat\) or 2 \(dog\), got 38"),
    ("Abyssinian_1 1 3 1", r"got 1 and 3"),
])
def test_malformed_split_lists_name_the_line(pet_root, line, problem):
    (pet_root / "oxford-iiit-pet" / "annotations" / "test.txt").write_text(f"# header\n\n{line}\n")
    with pytest.raises(ValueError, match=problem) as e:
        build_dataset("oxford_pet", "test", root=pet_root)
    assert "Expected layout" in str(e.value)


def test_one_class_id_for_two_breeds_is_refused(pet_root):
    (pet_root / "oxford-iiit-pet" / "annotations" / "test.txt").write_text("beagle_11 13 2 2\nBengal_5 13 1 2\n")
    with pytest.raises(ValueError, match=r"CLASS-ID 13 is given to images of two breeds, 'beagle' and 'Bengal'"):
        build_dataset("oxford_pet", "test", root=pet_root)


def test_a_file_that_is_not_an_image_is_named(pet_root):
    (pet_root / "oxford-iiit-pet" / "images" / "Bengal_5.jpg").write_text("<html>not found</html>")
    ds = build_dataset("oxford_pet", "test", root=pet_root, image_size=16)
    with pytest.raises(ValueError, match=r"Bengal_5.jpg.*HTML page"):
        ds[1]


def test_bad_parameters():
    with pytest.raises(ValueError, match=r"parameter 'resize': got 'squash', expected one of \['center_crop', 'stretch'\]"):
        build_dataset("oxford_pet", "train", root=".", resize="squash")
    with pytest.raises(ValueError, match=r"parameter 'image_size': got 0, expected an integer >= 1"):
        build_dataset("oxford_pet", "train", root=".", image_size=0)
