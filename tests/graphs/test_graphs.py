"""modwire.graphs: graph priors (NAC App. A, Eq. 7-8) and the graph structure
regularizer (Eq. 6, 9), checked against literal re-statements of the equations."""
import itertools
import math
import subprocess
import sys

import networkx as nx
import pytest
import torch

from modwire.graphs import (GraphRegularizer, block_assignment, graph_loss, list_priors, match,
                            matching_cost, prior, sample_adjacency, sample_graph)


def link_probs(U, seed=0, d=16, eps=1.0, dtype=torch.float64):
    """A realistic P (NAC Eq. 2): exp(-(1 - cos)/ε) of random signatures; symmetric, P_ii = 1."""
    g = torch.Generator().manual_seed(seed)
    s = torch.nn.functional.normalize(torch.randn(U, d, generator=g, dtype=dtype), dim=1)
    return torch.exp(-(1 - s @ s.T) / eps)


def relabel(P, pi):
    """Module v of P becomes module pi[v]: P'[pi[v], pi[u]] = P[v, u]."""
    inv = torch.argsort(pi)
    return P[inv][:, inv]


def degrees(adj):
    return adj.sum(1) - 1  # diagonal is 1


# ---------------------------------------------------------------------------- priors

@pytest.mark.parametrize("name", list_priors())
def test_prior_symmetric_unit_diagonal_in_range(name):
    p0 = prior(name, 50)
    assert p0.shape == (50, 50) and p0.dtype == torch.float32
    assert torch.equal(p0, p0.T)
    assert torch.all(p0.diagonal() == 1)
    assert p0.min() >= 0 and p0.max() <= 1


def test_scale_free_paper_default_is_literal_eq8_on_eq7_grid():
    for U in (40, 300):                                         # at U = 300 the top-left entries clip
        p0 = prior("scale_free", U).double()
        assert (p0 == 1).sum() > U or U < 256
        for i in range(0, U, 1 if U < 100 else 7):
            for j in range(U):
                if i != j:
                    ri, rj = i / (U - 1), j / (U - 1)
                    w = U ** 0.5 / 16 * (ri + 1) ** -0.5 * (rj + 1) ** -0.5
                    assert p0[i, j].item() == pytest.approx(min(w, 1.0), abs=1e-6)


def test_scale_free_heavy_tailed_degrees():
    U = 400
    adj = sample_adjacency("scale_free", U, seed=1, offset=1 / U, scale=0.005)
    deg = degrees(adj)
    density = deg.sum().item() / (U * (U - 1))
    assert deg.max() >= 8 * deg.median()
    er = degrees(sample_adjacency("erdos_renyi", U, seed=1, p=density))  # same density, light tail
    assert er.max() <= 3 * er.median()
    # expected degrees decrease along the canonical order
    d0 = prior("scale_free", U, offset=1 / U, scale=0.005).sum(1)
    assert torch.all(d0[1:] <= d0[:-1])


def test_erdos_renyi_density():
    U, p = 300, 0.1
    assert torch.all(prior("erdos_renyi", U, p=p).fill_diagonal_(p) == p)
    deg = degrees(sample_adjacency("erdos_renyi", U, seed=0, p=p))
    assert deg.sum().item() / (U * (U - 1)) == pytest.approx(p, abs=0.005)


def test_planted_partition_block_structure():
    U, K, p_in, p_out = 400, 4, 0.5, 0.02
    p0 = prior("planted_partition", U, num_clusters=K, p_in=p_in, p_out=p_out)
    b = block_assignment(U, K)
    assert torch.bincount(b).tolist() == [100, 100, 100, 100]
    same = b[:, None] == b[None, :]
    off = ~torch.eye(U, dtype=torch.bool)
    assert torch.all(p0[same & off] == p_in) and torch.all(p0[~same] == p_out)
    adj = sample_adjacency("planted_partition", U, seed=0, num_clusters=K, p_in=p_in, p_out=p_out)
    assert adj[same & off].mean().item() == pytest.approx(p_in, abs=0.01)
    assert adj[~same].mean().item() == pytest.approx(p_out, abs=0.003)


def test_ring_of_cliques_quotient_is_a_cycle_through_all_cliques():
    U, K = 240, 8
    g = sample_graph("ring_of_cliques", U, seed=0, num_cliques=K, p_in=0.9, p_bridge=0.05)
    b = block_assignment(U, K).tolist()
    q = nx.Graph()
    q.add_nodes_from(range(K))
    q.add_edges_from((b[u], b[v]) for u, v in g.edges if b[u] != b[v])
    assert nx.is_isomorphic(q, nx.cycle_graph(K))
    assert q.has_edge(K - 1, 0)                                 # the ring closes
    assert all(q.degree(k) == 2 for k in range(K)) and nx.is_connected(q)
    for k in range(K):                                          # dense cliques
        sub = g.subgraph([u for u in range(U) if b[u] == k])
        assert nx.density(sub) > 0.8


