"""timm's ``group_matcher`` on every classifier (``modwire.models.classifier_api``): what timm's layer-wise
learning-rate decay (``timm.optim.param_groups_layer_decay``) reads to order the parameters by depth.

timm is not a dependency, so its reading of a matcher is re-stated here from timm 1.0's
``timm/models/_manipulate.py::group_with_matcher`` (dict form; ``reverse=True`` as the layer decay calls
it) and ``param_groups_layer_decay`` (the layer scales): each spec compiles to ``(regex, (ordinal,),
suffix)``, a name takes the ordinals of its first match (unmatched: ``inf``), and the sorted distinct
ordinals are numbered 0, 1, … . Without a ``group_matcher`` timm falls back to runs of 12 parameters in
registration order, which cut across blocks (checked below for the ViT)."""
import math
import re
from itertools import chain

import pytest
import torch

import modwire
from modwire.errors import UserTypeError
from modwire.models.registry import get_preset
from modwire.models.classifier_api import Classifier

CLASSIFIERS = [n for n in modwire.list_models() if issubclass(get_preset(n)[0], Classifier)]
MICRO = [n for n in CLASSIFIERS if n.endswith("_micro")]

#: The top-level modules after the last block, per family: the final norm and the head (timm: last group).
HEAD = {"vit": {"norm", "heads"}, "ait": {"norm", "heads"}, "neural_interpreter": {"norm", "heads"},
        "nac": {"read_out"}, "perceiver_io": {"read_out", "output_queries"}, "preact_resnet": {"head"},
        "cnn_mlp": {"mlp"}}


def timm_layer_map(model) -> dict[str, int]:
    """timm's ``group_parameters(model, model.group_matcher(coarse=False), reverse=True)``: name → layer id."""
    compiled = []
    for ordinal, spec in enumerate(model.group_matcher(coarse=False).values()):
        if spec is None:
            continue
        for pattern, suffix in (spec if isinstance(spec, (tuple, list)) else [(spec, None)]):
            compiled.append((re.compile(pattern), (ordinal,), suffix))

    def grouping(name):
        for regex, prefix, suffix in compiled:
            found = regex.match(name)
            if found:
                return tuple(map(float, chain.from_iterable(filter(None, (prefix, found.groups(), suffix)))))
        return (float("inf"),)

    keys = {n: grouping(n) for n, _ in model.named_parameters()}
    number = {k: i for i, k in enumerate(sorted(set(keys.values())))}
    return {n: number[k] for n, k in keys.items()}


def layer_scales(layer_map: dict[str, int], decay: float) -> dict[str, float]:
    """``param_groups_layer_decay``'s learning-rate scale of each parameter: ``decay ** (last - layer)``."""
    last = max(layer_map.values())
    return {n: decay ** (last - i) for n, i in layer_map.items()}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def expected_layers(model) -> dict[str, int]:
    """The depth of each parameter found without the matcher: the stem 0, block group ``i`` (each module of
    ``layer_groups()[i]``: the block, its NFM pass copies and readers) ``1 + i``, anything else last."""
    names = {id(m): n for n, m in model.named_modules()}
    groups = [[names[id(m)] for m in group] for group in model.layer_groups()]
    stem = [n for n in model.stem_modules if any(_under(p, n) for p, _ in model.named_parameters())]
    out = {}
    for p, _ in model.named_parameters():
        depth = [i for i, g in enumerate(groups) if any(_under(p, m) for m in g)]
        assert len(depth) <= 1, (p, depth)
        out[p] = 0 if any(_under(p, n) for n in stem) else (1 + depth[0] if depth else 1 + len(groups))
    if not stem:                                     # no stem group: every ordinal one lower
        out = {p: i - 1 for p, i in out.items()}
    return out


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_every_parameter_is_ordered_by_depth_as_timm_reads_the_matcher(name):
    with torch.device("meta"):
        model = modwire.create_model(name)
    got, expected = timm_layer_map(model), expected_layers(model)
    assert got == expected
    blocks = len(model.intermediate_blocks())
    assert len(model.layer_groups()) == blocks
    assert max(got.values()) == blocks + (model.group_matcher()["stem"] is not None)
    # what lands in the last group is the final norm and the head, nothing of a block
    last = {p.split(".")[0] for p, i in got.items() if i == max(got.values())}
    assert last <= HEAD[model.config.model_type] and model.classifier_name().split(".")[0] in last
    # every block's own parameters sit at its depth, in order
    names = {id(m): n for n, m in model.named_modules()}
    for i, (block, _) in enumerate(model.intermediate_blocks()):
        own = {got[p] for p, _ in model.named_parameters() if _under(p, names[id(block)])}
        assert own == {i + (model.group_matcher()["stem"] is not None)}, (names[id(block)], own)
    assert model.group_matcher(coarse=True) == model.group_matcher()


