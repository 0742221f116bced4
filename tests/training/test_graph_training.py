"""The graph prior in training (NAC §2.2, App. A), Table 1's frozen graph, and
block-sparse inference of an edge-eliminated NAC (App. F)."""
import json
from pathlib import Path

import pytest
import torch

import modwire
import toy_task  # noqa: F401  (registers "toy_sets")
from modwire.analysis import eliminate_edges
from modwire.analysis.sparsify import block_sparse, prior_groups
from modwire.graphs import GraphRegularizer, prior, sample_adjacency
from modwire.training import build_model_for_task, load_config, train
from modwire.training.optim import build_optimizer

ROOT = Path(__file__).resolve().parents[2]


def cfg(tmp_path, *extra):
    return load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=nac_micro", "data.task=toy_sets",
                              "data.batch_size=16", "epochs=2", "optim.lr=3e-3", "progress=false",
                              "log_every=1", *extra])


def graph_losses(run):
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["aux/graph"] for r in records if "aux/graph" in r]


def test_training_with_a_graph_prior_logs_and_reduces_the_regularizer(tmp_path):
    heavy = train(cfg(tmp_path / "a", "optim.lr=0.05", "epochs=3", "data.batch_size=8", "aux_loss_weights.graph=10",
                      "model.overrides.graph_prior={name: planted_partition, "
                      "params: {num_clusters: 3, p_in: 0.9, p_out: 0.05}}"))
    losses = graph_losses(tmp_path / "a" / "run")
    assert len(losses) == heavy["step"] == 24
    assert losses[-1] < 0.7 * losses[0]                     # the prior pulls P towards it
    # the logged value is the regularizer of the model's P *before* the step it was added to
    reg = GraphRegularizer("planted_partition", {"num_clusters": 3, "p_in": 0.9, "p_out": 0.05})
    final = reg(heavy["model"].link_probs()).item()
    assert final < losses[0]
    # without the prior the same run leaves P further from it
    plain = train(cfg(tmp_path / "b", "optim.lr=0.05", "epochs=3", "data.batch_size=8"))
    assert graph_losses(tmp_path / "b" / "run") == []
    assert reg(plain["model"].link_probs()).item() > final


def test_graph_prior_weight_is_what_is_added_to_the_loss(tmp_path):
    """One plain SGD step with weight w moves the signatures by the task gradient plus
    w times the regularizer's gradient (lr at step 0 is optim.lr: no warm-up)."""
    sgd = ["max_steps=1", "optim.name=sgd", "optim.betas=[0.0, 0.0]", "optim.grad_clip=0", "optim.weight_decay=0"]
    torch.manual_seed(0)  # as train() does with seed 0: the same initial signatures
    start = build_model_for_task(cfg(tmp_path)).generator.processors.signatures.detach()
    with_prior = ["model.overrides.graph_prior=erdos_renyi", "aux_loss_weights.graph=100"]
    a = train(cfg(tmp_path / "a", *sgd, *with_prior))["model"]
    b = train(cfg(tmp_path / "b", *sgd))["model"]
    s = start.clone().requires_grad_()
    (g,) = torch.autograd.grad(100 * GraphRegularizer("erdos_renyi")(a.kernel.link_probs(s, s)), s)
    diff = b.generator.processors.signatures.detach() - a.generator.processors.signatures.detach()
    assert diff.abs().max() > 1e-2  # well above float32 rounding of the signatures
    torch.testing.assert_close(diff, 3e-3 * g, rtol=1e-4, atol=1e-6)


def test_graph_prior_needs_link_probabilities(tmp_path):
    with pytest.raises(ValueError, match="graph_prior.loss"):
        train(cfg(tmp_path, "model.overrides.graph_prior={name: scale_free, loss: l1}"))
    with pytest.raises(ValueError, match="graph_prior.name.*link probabilities"):
        modwire.create_model("nac_micro", kernel={"enabled": False}, graph_prior="scale_free")
    with pytest.raises(ValueError, match="graph_prior.name.*conditional generator"):
        modwire.create_model("nac_micro", generator={"kind": "conditional", "tokenizer": {"vocab_size": 5}},
                             graph_prior="scale_free")
    with pytest.raises(ValueError, match="graph_prior.align.*'degree'"):
        modwire.create_model("nac_micro", graph_prior={"name": "scale_free", "align": "sideways"})


def test_a_reported_aux_loss_needs_a_weight_and_a_weight_needs_a_loss(tmp_path):
    with pytest.raises(ValueError, match=r"\['graph'\].*no weight: set aux_loss_weights.graph"):
        train(cfg(tmp_path / "a", "model.overrides.graph_prior=scale_free"))
    with pytest.raises(ValueError, match="'aux_loss_weights.balance'.*no auxiliary loss named 'balance'"):
        train(cfg(tmp_path / "b", "aux_loss_weights.balance=0.1"))


