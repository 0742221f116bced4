"""timm's model API on every classifier preset (issue 38, item 1; ``modwire.models.classifier_api``).

Structure on every classifier preset, built on the ``meta`` device (no arithmetic): the split
``forward_features`` / ``forward_head`` gives the forward's shape, ``pre_logits`` is ``head_hidden_size``
wide, ``forward_intermediates`` follows timm's contract (indices as an int or a list, ``stop_early``,
``intermediates_only``, ``output_fmt``), ``reset_classifier`` changes the width of the logits and nothing
else, ``pretrained_cfg`` names existing modules, ``no_weight_decay`` full parameter names. Values on the
micro presets (CPU): ``forward_head(forward_features(x)) == model(x)``, the intermediates equal the blocks'
outputs, the head reads ``pre_logits`` linearly. The LM and the GAN are not classifiers."""
import pytest
import torch

import modwire
from modwire.errors import UserError, UserTypeError
from modwire.models.base import MODEL_TYPES
from modwire.models.classifier_api import Classifier, Intermediates, take_indices

CLASSIFIERS = [n for n in modwire.list_models() if issubclass(modwire.models.registry.get_preset(n)[0], Classifier)]
MICRO = [n for n in CLASSIFIERS if n.endswith("_micro")]
BATCH = 2


def split(config, device="meta", seed=0):
    inputs = config.example_inputs(BATCH, device=device, seed=seed)
    return inputs.pop("x"), inputs


def meta(name, **kw):
    with torch.device("meta"):
        return modwire.create_model(name, **kw).eval()


def test_which_model_types_are_classifiers():
    classifiers = {t for t, cls in MODEL_TYPES.items() if issubclass(cls, Classifier)}
    assert classifiers == {"vit", "ait", "neural_interpreter", "nac", "perceiver_io", "preact_resnet", "cnn_mlp"}
    assert {n.split("_")[0] for n in MICRO} >= {"vit", "ait", "ni", "nac", "perceiver", "preact", "cnn", "nfm"}


# ----------------------------------------------------------------------------- structure, every preset (meta)

# One preset per family and head layout (CLS tokens with task ids, the flattened classifier with a question
# token, PGM panels, several CLS tokens with C = 1, a conditional NAC, NFM bodies); the micro presets are
# checked with values below.
SHAPES = ["vit_digits", "vit_small_sort_of_clevr", "vit_pgm", "ni_fuzzy_boolean", "ni_digits", "ait_small_cifar10",
          "nac_small", "nac_conditional_small", "perceiver_io_small", "preact_resnet18_cifar10",
          "nfm_preact_resnet18_cifar10", "cnn_mlp_sort_of_clevr", "nfm_cnn_mlp_sort_of_clevr"]


def test_shape_presets_are_classifiers():
    assert set(SHAPES) <= set(CLASSIFIERS)


@pytest.mark.parametrize("name", SHAPES)
def test_shapes_on_meta(name):
    """One pass of the body (``forward_intermediates``) on the meta device: the final features are
    ``num_features`` wide, one intermediate per block, the head gives the forward's declared shape and
    ``pre_logits`` is ``head_hidden_size`` wide; ``stop_early`` / ``intermediates_only`` / int indices."""
    model = meta(name)
    x, kw = split(model.config)
    blocks = model.intermediate_blocks()
    with torch.device("meta"):
        f, inter = model.forward_intermediates(x, **kw)
        assert len(inter) == len(blocks)
        assert f.shape[1 if model.feature_kind == "map" else -1] == model.num_features
        assert model.forward_head(f, **kw).shape == model.config.output_shape({"x": x, **kw})
        pre = model.forward_head(f, pre_logits=True, **kw)
        assert pre.shape[-1] == model.head_hidden_size and pre.shape[0] == BATCH
        only = model.forward_intermediates(x, indices=1, stop_early=True, intermediates_only=True, **kw)
        assert isinstance(only, list) and len(only) == 1 and only[0].shape == inter[-1].shape


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_every_classifier_preset_on_meta(name):
    """Built once on the meta device (no arithmetic): ``no_weight_decay`` full names; the blocks are modules
    of the model; ``pretrained_cfg`` names existing modules and the declared input; ``reset_classifier``
    changes the classifier's width and no other parameter (a PGM model's logits are its candidates: refused)."""
    model = meta(name)
    names = {n for n, _ in model.named_parameters()}
    assert [n for n in model.no_weight_decay() if n not in names] == []      # full names (timm's convention)
    modules = dict(model.named_modules())
    ids = {id(m) for m in modules.values()}
    assert [n for m, n in model.intermediate_blocks() if id(m) not in ids or n < 1] == []

    cfg = model.pretrained_cfg
    assert cfg == model.default_cfg
    assert isinstance(modules[cfg["first_conv"]], (torch.nn.Conv2d, torch.nn.Linear, torch.nn.Embedding))
    assert modules[cfg["classifier"]] is model.get_classifier()
    assert cfg["input_size"] == tuple(split(model.config)[0].shape[1:])
    assert cfg["num_classes"] == model.num_classes and cfg["crop_pct"] == 1.0
    if cfg["mean"] is not None:                   # an image: one mean / std per channel
        assert len(cfg["mean"]) == len(cfg["std"]) == cfg["input_size"][0]

    if model.config.to_dict().get("tokenizer", {}).get("kind") == "panels":
        with pytest.raises(UserError, match="candidate"):
            model.reset_classifier(3)
        return
    before = {n: p.shape for n, p in model.named_parameters()}
    head, width = model.classifier_name(), model.num_classes
    model.reset_classifier(width + 3)
    after = {n: p.shape for n, p in model.named_parameters()}
    assert set(before) == set(after)
    changed = sorted(n for n in before if before[n] != after[n])
    assert changed and all(n.startswith(head + ".") for n in changed), changed
    assert model.config.num_classes == model.num_classes == width + 3
    assert all(width + 3 in after[n] for n in changed)
    with pytest.raises(UserError, match=r"num_classes must be an int >= 0 \(0: no classifier"):
        model.reset_classifier(-1)
    model.reset_classifier(0)                                    # timm's: no classifier
    assert isinstance(model.get_classifier(), torch.nn.Identity) and model.num_classes == 0
    assert not [n for n, _ in model.named_parameters() if n.startswith(head + ".")]
    assert model.pretrained_cfg["num_classes"] == 0