def test_sample_graph_matches_sample_adjacency():
    g = sample_graph("erdos_renyi", 30, seed=3, p=0.3)
    adj = sample_adjacency("erdos_renyi", 30, seed=3, p=0.3)
    a = torch.tensor(nx.to_numpy_array(g, nodelist=range(30)), dtype=torch.float32)
    assert torch.equal(a + torch.eye(30), adj) and torch.equal(adj, adj.T)


def test_bad_prior_names_and_params_list_alternatives():
    with pytest.raises(KeyError, match="scale_free") as e:
        prior("scale_fre", 10)
    assert "Valid" in str(e.value)
    with pytest.raises(TypeError, match="num_clusters"):
        prior("planted_partition", 10, n_clusters=2)
    with pytest.raises(ValueError, match="p_in"):
        prior("planted_partition", 10, p_in=1.5)
    with pytest.raises(KeyError, match="erdos_renyi"):
        GraphRegularizer("erdos")
    with pytest.raises(TypeError, match="beta"):
        GraphRegularizer("scale_free", {"alpha": 1.0})
    with pytest.raises(ValueError, match="probability"):
        GraphRegularizer("erdos_renyi", {"p": -0.1})
    with pytest.raises(ValueError, match="mse"):
        GraphRegularizer("erdos_renyi", loss="l1")


@pytest.mark.parametrize("name", list_priors())
def test_every_prior_builds_a_regularizer_with_its_defaults(name):
    reg = GraphRegularizer(name)
    p = prior(name, 40)
    assert reg(p).item() == pytest.approx(0.0, abs=1e-6)  # P = P0: a perfect match
    assert reg(torch.full((40, 40), 0.5)).item() > 0


def test_networkx_not_imported_by_modwire_graphs():
    code = "import sys, modwire, modwire.graphs; print('networkx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------- Eq. 9 and σ

def test_matching_cost_is_literal_eq9():
    U = 7
    P, P0 = link_probs(U, seed=1), prior("scale_free", U).double()
    C = matching_cost(P, P0)
    for v in range(U):
        for w in range(U):
            literal = sum((P[v, i] - P0[w, i]) ** 2 for i in range(U))
            assert abs(C[v, w].item() - literal.item()) < 1e-10
    P, P0 = link_probs(40), prior("ring_of_cliques", 40, num_cliques=4).double()
    broadcast = (P[:, None, :] - P0[None, :, :]).square().sum(-1)      # the authors' U³ form
    assert torch.allclose(matching_cost(P, P0), broadcast, atol=1e-10)


@pytest.mark.parametrize("U", [4, 6])
def test_match_none_is_optimal_assignment(U):
    for seed in range(3):
        P, P0 = link_probs(U, seed=seed, eps=0.3), prior("ring_of_cliques", U, num_cliques=2).double()
        C = matching_cost(P, P0)
        sigma = match(P, P0, align="none")
        assert sorted(sigma.tolist()) == list(range(U))
        best = min(sum(C[v, p[v]].item() for v in range(U)) for p in itertools.permutations(range(U)))
        assert sum(C[v, sigma[v]].item() for v in range(U)) == pytest.approx(best, abs=1e-12)
        # align="degree": the same on P with columns in the prior's frame, a0⁻¹ by degree rank
        rank_m = sorted(range(U), key=lambda v: (-P[v].sum().item(), v))
        rank_p = sorted(range(U), key=lambda w: (-P0[w].sum().item(), w))
        a0_inv = [rank_m[rank_p.index(i)] for i in range(U)]     # prior node i ↔ module a0⁻¹(i)
        C = matching_cost(P[:, a0_inv], P0)
        sigma = match(P, P0, align="degree")
        best = min(sum(C[v, p[v]].item() for v in range(U)) for p in itertools.permutations(range(U)))
        assert sum(C[v, sigma[v]].item() for v in range(U)) == pytest.approx(best, abs=1e-12)


def test_match_degree_is_a_permutation_and_iterations_do_not_hurt():
    P, P0 = link_probs(30, seed=2), prior("planted_partition", 30, num_clusters=3).double()
    for align in ("none", "degree"):
        s1 = match(P, P0, align=align)
        s3 = match(P, P0, align=align, iterations=3)
        assert sorted(s1.tolist()) == list(range(30)) and s1.dtype == torch.long
        assert graph_loss(P, P0, s3) <= graph_loss(P, P0, s1) + 1e-12


def test_loss_invariant_to_relabelling_with_degree_alignment_only():
    U = 40
    P = link_probs(U, seed=0)
    pi = torch.randperm(U, generator=torch.Generator().manual_seed(1))
    Pp = relabel(P, pi)
    deg = GraphRegularizer("scale_free", align="degree")
    loss_p, sigma_p = deg(Pp).item(), deg.last_permutation
    assert deg(P).item() == pytest.approx(loss_p, abs=1e-9)
    assert torch.equal(sigma_p[pi], deg.last_permutation)      # σ is equivariant: σ'(π(v)) = σ(v)
    # Eq. 9 on P as labelled (the authors' code) depends on the module numbering:
    none = GraphRegularizer("scale_free", align="none")
    assert abs(none(Pp).item() - none(P).item()) > 0.05