def test_the_model_reports_the_graph_loss_only_in_training():
    m = modwire.create_model("nac_micro", graph_prior="erdos_renyi")
    x = torch.randn(2, 5, 8)
    m.train()(x)
    (loss,) = m.auxiliary_losses().values()
    expected = GraphRegularizer("erdos_renyi")(m.link_probs())
    torch.testing.assert_close(loss, expected)
    assert loss.requires_grad
    m.eval()(x)
    assert m.auxiliary_losses() == {}


def test_table1_configs_cover_the_rows():
    rows = sorted((ROOT / "configs" / "table1").glob("[0-9]_*.yaml"))  # _base.yaml: their shared part
    assert len(rows) == 7
    cfgs = [load_config(str(p)) for p in rows]
    assert cfgs[0].model.name == "perceiver_io_tiny_imagenet"
    row2, row3 = (modwire.get_config(c.model.name, **c.model.overrides) for c in cfgs[1:3])
    assert len(cfgs[1].model.overrides) == 1 and row2.kernel.enabled is False      # "+ ModFC": kernel off
    assert row3.frozen_graph.name == "scale_free" and row3.graph_prior.name is None
    priors = [modwire.get_config(c.model.name, **c.model.overrides).graph_prior.name for c in cfgs[3:]]
    assert priors == ["scale_free", "planted_partition", "ring_of_cliques", "erdos_renyi"]
    assert all(c.aux_loss_weights["graph"] > 0 for c in cfgs[3:])
    assert len({c.out_dir for c in cfgs}) == 7


def test_frozen_graph_signatures_fit_the_sampled_graph_and_do_not_train(tmp_path):
    m = modwire.create_model("nac_micro", num_processor_modules=24, frozen_graph={"name": "planted_partition",
                             "params": {"num_clusters": 3, "p_in": 1.0, "p_out": 0.0}})
    a = sample_adjacency("planted_partition", 24, seed=0, num_clusters=3, p_in=1.0, p_out=0.0)
    p = m.link_probs().detach()
    off = ~torch.eye(24, dtype=torch.bool)
    assert p[(a > 0) & off].min() > 0.9 and p[(a == 0)].max() < 0.3     # three separated cliques
    assert not m.generator.processors.signatures.requires_grad
    opt = build_optimizer(m, load_config(None).optim)
    assert all(q is not m.generator.processors.signatures for g in opt.param_groups for q in g["params"])
    again = modwire.create_model("nac_micro", num_processor_modules=24, frozen_graph={"name": "planted_partition",
                                 "params": {"num_clusters": 3, "p_in": 1.0, "p_out": 0.0}})
    assert torch.equal(again.generator.processors.signatures, m.generator.processors.signatures)   # deterministic
    with pytest.raises(ValueError, match="frozen_graph"):
        modwire.create_model("nac_micro", kernel={"enabled": False}, frozen_graph="scale_free")


@pytest.fixture
def clustered_nac():
    """A NAC whose P has a planted partition structure (4 clusters of 6), in scrambled order."""
    torch.manual_seed(0)
    m = modwire.create_model("nac_micro", num_processor_modules=24).eval()
    target = prior("planted_partition", 24, num_clusters=4, p_in=1.0, p_out=0.0)
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(0))    # scrambled, independent of the model's draws
    from modwire.graphs.fit import fit_signatures
    with torch.no_grad():
        m.generator.processors.signatures.copy_(fit_signatures(target[perm][:, perm], 8))
    return m


def test_block_sparse_nac_equals_the_dense_edge_eliminated_nac(clustered_nac):
    x = torch.randn(5, 7, 8, generator=torch.Generator().manual_seed(1))
    masked, mask = eliminate_edges(clustered_nac, 0.8)
    groups = prior_groups(masked, "planted_partition", num_clusters=4, p_in=1.0, p_out=0.0)
    assert torch.equal(torch.bincount(groups), torch.full((4,), 6))
    fast = block_sparse(masked, block_size=6, groups=groups)
    layout = fast.propagator_kernel.pattern.layout
    assert layout.density <= 0.5                              # kept edges fall in few blocks
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), masked(x), rtol=1e-5, atol=1e-5)
        rcm = block_sparse(masked, block_size=4)               # ordering by reverse Cuthill-McKee
        torch.testing.assert_close(rcm(x), masked(x), rtol=1e-5, atol=1e-5)
    fast.train()
    with pytest.raises(RuntimeError, match="inference only"):
        fast(x)
    with pytest.raises(ValueError, match="edge-eliminated"):
        block_sparse(clustered_nac, 6)