# ----------------------------------------------------------------------------- values (micro presets, CPU)

@pytest.mark.parametrize("name", MICRO)
def test_split_forward_and_intermediates_on_values(name):
    """``forward_head(forward_features(x)) == model(x)`` exactly, the last linear layer reads ``pre_logits``,
    the intermediates are the blocks' outputs (each block's last call, seen by hooks of the test's own), and
    ``stop_early`` at block 0 with ``norm`` gives that block's output through the final norm."""
    torch.manual_seed(0)
    model = modwire.create_model(name).eval()
    x, kw = split(model.config, device="cpu")
    blocks, seen = model.intermediate_blocks(), {}
    hooks = [m.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, o[0] if isinstance(o, tuple) else o))
             for i, (m, _) in enumerate(blocks)]
    fmt = model.default_output_fmt()
    with torch.no_grad():
        logits = model(x, **kw)
        final, inter = model.forward_intermediates(x, **kw)        # final: forward_features(x)
        expected = [seen[i] for i in range(len(blocks))]
        for h in hooks:
            h.remove()
        torch.testing.assert_close(model.forward_head(final, **kw), logits, atol=0, rtol=0)
        pre = model.forward_head(final, pre_logits=True, **kw)
        if isinstance(model.get_classifier(), torch.nn.Linear):   # the last layer reads pre_logits
            torch.testing.assert_close(model.get_classifier()(pre), logits.reshape(len(pre), -1), atol=1e-6, rtol=1e-6)
        assert len(inter) == len(blocks)
        for got, want in zip(inter, expected):
            torch.testing.assert_close(got, model.to_output_fmt(want, fmt), atol=0, rtol=0)
        first, early = model.forward_intermediates(x, indices=[0], norm=True, stop_early=True, **kw)
        torch.testing.assert_close(early[0], model.to_output_fmt(model.intermediate_norm(expected[0]), fmt))
        if len(blocks) > 1:                                        # stopped after block 0
            torch.testing.assert_close(first, model.intermediate_norm(expected[0]), atol=0, rtol=0)


def test_take_indices_is_timms():
    assert take_indices(4, None) == [0, 1, 2, 3]
    assert take_indices(4, 2) == [2, 3]
    assert take_indices(4, [-1, 0]) == [0, 3]
    for bad in (0, 5, [4], [-5], True, "1", []):
        with pytest.raises((UserError, TypeError)):
            take_indices(4, bad)


