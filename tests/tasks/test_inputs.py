"""Tasks describe their inputs (InputSpec); NAC and Perceiver IO map a description onto their
tokenizer. Every registered task: a valid description, a model built from it whose forward takes a
batch of the task, and exactly the model config that the task's old ``model_overrides`` gave."""
import pytest
import torch
from PIL import Image

from modwire.models import get_config
from modwire.models.inputs import InputSpec, example_inputs, named_inputs
from modwire.models.registry import get_preset
from modwire.tasks import build_dataset, describe_task, get_task, list_tasks
from modwire.training import build_model_for_task, load_config

# What each task's TaskInfo held on main (commit cd0d714) before tasks described their inputs:
# model_overrides and num_classes, copied from the register_task(...) calls (flat tokenizer keys
# written in the nested form, {"tokenizer": {...}}).
CONV = lambda size, ch: {"tokenizer": {"kind": "conv", "image_size": size, "in_channels": ch}}  # noqa: E731
OLD = {
    "triangle": (CONV(64, 1), 2),
    "listops": ({"tokenizer": {"kind": "embedding", "vocab_size": 16, "max_len": 2000, "pad_id": 0}}, 10),
    "fuzzy_boolean": ({"tokenizer": {"kind": "linear", "input_dim": 31, "max_len": 6}}, 1),
    "fuzzy_boolean_adapt": ({"tokenizer": {"kind": "linear", "input_dim": 31, "max_len": 6}}, 1),
    "sort_of_clevr": ({"tokenizer": {"kind": "linear", "input_dim": 88}}, 10),
    "sort_of_clevr_conditional": ({"tokenizer": {"kind": "linear", "input_dim": 77},
                                   "generator": {"kind": "conditional", "tokenizer": {
                                       "kind": "embedding", "vocab_size": 14, "max_len": 3}}}, 10),
    "cifar10": (CONV(32, 3), 10),
    "cifar100": (CONV(32, 3), 100),
    "mnist": (CONV(32, 1), 10),
    "fashion_mnist": (CONV(32, 1), 10),
    "tiny_imagenet": (CONV(64, 3), 200),
    "tiny_imagenet_r": (CONV(64, 3), 200),
    "imagenet": (CONV(224, 3), 1000),
    "pgm": (CONV(160, 16), 8),
    "modelnet40": ({"tokenizer": {"kind": "linear", "input_dim": 3}}, 40),
    "imdb_bytes": ({"tokenizer": {"kind": "embedding", "vocab_size": 257, "max_len": 4096, "pad_id": 0}}, 2),
    "lra_listops": ({"tokenizer": {"kind": "embedding", "vocab_size": 16, "max_len": 2000, "pad_id": 0}}, 10),
    "nlvr2_features": ({"tokenizer": {"kind": "linear", "input_dim": 769},
                        "generator": {"kind": "conditional", "tokenizer": {"kind": "linear", "input_dim": 512}}}, 2),
}
PRESETS = ("nac_micro", "nac_small", "nac_tiny_imagenet", "nac_conditional_small", "nac_conditional_micro",
           "perceiver_io_micro", "perceiver_io_small", "perceiver_io_tiny_imagenet")
GENERATORS = {"triangle", "listops", "fuzzy_boolean", "fuzzy_boolean_adapt", "sort_of_clevr",
              "sort_of_clevr_conditional"}


@pytest.fixture(scope="module")
def folder_root(tmp_path_factory):
    """A tiny image_folder dataset (the only registered task whose description needs files)."""
    root = tmp_path_factory.mktemp("folders")
    for split in ("train", "test"):
        for k, name in enumerate(("cat", "dog")):
            (root / split / name).mkdir(parents=True)
            Image.new("RGB", (5, 7), (40 * k, 0, 0)).save(root / split / name / "a.png")
    return root


# The parameters that give the old items: NAC and Perceiver IO have one read-out, so fuzzy Boolean in its
# single-head "pair" layout; PGM at the files' 160×160 panels (the default is NI's 80).
OLD_PARAMS = {"fuzzy_boolean": {"layout": "pair"}, "fuzzy_boolean_adapt": {"layout": "pair"},
               "pgm": {"panel_size": 160}}


