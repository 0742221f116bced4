"""`modwire analyze` on a Neural Interpreter: its functions are the module axis (NI Fig. 5c), and
FLOPs are counted through its relative positions (whose embedding tables are module inputs)."""
import torch

import modwire
from modwire.analysis import drop_modules
from modwire.analysis.flops import count_flops


def test_dropping_functions_through_the_module_axis_cuts_flops_and_keeps_the_rest():
    torch.manual_seed(0)
    model = modwire.create_model("ni_micro").eval()             # 3 functions, relative positions
    x = torch.rand(4, 1, 8, 8)
    full = count_flops(lambda: model(x))
    small = drop_modules(model, 1 / 3)                          # one of three functions dropped
    assert small.config.num_functions == 2 and model.config.num_functions == 3
    assert 0 < count_flops(lambda: small(x)) < full
    kept = [i for i in range(3) if any(torch.equal(small.scripts[0].functions.codes[j],
                                                   model.scripts[0].functions.codes[i]) for j in range(2))]
    reference = modwire.create_model("ni_micro").eval()
    reference.load_state_dict(model.state_dict())
    reference.drop_functions([i for i in range(3) if i not in kept])
    with torch.no_grad():
        torch.testing.assert_close(small(x), reference(x))


def test_flops_of_a_vit_with_relative_positions_are_counted():
    model = modwire.create_model("vit_micro").eval()
    assert count_flops(lambda: model(torch.rand(2, 1, 8, 8))) > 0