def test_output_formats():
    vit = modwire.create_model("vit_micro").eval()            # 8×8 images in 2×2 patches: a 4×4 grid + CLS
    x, _ = split(vit.config, device="cpu")
    nchw = vit.forward_intermediates(x, indices=1, intermediates_only=True)[0]       # timm's ViT default
    nlc = vit.forward_intermediates(x, indices=1, intermediates_only=True, output_fmt="NLC")[0]
    assert nlc.shape == (BATCH, 16, 32) and nchw.shape == (BATCH, 32, 4, 4)         # the CLS token split off
    torch.testing.assert_close(nchw.flatten(2).transpose(1, 2), nlc)
    # timm's return_prefix_tokens: (tokens, CLS tokens) per block; together the block's whole output
    seen = []
    hook = vit.blocks[-1].register_forward_hook(lambda m, a, o: seen.append(o[0] if isinstance(o, tuple) else o))
    (tokens, prefix), = vit.forward_intermediates(x, indices=1, intermediates_only=True, output_fmt="NLC",
                                                  return_prefix_tokens=True)
    hook.remove()
    assert prefix.shape == (BATCH, 1, 32)
    torch.testing.assert_close(torch.cat([tokens, prefix], 1), seen[-1], atol=0, rtol=0)
    mean = modwire.create_model("vit_micro", num_cls_tokens=0).eval()     # no prefix tokens: timm's plain list
    assert mean.forward_intermediates(x, indices=1, intermediates_only=True, return_prefix_tokens=True)[0].shape \
        == (BATCH, 32, 4, 4)
    with pytest.raises(UserError, match="return_prefix_tokens applies to a model with CLS or question tokens"):
        modwire.create_model("preact_resnet_micro").forward_intermediates(
            split(modwire.create_model("preact_resnet_micro").config, device="cpu")[0], return_prefix_tokens=True)
    with pytest.raises(UserTypeError, match="return_prefix_tokens must be a bool, got 'yes'"):
        vit.forward_intermediates(x, return_prefix_tokens="yes")
    cnn = modwire.create_model("preact_resnet_micro").eval()
    x, _ = split(cnn.config, device="cpu")
    a = cnn.forward_intermediates(x, intermediates_only=True)[-1]
    b = cnn.forward_intermediates(x, intermediates_only=True, output_fmt="NLC")[-1]
    torch.testing.assert_close(b, a.flatten(2).transpose(1, 2))
    nac = modwire.create_model("nac_micro")
    with pytest.raises(UserError, match="output_fmt 'NCHW'"):
        nac.forward_intermediates(split(nac.config, device="cpu")[0], output_fmt="NCHW")


def test_the_former_alias_of_forward_record_fails_loudly():
    """Issue 37's ``forward_intermediates`` returned the record; reading a record field from timm's tuple
    names ``forward_record``, and the LM (not a classifier) refuses the name."""
    model = modwire.create_model("vit_micro").eval()
    x, _ = split(model.config, device="cpu")
    out = model.forward_intermediates(x)
    assert isinstance(out, Intermediates)
    with pytest.raises(AttributeError, match="forward_record"):
        out.logits
    lm = modwire.create_model("transformer_lm_micro")
    with pytest.raises(UserError, match="forward_record"):
        lm.forward_intermediates(torch.zeros(1, 3, dtype=torch.long))


def test_create_model_maps_timm_keywords_or_says_what_applies():
    assert modwire.create_model("vit_micro", in_chans=3).config.tokenizer.in_channels == 3
    assert modwire.create_model("nac_small", in_chans=1).pretrained_cfg["input_size"] == (1, 32, 32)
    assert modwire.create_model("preact_resnet_micro", in_chans=3).config.in_channels == 3
    assert modwire.create_model("cnn_mlp_micro", drop_rate=0.1).config.dropout == 0.1
    avg = modwire.create_model("vit_micro", global_pool="avg")
    assert avg.config.num_cls_tokens == 0 and avg.global_pool() == "avg"
    assert modwire.create_model("vit_small_triangle", global_pool="token").config.classifier == "mean"
    for name, kw, match in [("vit_micro", {"drop_rate": 0.1}, "no dropout before its classifier"),
                            ("nac_micro", {"in_chans": 3}, "tokenizer.input_dim"),
                            ("nac_micro", {"global_pool": "avg"}, "'map'"),
                            ("cnn_mlp_micro", {"global_pool": "avg"}, "no global pooling"),
                            ("preact_resnet_micro", {"global_pool": "token"}, "'avg'"),
                            ("cnn_mlp_micro", {"drop_rate": 0.1, "dropout": 0.2}, "give one of them"),
                            ("transformer_lm_micro", {"drop_rate": 0.1}, "not an image classifier")]:
        with pytest.raises(UserError, match=match):
            modwire.create_model(name, **kw)


def test_training_mode_split_still_matches_with_the_same_randomness():
    """The trainer calls ``model(**inputs)``; the split is the same computation in training mode too."""
    model = modwire.create_model("cnn_mlp_micro").train()
    x, kw = split(model.config, device="cpu")
    torch.manual_seed(1)
    a = model(x, **kw)
    torch.manual_seed(1)
    b = model.forward_head(model.forward_features(x, **kw), **kw)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