def params_for(task, folder_root):
    return {"root": str(folder_root)} if task == "image_folder" else dict(OLD_PARAMS.get(task, {}))


def multimodal(task):
    return not isinstance(get_task(task).inputs, InputSpec)


def test_every_task_has_a_described_valid_input_and_class_count(folder_root):
    assert set(OLD) | {"image_folder"} <= set(list_tasks())
    for task in list_tasks():
        info = describe_task(task, params_for(task, folder_root))
        for name, spec in named_inputs(info.inputs).items():
            assert isinstance(spec, InputSpec) and spec.kind in ("image", "tokens", "vectors", "index"), (task, name)
        assert isinstance(info.num_classes, int) and info.num_classes >= 1, task
        if task in OLD:
            assert info.num_classes == OLD[task][1], task


# The only differences, both fixes: the old grouped overrides of nlvr2 switched the conditional presets'
# generator tokenizer from embedding to linear but kept the preset's max_len (3 / 4 learned positions), so
# those models failed on any sentence longer than 3 / 4 tokens; a set of text features gets none (max_len 0).
KNOWN_DIFFERENCES = {("nlvr2_features", "nac_conditional_small"): {"generator.tokenizer.max_len": (3, 0)},
                     ("nlvr2_features", "nac_conditional_micro"): {"generator.tokenizer.max_len": (4, 0)}}


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


@pytest.mark.parametrize("task", sorted(OLD))
def test_mapping_gives_exactly_the_old_model_configs(task):
    overrides, num_classes = OLD[task]
    info = describe_task(task, OLD_PARAMS.get(task))
    for preset in PRESETS:
        if multimodal(task) and preset.startswith("perceiver_io"):
            continue
        base = get_config(preset)
        old = _flat(get_config(preset, **base.normalize({**overrides, "num_classes": num_classes})).to_dict())
        new = _flat(base.for_inputs(info.inputs, info.num_classes).to_dict())
        assert old.keys() == new.keys()
        diff = {k: (old[k], new[k]) for k in old if old[k] != new[k]}
        assert diff == KNOWN_DIFFERENCES.get((task, preset), {}), (task, preset)


def test_the_old_nlvr2_config_failed_on_long_sentences_and_the_new_one_reads_them():
    info = get_task("nlvr2_features")
    x = torch.randn(1, 4, 769)
    sentence = InputSpec.vectors(None, 512).example(1, length=6)
    old = get_config("nac_conditional_micro", **OLD["nlvr2_features"][0], num_classes=2)
    with pytest.raises(ValueError, match="sequence length 6 exceeds max_len 4"):
        get_preset("nac_conditional_micro")[0](old)(x, condition=sentence)
    new = get_config("nac_conditional_micro").for_inputs(info.inputs, info.num_classes)
    assert get_preset("nac_conditional_micro")[0](new)(x, condition=sentence).shape == (1, 2)


def test_description_follows_the_parameters():
    """What users had to copy into model.overrides by hand now follows data.params."""
    assert describe_task("listops", {"max_len": 64}).inputs == InputSpec.tokens(64, 16, pad_id=0, padded=True)
    assert describe_task("sort_of_clevr", {"patch_size": 15}).inputs == InputSpec.vectors(25, 3 * 15 * 15 + 13)
    assert describe_task("tiny_imagenet_r", {"image_size": 32}).inputs == InputSpec.image(3, 32, 32)
    assert describe_task("mnist", {"pad_to": 40}).inputs == InputSpec.image(1, 40, 40)
    assert describe_task("modelnet40", {"num_points": 256}).inputs == InputSpec.vectors(256, 3)
    nlvr2 = describe_task("nlvr2_features", {"image_dim": 1024, "text_dim": 768}).inputs
    cfg = get_config("nac_conditional_nlvr2").for_inputs(nlvr2, 2)
    assert (cfg.tokenizer.input_dim, cfg.generator.tokenizer.input_dim) == (1025, 768)


