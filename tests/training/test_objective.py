"""Issue 38 item 3: the public training objective (``modwire.training.Objective``) is the loss
``modwire train`` optimises: task loss plus the configured weights times the auxiliary losses (NAC's
graph regularizer, AiT's balance loss), the epoch hook and the parameter groups. A loop of one's own
built on it gives, step by step, the values ``modwire train`` logs (docs/training.md's examples are
checked the same way in tests/test_readme.py)."""
import json
from dataclasses import replace

import pytest
import torch

from modwire.seeding import torch_generator
from modwire.tasks import get_task
from modwire.training import Objective, build_datasets, build_model_for_task, load_config, make_loader, train
from modwire.training.distributed import EpochSampler
from modwire.training.optim import build_optimizer, build_scheduler

DIGITS = ("data.task=digits", "data.params.size=8", "data.max_samples=32", "data.batch_size=16", "optim.lr=3e-3")
AIT_RESET = ("model.name=ait_micro", "model.overrides.memory_reset=epoch", "aux_loss_weights.balance=0.5")
NAC_GRAPH = ("model.name=nac_micro", "model.overrides.graph_prior={name: scale_free}", "aux_loss_weights.graph=0.1")


def _cfg(*extra):
    return load_config(None, [*DIGITS, *extra])


def _own_loop(cfg) -> list[dict]:
    """A hand-written loop on the public pieces (docs/training.md); each step's ``loss.logged()`` as floats."""
    torch.manual_seed(cfg.seed)
    model = build_model_for_task(cfg)
    train_set, _ = build_datasets(cfg)
    sampler = EpochSampler(len(train_set), cfg.seed)
    loader = make_loader(train_set, cfg.data.batch_size, sampler, get_task(cfg.data.task), 0, drop_last=True)
    objective = Objective.from_config(cfg)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.epochs * len(loader), cfg.optim)
    history = []
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        objective.start_epoch(model, epoch)
        for x, y in loader:
            loss = objective(model, x, y)
            loss.total.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            history.append({k: v.item() for k, v in loss.logged().items()})
    return history


def _logged(cfg, out) -> list[dict]:
    train(replace(cfg, out_dir=str(out), log_every=1, progress=False))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k == "loss" or k.startswith("aux/")} for r in records if "lr" in r]


@pytest.mark.parametrize("extra", [NAC_GRAPH, AIT_RESET], ids=["nac_graph", "ait_balance_reset"])
def test_an_own_loop_on_the_objective_logs_what_modwire_train_logs(tmp_path, extra):
    """Bit-equal at every step of 2 epochs: same weights, batches, loss, auxiliary weights, epoch hook
    and parameter groups (a wrong weight changes the gradients, so the later steps)."""
    cfg = _cfg("epochs=2", *extra)
    logged = _logged(cfg, tmp_path / "run")
    assert len(logged) == 4 and len(logged[0]) == 2                        # loss and one aux/<name>
    assert _own_loop(cfg) == logged


def test_the_total_is_the_task_loss_plus_the_weighted_auxiliary_losses():
    cfg = _cfg(*NAC_GRAPH)
    torch.manual_seed(0)
    model = build_model_for_task(cfg)
    x, y = torch.rand(4, 1, 8, 8), torch.tensor([0, 3, 9, 1])
    torch.manual_seed(1)                       # the forward draws (NAC's sampled kernels): the same twice
    loss = Objective.from_config(cfg)(model, x, y)
    torch.manual_seed(1)
    task = torch.nn.functional.cross_entropy(model(x), y)                  # the same forward again
    torch.testing.assert_close(loss.task, task, rtol=0, atol=0)
    assert set(loss.aux) == {"graph"} and loss.aux["graph"] > 0
    assert loss.total.item() == (loss.task + 0.1 * loss.aux["graph"]).item()
    out = model(x)
    split = Objective.from_config(cfg).of_output(model, out, y, micro_batches=4)   # one of 4 micro-batches
    assert split.total.item() == (split.task / 4 + 0.1 * split.aux["graph"] / 4).item()


def test_the_model_default_weight_applies_unless_configured():
    ait = build_model_for_task(_cfg("model.name=ait_micro"))
    assert Objective.from_config(_cfg("model.name=ait_micro")).weights(ait) == {"balance": 1e-2}   # AiT Eq. 6
    assert Objective.from_config(_cfg("model.name=ait_micro", "aux_loss_weights.balance=0")).weights(ait) == \
        {"balance": 0.0}


def test_a_loss_without_a_weight_and_a_weight_without_a_loss_are_refused():
    x, y = torch.rand(2, 1, 8, 8), torch.tensor([0, 1])
    cfg = _cfg("model.name=nac_micro", "model.overrides.graph_prior={name: scale_free}")
    with pytest.raises(ValueError, match=r"reports the auxiliary loss\(es\) \['graph'\].*aux_loss_weights.graph"):
        Objective.from_config(cfg)(build_model_for_task(cfg), x, y)
    cfg = _cfg("model.name=nac_micro", "aux_loss_weights.graph=0.1")      # no graph prior: no graph loss
    with pytest.raises(ValueError, match=r"'aux_loss_weights.graph': model 'nac_micro' reports no auxiliary loss"):
        Objective.from_config(cfg)(build_model_for_task(cfg), x, y)


def test_the_epoch_hook_redraws_an_ait_memory_from_seed_and_epoch_and_leaves_others_alone():
    cfg = _cfg("model.name=ait_micro", "model.overrides.memory_reset=epoch", "seed=3")    # Table 2's reset
    a, b = build_model_for_task(cfg), build_model_for_task(cfg)
    first = {n: t.clone() for n, t in a.state_dict().items() if n.endswith("workspace.memory")}
    Objective.from_config(cfg).start_epoch(a, 2)
    b.start_epoch(2, torch_generator(3, 2))                                  # (seed, epoch)
    assert first and all(torch.equal(a.state_dict()[n], b.state_dict()[n]) for n in first)
    assert not any(torch.equal(a.state_dict()[n], t) for n, t in first.items())           # redrawn
    nac = build_model_for_task(_cfg("model.name=nac_micro"))
    before = {k: v.clone() for k, v in nac.state_dict().items()}
    Objective.from_config(_cfg("model.name=nac_micro")).start_epoch(nac, 0)
    assert all(torch.equal(v, nac.state_dict()[k]) for k, v in before.items())


def test_the_parameter_groups_are_the_optimizers():
    cfg = _cfg("model.name=nac_micro", "optim.weight_decay=0.02")
    model = build_model_for_task(cfg)
    groups = Objective.from_config(cfg).param_groups(model)
    built = build_optimizer(model, cfg.optim).param_groups
    assert [g["weight_decay"] for g in groups] == [g["weight_decay"] for g in built] == [0.02, 0.0]
    assert [[id(p) for p in g["params"]] for g in groups] == [[id(p) for p in g["params"]] for g in built]
    exempt = {id(p) for n, p in model.named_parameters() if n in set(model.no_weight_decay())}
    assert {id(p) for p in groups[1]["params"]} == exempt and exempt
