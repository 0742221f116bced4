"""timm's ``num_classes=0`` on every classifier: built (``create_model(name, num_classes=0)``) or reset
(``reset_classifier(0)``) without its last linear layer, the model returns what that layer reads,
``forward_head(forward_features(x), pre_logits=True)``; a class count given later builds a fresh layer."""
import pytest
import torch

import modwire
from modwire.errors import UserError
from modwire.models.classifier_api import Classifier
from modwire.models.registry import get_preset

MICRO = [n for n in modwire.list_models() if n.endswith("_micro") and issubclass(get_preset(n)[0], Classifier)]


def _inputs(model, batch=3):
    inputs = model.config.example_inputs(batch, seed=1)
    return inputs.pop("x"), inputs


def _features(model, x, kw):
    return model.forward_head(model.forward_features(x, **kw), pre_logits=True, **kw)


@pytest.mark.parametrize("name", MICRO)
def test_a_model_built_without_classifier_returns_the_features_its_classifier_would_read(name):
    torch.manual_seed(0)
    full = modwire.create_model(name).eval()
    torch.manual_seed(0)
    bare = modwire.create_model(name, num_classes=0).eval()
    head = full.classifier_name()
    assert bare.num_classes == bare.config.num_classes == 0 and isinstance(bare.get_classifier(), torch.nn.Identity)
    state = {n: t for n, t in full.state_dict().items() if not n.startswith(head + ".")}
    assert set(state) == set(bare.state_dict())                  # the same network less the last linear layer
    bare.load_state_dict(state)
    x, kw = _inputs(full)
    with torch.no_grad():
        expected = _features(full, x, kw)
        out = bare(x, **kw)
    assert out.shape[-1] == full.head_hidden_size
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(_features(bare, x, kw), out, rtol=0, atol=0)
        torch.testing.assert_close(bare.forward_head(bare.forward_features(x, **kw), **kw), out, rtol=0, atol=0)
        if isinstance(full.get_classifier(), torch.nn.Linear):    # what the classifier reads: its logits
            torch.testing.assert_close(full.get_classifier()(expected), full(x, **kw), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", MICRO)
def test_reset_to_no_classifier_and_back(name, tmp_path):
    torch.manual_seed(0)
    model = modwire.create_model(name).eval()
    x, kw = _inputs(model)
    with torch.no_grad():
        expected = _features(model, x, kw)
    model.reset_classifier(0)
    with torch.no_grad():
        torch.testing.assert_close(model(x, **kw), expected, rtol=0, atol=0)
    # saved and read back without a classifier
    model.save_pretrained(tmp_path / "bare")
    again = modwire.from_pretrained(tmp_path / "bare").eval()
    assert again.config.num_classes == 0
    with torch.no_grad():
        torch.testing.assert_close(again(x, **kw), expected, rtol=0, atol=0)
    # a class count again: a fresh last layer on the kept features
    model.reset_classifier(4)
    layer = model.get_classifier()
    assert model.num_classes == model.config.num_classes == 4
    assert next(layer.parameters()).shape[-2:] == (4, model.head_hidden_size)    # the weight: [(T,) 4, d]
    with torch.no_grad():
        logits = model(x, **kw)
    assert logits.shape[-1] == 4
    if isinstance(layer, torch.nn.Linear):
        assert (layer.in_features, layer.out_features) == (model.head_hidden_size, 4)
        torch.testing.assert_close(logits, layer(expected), rtol=1e-6, atol=1e-6)


def test_what_refuses_no_classifier():
    with pytest.raises(UserError, match=r"config field 'num_classes': got -1, expected an integer >= 0 \(0: no "
                                        r"classifier \(timm's num_classes=0\)"):
        modwire.create_model("vit_micro", num_classes=-1)
    with pytest.raises(UserError, match="num_classes=1"):        # a PGM model scores each candidate
        modwire.create_model("vit_pgm", num_classes=0)
    with pytest.raises(UserError, match="new_task: num_classes must be a positive int, got 0"):
        modwire.create_model("preact_resnet_micro").new_task(0)  # fine-tuning needs classes
