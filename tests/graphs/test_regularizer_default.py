"""The graph regularizer's default is the paper's loss (NAC App. A, Eq. 6 and 9):
``Σ_{i≠j} (P_ij - P0_{σ(i)σ(j)})²`` with ``σ`` from the Hungarian method on
``C_vw = Σ_i (P_vi - P0_wi)²`` evaluated on ``P`` as labelled (the authors' code)."""
import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from modwire.graphs import GraphRegularizer, list_priors, match, prior
from modwire.models.nac import GraphPriorConfig, NACConfig


def link_probs(U, seed, d=8, eps=0.5):
    """NAC Eq. 2: exp(-(1 - cos)/ε) of random signatures, float64."""
    g = torch.Generator().manual_seed(seed)
    s = torch.nn.functional.normalize(torch.randn(U, d, generator=g, dtype=torch.float64), dim=1)
    return torch.exp(-(1 - s @ s.T) / eps)


def literal_paper_loss(P, P0):
    """Eq. 9 in loops, scipy's Hungarian solver, then Eq. 6 in loops; returns (loss, σ)."""
    U = P.shape[0]
    C = np.zeros((U, U))
    for v in range(U):
        for w in range(U):
            C[v, w] = sum((P[v, i].item() - P0[w, i].item()) ** 2 for i in range(U))
    rows, cols = linear_sum_assignment(C)
    sigma = [0] * U
    for v, w in zip(rows, cols):
        sigma[v] = int(w)
    loss = 0.0
    for i in range(U):
        for j in range(U):
            if i != j:
                loss += (P[i, j].item() - P0[sigma[i], sigma[j]].item()) ** 2
    return loss, sigma


@pytest.mark.parametrize("name", list_priors())
def test_default_loss_is_the_papers_eq6_with_eq9_on_P_as_labelled(name):
    U = 12
    reg = GraphRegularizer(name)
    assert reg.align == "none"
    for seed in range(3):
        P = link_probs(U, seed)
        P0 = prior(name, U).double()
        lit, lit_sigma = literal_paper_loss(P, P0)
        assert reg(P).item() == pytest.approx(lit, rel=1e-10, abs=1e-12)
        assert reg.last_permutation.tolist() == lit_sigma
        assert match(P, P0).tolist() == lit_sigma                 # match's default too


def test_degree_alignment_stays_an_option_and_differs():
    P, P0 = link_probs(40, seed=1), prior("scale_free", 40).double()
    deg = GraphRegularizer("scale_free", align="degree")
    assert deg.align == "degree"
    assert not torch.equal(match(P, P0), match(P, P0, align="degree"))
    with pytest.raises(ValueError, match="align"):
        GraphRegularizer("scale_free", align="rank")


def test_model_config_defaults_to_the_papers_loss():
    assert GraphPriorConfig().align == "none"
    assert NACConfig().graph_prior.align == "none"
