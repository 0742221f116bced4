"""Issue 35: no trainable tensor of any preset is dead — a random change of it moves the training
objective (the output, plus the auxiliary losses the model reports: AiT's balance loss, NAC's graph
regularizer, a GAN's InfoMax term).

A parameter that changes no output is a parameter that does nothing (the developer guide: "no parameter
that does nothing (a key bias a softmax cancels)"); it also gets no gradient, which DDP rejects. The
check, in float64, for every preset:

1. one backward of a random linear functional of the output (plus the auxiliary losses) flags the
   tensors whose gradient is at rounding level (a softmax-cancelled bias gets ~1e-17);
2. each flagged tensor is then moved by a random change and the output compared: a tensor whose change
   moves nothing (beyond rounding) is dead. (Step 2 keeps a live tensor that happens to sit at a
   zero-gradient point, e.g. behind a ReLU that is off for this input, from being reported.)

Every forward runs from the same state (buffers restored: AiT's memory is written by a training forward)
and the same random stream (NAC samples its kernel, dropout draws masks).

The one exception, stated: NFM's residual gate γ starts at 0 (NFM Algorithm 1, "γ initialised to 0",
so that an NFM starts as its base network). At γ = 0 every reader's projections change nothing by
construction, so the test first moves every γ off 0; then every tensor, γ included, must be live.
"""
import copy
import sys
from pathlib import Path

import pytest
import torch

import modwire

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_contract import BIG, PRESETS, make_inputs  # noqa: E402

REAL = [pytest.param(name, marks=pytest.mark.slow) if name in BIG else name for name in PRESETS]
GRAD_FLOOR = 1e-11        # |∂objective/∂p| below this (float64, objective of order 1) is rounding level
MOVE_FLOOR = 1e-9         # an output change below this after a random change of p is "no change"


def _forward(model, state, x, kwargs):
    """The model from ``state`` (parameters and buffers) under a fixed random stream:
    ``(output, Σ auxiliary losses)``."""
    model.load_state_dict(state)
    torch.manual_seed(123)
    out = model(x, **kwargs)
    return (out if torch.is_tensor(out) else out[0]), sum(model.auxiliary_losses().values())


def _objective(model, state, x, kwargs, weights):
    """``Σ weights · output + Σ auxiliary losses``: a random linear functional of the output."""
    out, aux = _forward(model, state, x, kwargs)
    return (weights * out).sum() + aux


def _nfm_gates_off_zero(model) -> int:
    """NFM's stated exception: every γ (NFM Algorithm 1, 0 at initialisation) moved to 0.5."""
    gates = [p for n, p in model.named_parameters() if n.split(".")[-1] == "gamma"]
    with torch.no_grad():
        for g in gates:
            g.fill_(0.5)
    return len(gates)


def dead_tensors(model, x, kwargs) -> list[str]:
    """Names of the trainable tensors whose random change moves nothing (module docstring)."""
    _nfm_gates_off_zero(model)
    state = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        out, _ = _forward(model, state, x, kwargs)
    weights = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(7))
    model.zero_grad(set_to_none=True)
    _objective(model, state, x, kwargs, weights).backward()
    flagged = [n for n, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or p.grad.abs().max() < GRAD_FLOOR)]
    dead = []
    params = dict(model.named_parameters())
    with torch.no_grad():
        base = _objective(model, state, x, kwargs, weights)
        for name in flagged:
            moved = dict(state)
            p = params[name]
            moved[name] = state[name] + torch.randn(p.shape, dtype=p.dtype,
                                                   generator=torch.Generator().manual_seed(11))
            if (_objective(model, moved, x, kwargs, weights) - base).abs() < MOVE_FLOOR:
                dead.append(name)
        model.load_state_dict(state)
    return dead


@pytest.mark.parametrize("name", REAL)
def test_no_trainable_tensor_of_a_preset_is_dead(name):
    torch.manual_seed(0)
    model = modwire.create_model(name).double().train()
    x, kwargs = make_inputs(model.config)
    x = x.double() if x.is_floating_point() else x
    kwargs = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kwargs.items()}
    assert dead_tensors(model, x, kwargs) == []


class _WithDeadBias(torch.nn.Module):
    """A softmax over scores with a per-row bias (the bias cancels: the case the test exists for), and
    a ReLU branch that is off for every input (zero gradient, but a random change turns it on: live)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(3, 4, dtype=torch.float64)
        self.row_bias = torch.nn.Parameter(torch.randn(1, dtype=torch.float64))
        self.gate = torch.nn.Linear(3, 1, dtype=torch.float64)
        with torch.no_grad():
            self.gate.weight.zero_(), self.gate.bias.fill_(-0.1)

    def auxiliary_losses(self):
        return {}

    def forward(self, x):
        return (self.w(x) + self.row_bias).softmax(-1) + torch.relu(self.gate(x))


def test_the_check_finds_a_bias_the_softmax_cancels_and_keeps_a_live_tensor_at_a_zero_gradient():
    torch.manual_seed(0)
    model = _WithDeadBias()
    x = torch.randn(5, 3, dtype=torch.float64)
    out = model(x)
    out.sum().backward()
    assert float(model.gate.weight.grad.abs().max()) == 0.0             # the ReLU branch: zero gradient
    assert dead_tensors(model, x, {}) == ["row_bias"]


def test_nfm_gates_start_at_zero_and_are_the_stated_exception():
    model = modwire.create_model("nfm_cnn_mlp_micro")
    gates = [p for n, p in model.named_parameters() if n.split(".")[-1] == "gamma"]
    assert gates and all(float(g.detach()) == 0.0 for g in gates)  # NFM Algorithm 1: γ = 0 at the start
    assert _nfm_gates_off_zero(model) == len(gates) and all(float(g.detach()) == 0.5 for g in gates)
