"""Issue 35 item 5: which parameters are weight-decayed. Never a bias (whatever its shape) or a
normalisation layer's parameter (by module type), never a parameter of at most one dimension (NAC App.
C), never what a paper exempts (NAC App. C: signatures and codes; …); ``no_weight_decay()`` returns
full parameter names, so timm's optimizer factory (exact-name matching) forms the same groups.

Every registered preset is checked on the ``meta`` device (construction only)."""
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import modwire
from modwire.models.base import no_weight_decay_names
from modwire.training.optim import param_groups

PRESETS = modwire.list_models()
NORMS = (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm, nn.InstanceNorm2d, nn.RMSNorm)
# What each model family's paper (or its authors' configs) exempts beyond biases, norms and ≤1-D parameters, as
# patterns over the full names of the ≥2-D parameters (docs/training.md, "Weight decay").
EXEMPT = {
    "nac": [r"(^|\.)(signatures|codes)$", r"(^|\.)tokenizer\.pos(\.weight)?$", r"^generator\.queries$"],
    "set": [r"^cls_tokens$", r"^embed\.(pos|slots)(\.weight)?$", r"(^|\.)relative\."],
    "ni": [r"\.functions\.(added_)?(signatures|codes)$", r"\.log_sigma$", r"\.relative\.e_(row|col)$"],
    "lm": [r"^positions$"],
    "default": [r"(^|\.)tokenizer\.pos$"],
}


def _families(model) -> list[str]:
    t = model.config.model_type
    if t in ("nac", "nac_conditional"):
        return ["nac"]
    if t in ("vit", "ait"):
        return ["set"]
    if t == "neural_interpreter":
        return ["set", "ni"]
    return {"transformer_lm": ["lm"], "gan": []}.get(t, ["default"])


def _expected_decayed(model) -> set[str]:
    """The weight matrices that are not biases, not norm parameters and not exempt, found without the library's rule."""
    in_norm = {f"{mn}.{pn}" if mn else pn for mn, m in model.named_modules() if isinstance(m, NORMS)
               for pn, _ in m.named_parameters(recurse=False)}
    patterns = [p for f in _families(model) for p in EXEMPT[f]]
    return {n for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2 and not n.endswith(".bias")
            and n not in in_norm and not any(re.search(pat, n) for pat in patterns)}


def _timm_groups(model, weight_decay: float, no_weight_decay_list) -> tuple[set[str], set[str]]:
    """timm's ``param_groups_weight_decay`` (timm/optim/_param_groups.py) as it groups: no decay when
    ``param.ndim <= 1 or name.endswith(".bias") or name in no_weight_decay_list`` (exact names)."""
    decay, no_decay = set(), set()
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name.endswith(".bias") or name in no_weight_decay_list else decay).add(name)
    return decay, no_decay


def _groups(model) -> tuple[set[str], set[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = param_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    return {names[id(p)] for p in decay["params"]}, {names[id(p)] for p in no_decay["params"]}


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_decays_exactly_its_weight_matrices(name):
    with torch.device("meta"):
        model = modwire.create_model(name)
    listed = model.no_weight_decay()
    every = {n for n, _ in model.named_parameters()}
    assert set(listed) <= every and len(set(listed)) == len(listed)        # full names, each once
    decay, no_decay = _groups(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}     # frozen ones are in no group
    assert decay == _expected_decayed(model) and decay | no_decay == trainable and not decay & no_decay
    assert (decay, no_decay) == _timm_groups(model, 0.05, listed)          # timm's factory: the same groups
    if model.config.model_type == "gan":                                 # each network has its own optimizer
        for part in ("generator", "discriminator"):
            d, _ = _groups(getattr(model, part))
            assert {f"{part}.{n}" for n in d} == {n for n in decay if n.startswith(part + ".")}


def test_a_2d_bias_and_a_2d_norm_weight_are_not_decayed():
    """NI's per-token heads have a ``[T, C]`` bias (decayed before issue 35); a LayerNorm over two
    trailing dimensions has a 2-D weight: neither is decayed, by name ``bias`` and by module type."""
    with torch.device("meta"):
        ni = modwire.create_model("ni_micro")
    assert ni.get_parameter("heads.bias").ndim == 2
    decay, no_decay = _groups(ni)
    assert "heads.bias" in no_decay and "heads.weight" in decay
    net = nn.Sequential(nn.Linear(5, 20), nn.Unflatten(1, (4, 5)), nn.LayerNorm((4, 5)))
    assert net[2].weight.ndim == 2
    assert set(no_weight_decay_names(net)) == {"0.bias", "2.weight", "2.bias"}
    assert {n for n, p in net.named_parameters() if any(p is q for q in param_groups(net, 0.1)[0]["params"])} == \
        {"0.weight"}


def test_exempt_paths_match_whole_name_components():
    net = nn.ModuleDict({"functions": nn.ParameterDict({"signatures": nn.Parameter(torch.zeros(2, 3)),
                                                        "added_signatures": nn.Parameter(torch.zeros(2, 3))}),
                         "relative": nn.Linear(3, 3)})
    assert set(no_weight_decay_names(net, ("signatures", "relative"))) == {
        "functions.signatures", "relative.weight", "relative.bias"}


def test_frozen_parameters_are_in_no_group():
    model = modwire.create_model("nac_micro")
    model.generator.processors.signatures.requires_grad_(False)
    decay, no_decay = _groups(model)
    assert "generator.processors.signatures" not in decay | no_decay
    assert {"generator.processors.codes", "generator.outputs.codes"} <= no_decay


def test_filter_bias_and_norm_false_decays_every_trainable_parameter():
    """``optim.filter_bias_and_norm: false``: one decayed group with every trainable parameter (the AiT
    authors' ``AdamW(net.parameters(), weight_decay=0.01)``); the AiT paper's configs set it."""
    from modwire.training import load_config
    from modwire.training.optim import build_optimizer

    model = modwire.create_model("ait_micro")
    decay, no_decay = param_groups(model, 0.01, filter_bias_and_norm=False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(decay["params"]) == len(trainable) and no_decay["params"] == []
    assert len(param_groups(model, 0.01)[1]["params"]) > 0                    # the default filters biases and norms
    configs = Path(__file__).resolve().parents[2] / "configs"
    for path in ("ait_small_cifar10.yaml", "cpu/ait_triangle.yaml", "cpu/vit_triangle.yaml"):
        assert load_config(str(configs / path)).optim.filter_bias_and_norm is False, path
    opt = build_optimizer(model, load_config(str(configs / "cpu" / "ait_fashion_mnist.yaml")).optim)
    assert [len(g["params"]) for g in opt.param_groups] == [len(trainable), 0]