def _small(config):
    """The mapped config with a narrow conv stem (the mapping leaves widths to the model), for speed."""
    small = {"stem_channels": 8, "conv_channels": 8, "pos_dim": 8}
    return config.replace(tokenizer=small) if config.tokenizer.kind == "conv" else config


def _real_batch(task, folder_root):
    """Two items of the task itself (generators, the image_folder fixture), collated; None for other loaders."""
    if task not in GENERATORS and task != "image_folder":
        return None
    info = get_task(task)
    params = params_for(task, folder_root) if task == "image_folder" else {"size": 2, **params_for(task, None)}
    ds = build_dataset(task, "train", **params)
    items = [ds[0], ds[1]]
    if info.collate is not None:
        return info.collate(items)[0]
    if isinstance(items[0][0], dict):
        return {k: torch.stack([it[0][k] for it in items]) for k in items[0][0]}
    return torch.stack([it[0] for it in items])


@pytest.mark.parametrize("task", sorted(set(OLD) | {"image_folder"}))
def test_models_built_from_the_description_take_a_batch_of_the_task(task, folder_root):
    info = describe_task(task, params_for(task, folder_root))
    presets = ("nac_micro",) if multimodal(task) else ("nac_micro", "perceiver_io_micro")
    real = _real_batch(task, folder_root)
    for preset in presets:
        cls = get_preset(preset)[0]
        model = cls(_small(get_config(preset).for_inputs(info.inputs, info.num_classes))).eval()
        for x in ([example_inputs(info.inputs, 2)] + ([real] if real is not None else [])):
            with torch.no_grad():
                out = model(**x) if isinstance(x, dict) else model(x)
            assert out.shape == (2, info.num_classes) and torch.isfinite(out).all(), (task, preset)
        if real is not None:  # the description matches the task's real items, axis by axis
            for name, spec in named_inputs(info.inputs).items():
                t = real[name] if isinstance(real, dict) else real
                assert all(s is None or s >= n for s, n in zip(spec.shape, t.shape[1:])), (task, name)
                assert len(t.shape[1:]) == len(spec.shape) and (t.dtype == torch.long) == (spec.kind == "tokens")


def test_padded_tokens_are_masked_by_the_mapped_model():
    """pad_id reaches the tokenizer: a padded sequence gives the output it has alone."""
    info = get_task("listops")
    model = get_preset("nac_micro")[0](get_config("nac_micro").for_inputs(info.inputs, 10)).eval()
    ids = InputSpec.tokens(12, 16, pad_id=0).example(1)
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], 1)
    with torch.no_grad():
        assert torch.allclose(model(ids), model(padded), atol=1e-5)


def test_build_model_for_task_uses_the_description_and_user_overrides_win():
    cfg = load_config(None, ["model.name=nac_micro", "data.task=listops", "data.params.max_len=64"])
    tok = build_model_for_task(cfg).config.tokenizer
    assert (tok.kind, tok.vocab_size, tok.max_len, tok.pad_id, tok.token_dim) == ("embedding", 16, 64, 0, 16)
    cfg = load_config(None, ["model.name=nac_micro", "data.task=listops", "model.overrides.tokenizer.max_len=80"])
    tok = build_model_for_task(cfg).config.tokenizer
    assert (tok.kind, tok.max_len, tok.vocab_size) == ("embedding", 80, 16)  # the user's max_len, the task's kind
    # the old PGM recipe: one token per flattened panel, set by hand, still wins over the image description
    cfg = load_config(None, ["model.name=perceiver_io_micro", "data.task=pgm", "model.overrides.tokenizer.kind=linear",
                             "model.overrides.tokenizer.input_dim=25600", "model.overrides.tokenizer.max_len=16"])
    tok = build_model_for_task(cfg).config.tokenizer
    assert (tok.kind, tok.input_dim, tok.max_len) == ("linear", 25600, 16)