def test_vit_groups_and_layer_decay_scales_are_timms_vision_transformer_ones():
    model = modwire.create_model("vit_micro")
    layers = timm_layer_map(model)
    # timm's ViT: stem = cls token, position and patch embedding (BEiT's shared relative bias too), then
    # one group per block, then the final norm and the head
    assert {n for n, i in layers.items() if i == 0} == {n for n, _ in model.named_parameters()
                                                          if n.split(".")[0] in ("embed", "cls_tokens", "relative")}
    assert layers["blocks.0.attn.fn.q.weight"] == 1 and layers["blocks.1.ffn.fn.fc2.bias"] == 2
    assert layers["norm.weight"] == layers["heads.weight"] == 3
    scales = layer_scales(layers, 0.5)
    assert scales["embed.proj.weight"] == 0.125 and scales["blocks.1.ffn.fn.fc2.bias"] == 0.5
    assert scales["norm.weight"] == scales["heads.weight"] == 1.0
    # timm's fallback without a matcher (auto_group_layers): the classifier last, the rest in runs of 12
    # parameters in registration order, which here gives the final norm (registered before the blocks)
    # the embedding's group, the smallest scale
    head = model.pretrained_cfg["classifier"]
    trunk = [n for n, _ in model.named_parameters() if not n.startswith(head)]
    fallback = {n: i // 12 for i, n in enumerate(trunk)}
    assert fallback["norm.weight"] == fallback["embed.proj.weight"] == 0 != layers["norm.weight"]


def test_nfm_readers_and_pass_copies_sit_with_their_block():
    model = modwire.create_model("nfm_preact_resnet_micro")
    layers = timm_layer_map(model)
    body = model.body
    assert body.passes == 2 and body.num_blocks == 2 and not body.share_blocks
    for i in range(body.num_blocks):
        depth = 1 + i                                                      # the stem conv is 0
        for prefix in (f"body.blocks.{i}.", f"body.pass_blocks.0.{i}.", f"body.readers.{i}.",
                       f"body.readers.{body.num_blocks + i}."):
            got = {layers[n] for n in layers if n.startswith(prefix)}
            assert got == {depth}, (prefix, got)
    assert layers["stem.weight"] == 0 and layers["head.weight"] == 3


def test_group_matcher_refuses_a_coarse_that_is_not_a_bool():
    with pytest.raises(UserTypeError, match=r"coarse must be a bool, got 'yes'"):
        modwire.create_model("vit_micro").group_matcher("yes")


def test_a_model_without_stem_modules_has_no_stem_group():
    model = modwire.create_model("cnn_mlp_micro")                       # its stem convs are blocks
    matcher = model.group_matcher()
    assert matcher["stem"] is None and len(matcher["blocks"]) == len(model.intermediate_blocks())
    layers = timm_layer_map(model)
    assert min(layers.values()) == 0 and layers[f"{model.classifier_name()}.weight"] == len(matcher["blocks"])
    assert math.isclose(layer_scales(layers, 0.75)[next(iter(layers))], 0.75 ** len(matcher["blocks"]))
