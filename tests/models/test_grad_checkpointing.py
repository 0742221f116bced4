"""timm's ``set_grad_checkpointing``: the models whose blocks recompute exactly run each block again in the
backward and give the same outputs and gradients; the others refuse, saying why."""
import copy

import pytest
import torch

import modwire
from modwire.errors import UserError, UserTypeError

CHECKPOINTED = ["vit_micro", "ni_micro", "nac_micro", "nac_conditional_micro", "perceiver_io_micro",
                "transformer_lm_micro", "nfm_transformer_lm_micro"]
BLOCKS = {"ViT": "blocks", "NeuralInterpreter": "scripts", "NAC": "propagators", "PerceiverIO": "propagators",
          "TransformerLM": "body.blocks"}


def _step(model: torch.nn.Module, inputs: dict, calls: list[int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One training step's logits and gradients; ``calls``: how often the first block's forward ran."""
    first = model.get_submodule(BLOCKS[type(model).__name__])[0]
    handle = first.register_forward_pre_hook(lambda *args: calls.append(1))   # a recompute may stop early
    try:
        torch.manual_seed(0)                               # NAC's sampled kernel: the same draws on both sides
        out = model(**inputs)
        (out.float().square().mean() + sum(model.auxiliary_losses().values(), torch.zeros(()))).backward()
    finally:
        handle.remove()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", CHECKPOINTED)
def test_a_checkpointed_model_recomputes_its_blocks_and_gives_the_same_outputs_and_gradients(name):
    torch.manual_seed(0)
    plain = modwire.create_model(name).train()
    ckpt = copy.deepcopy(plain)
    ckpt.set_grad_checkpointing()
    assert ckpt.grad_checkpointing and not plain.grad_checkpointing
    inputs = plain.config.example_inputs(3)
    once, twice = [], []
    out, grads = _step(plain, inputs, once)
    out_c, grads_c = _step(ckpt, inputs, twice)
    assert len(twice) == 2 * len(once) >= 2              # each call run again in the backward
    torch.testing.assert_close(out_c, out, rtol=0, atol=0)
    assert grads_c.keys() == grads.keys() and len(grads) > 0
    for n in grads:
        torch.testing.assert_close(grads_c[n], grads[n], rtol=1e-6, atol=1e-7, msg=n)


def test_checkpointing_keeps_fewer_activations_for_the_backward():
    saved = {}

    def saved_bytes(model, inputs):
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(**inputs).square().mean().backward()
        return total[0]
    model = modwire.create_model("vit_micro").train()
    inputs = model.config.example_inputs(8)
    saved["plain"] = saved_bytes(model, inputs)
    model.set_grad_checkpointing(True)
    saved["checkpointed"] = saved_bytes(model, inputs)
    assert saved["checkpointed"] < saved["plain"] / 2, saved


def test_without_gradients_nothing_is_recomputed_and_it_can_be_turned_off():
    model = modwire.create_model("vit_micro")
    model.set_grad_checkpointing()
    calls = []
    model.blocks[0].register_forward_pre_hook(lambda *args: calls.append(1))
    inputs = model.config.example_inputs(2)
    with torch.no_grad():
        model(**inputs)
    assert len(calls) == 1
    model.set_grad_checkpointing(False)
    model(**inputs).sum().backward()
    assert len(calls) == 2 and not model.grad_checkpointing


@pytest.mark.parametrize("name, why", [
    ("ait_micro", "this AiT writes each layer's workspace memory in a training forward"),
    ("preact_resnet_micro", "this PreActResNet has BatchNorm in its blocks"),
    ("nfm_cnn_mlp_micro", "this CNNMLP has BatchNorm in its blocks"),
    ("gan_resnet_micro", "this GAN runs no blocks that recompute in the backward")])
def test_a_model_whose_blocks_cannot_recompute_refuses_saying_why_and_which_can(name, why):
    model = modwire.create_model(name)
    with pytest.raises(UserError) as err:
        model.set_grad_checkpointing(True)
    assert why in str(err.value) and "NAC, NeuralInterpreter, PerceiverIO, TransformerLM, ViT" in str(err.value)
    assert not model.grad_checkpointing
    model.set_grad_checkpointing(False)                      # turning it off is always possible


def test_enable_must_be_a_bool():
    with pytest.raises(UserTypeError, match="enable must be a bool, got str 'yes'"):
        modwire.create_model("vit_micro").set_grad_checkpointing("yes")


def test_the_lm_body_checkpoints_every_pass_and_follows_the_switch():
    model = modwire.create_model("nfm_transformer_lm_micro").train()
    body = model.body
    assert body.passes == 2 and body.share_blocks            # each block runs in both passes
    calls = []
    for i, block in enumerate(body.blocks):
        block.register_forward_pre_hook(lambda *args, i=i: calls.append(i))
    model.set_grad_checkpointing()
    assert body.grad_checkpointing
    model(**model.config.example_inputs(2)).square().mean().backward()
    assert sorted(calls) == sorted(list(range(body.num_blocks)) * body.passes * 2)   # each call once more
    model.set_grad_checkpointing(False)
    assert not body.grad_checkpointing


@pytest.mark.slow
def test_a_checkpointed_vit_compiles_fullgraph_once_and_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = modwire.create_model("vit_micro").train()
    model = copy.deepcopy(eager)
    model.set_grad_checkpointing()
    compiled = torch.compile(model, fullgraph=True)
    inputs = eager.config.example_inputs(4)
    for _ in range(2):                                       # a second call: no recompile
        for m in (eager, compiled):
            m.zero_grad(set_to_none=True)
            m(**inputs).square().mean().backward()
    for (n, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=n)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