def test_recovers_a_relabelled_prior():
    U = 40
    P0 = prior("scale_free", U).double()
    assert len(set(P0.sum(1).tolist())) == U                    # distinct degrees
    pi = torch.randperm(U, generator=torch.Generator().manual_seed(2))
    P = relabel(P0, pi)                                         # module pi[v] plays prior node v
    reg = GraphRegularizer("scale_free", align="degree")
    assert reg(P.float()).item() < 1e-8
    assert torch.equal(reg.last_permutation, torch.argsort(pi))  # σ = pi⁻¹


# ---------------------------------------------------------------------------- Eq. 6

def literal_eq6(P, P0, sigma, loss):
    total = 0.0
    U = P.shape[0]
    for i in range(U):
        for j in range(U):
            if i == j:
                continue
            t, p = P0[sigma[i], sigma[j]], P[i, j]
            if loss == "mse":
                total = total + (p - t) ** 2
            else:
                total = total + t * torch.log(t / p) + (1 - t) * torch.log((1 - t) / (1 - p))
    return total


@pytest.mark.parametrize("loss", ["mse", "kl"])
def test_graph_loss_is_literal_eq6_with_gradient(loss):
    U = 8
    P0 = prior("scale_free", U, scale=0.3).double()             # entries strictly inside (0, 1)
    sigma = torch.randperm(U, generator=torch.Generator().manual_seed(0))
    P = link_probs(U, seed=4).requires_grad_()
    P_lit = P.detach().clone().requires_grad_()
    ours, lit = graph_loss(P, P0, sigma, loss=loss), literal_eq6(P_lit, P0, sigma, loss)
    assert ours.item() == pytest.approx(lit.item(), abs=1e-10)
    ours.backward()
    lit.backward()
    assert torch.allclose(P.grad, P_lit.grad, atol=1e-10)
    assert torch.all(P.grad.diagonal() == 0)
    mean = graph_loss(P.detach(), P0, sigma, loss=loss, reduction="mean")
    assert mean.item() == pytest.approx(lit.item() / (U * (U - 1)))


def test_graph_loss_ignores_diagonal_and_kl_is_finite_on_exact_zeros_and_ones():
    U = 10
    P0 = prior("ring_of_cliques", U, num_cliques=2, p_in=1.0, p_bridge=0.0).double()
    sigma = torch.arange(U)
    P = link_probs(U, seed=5)
    P2 = P.clone()
    P2.diagonal().copy_(torch.rand(U, dtype=P.dtype))
    for loss in ("mse", "kl"):
        assert graph_loss(P, P0, sigma, loss) == graph_loss(P2, P0, sigma, loss)
        assert torch.isfinite(graph_loss(P0.clone(), P0, sigma, loss))
    assert graph_loss(P0.clone(), P0, sigma, "kl").item() < 1e-4     # KL(P0 ‖ P0) ≈ 0


# ---------------------------------------------------------------------------- module

def test_regularizer_caches_prior_records_permutation_and_checks_shape():
    reg = GraphRegularizer("planted_partition", {"num_clusters": 4}, reduction="mean")
    assert "planted_partition" in repr(reg) and "align='none'" in repr(reg)
    P = link_probs(20, dtype=torch.float32).requires_grad_()
    loss = reg(P)
    assert loss.dim() == 0 and loss.requires_grad
    loss.backward()
    assert P.grad is not None and torch.isfinite(P.grad).all()
    assert reg.prior_matrix(20) is reg.prior_matrix(20, "cpu", torch.float32)
    assert len(reg.state_dict()) == 0
    assert reg.last_permutation.shape == (20,) and reg.last_permutation.dtype == torch.long
    assert reg.last_matching_seconds >= 0
    sigma = reg.last_permutation
    assert torch.equal(reg.permuted_prior(P), reg.prior_matrix(20)[sigma][:, sigma])
    with pytest.raises(ValueError, match=r"\(20, 19\)"):
        reg(torch.rand(20, 19))
    with pytest.raises(ValueError, match=r"\(20,\)"):
        reg(torch.rand(20))


def test_regularizer_on_model_link_probs_trains_towards_prior():
    torch.manual_seed(0)
    s = torch.nn.Parameter(torch.randn(24, 8))
    reg = GraphRegularizer("ring_of_cliques", {"num_cliques": 3, "p_bridge": 0.1})
    losses = []
    for _ in range(30):
        u = torch.nn.functional.normalize(s, dim=1)
        loss = reg(torch.exp(-(1 - u @ u.T) / 0.2))
        s.grad = None
        loss.backward()
        with torch.no_grad():
            s -= 0.2 * s.grad
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert not math.isnan(losses[-1])
