"""Probe: head counts and index inputs a model or a task cannot use give clear errors."""
import pytest

from modwire.models import get_config
from modwire.models.inputs import InputSpec
from modwire.tasks import TaskInfo


@pytest.mark.parametrize("preset, kind", [("nac_micro", "'nac'"), ("perceiver_io_micro", "'perceiver_io'")])
def test_single_readout_models_refuse_several_heads(preset, kind):
    with pytest.raises(ValueError, match=rf"heads=20 predictions per sample.*{kind} model has a single read-out"
                                         r".*ViT or Neural Interpreter.*layout: pair"):
        get_config(preset).for_inputs(InputSpec.vectors(5, 1, ordered=True), 1, heads=20)


def test_tokenizers_refuse_an_index_input():
    with pytest.raises(ValueError, match=r"not an index input \(InputSpec.index\(vocab_size=3\)"):
        get_config("perceiver_io_micro").for_inputs(InputSpec.index(3), 10)
    with pytest.raises(ValueError, match="not an index input"):
        get_config("nac_micro").for_inputs({"x": InputSpec.image(3, 32, 32), "condition": InputSpec.index(3)}, 10)


@pytest.mark.parametrize("make, match", [
    (lambda: InputSpec.index(0), r"InputSpec.vocab_size \(index\): got 0, expected a positive int"),
    (lambda: InputSpec("index", vocab_size=3, length=2), r"fields \['length'\] do not apply"),
    (lambda: TaskInfo("t", "generator", "", 2, InputSpec.vectors(6, 8), heads=0),
     r"task 't': heads must be a positive int .*got 0"),
    (lambda: TaskInfo("t", "generator", "", 2, InputSpec.vectors(6, 8), heads=True), "heads must be a positive int"),
    (lambda: TaskInfo("t", "generator", "", describe=lambda p: (InputSpec.vectors(6, 8),)),
     r"describe\(params\) must return \(inputs, num_classes\) or \(inputs, num_classes, heads\)"),
])
def test_bad_index_specs_and_head_counts(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()
