"""NI Eq. 2-3 (``modwire.nn.kernel.type_matching``) against the literal loops of
``reference.kernel.ni_compatibility_literal`` (float64, gradients to types, signatures and σ)."""
import math

import pytest
import torch
import torch.nn.functional as F

from modwire.nn.kernel import normalize_log_kernel, type_matching
from reference.kernel import ni_compatibility_literal

B, U, N, D = 2, 4, 5, 6


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    t = F.normalize(torch.randn(B, N, D, generator=g, dtype=torch.float64), dim=-1)
    s = F.normalize(torch.randn(U, D, generator=g, dtype=torch.float64), dim=-1)
    return t, s


@pytest.mark.parametrize("tau", [None, 0.9, 1.2])
@pytest.mark.parametrize("eps", [1e-6, 0.2])
def test_type_matching_matches_literal_eq3(tau, eps):
    t, s = _inputs()
    sigma = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    t1, s1 = t.clone().requires_grad_(), s.clone().requires_grad_()
    C = type_matching(t1, s1, sigma, truncation=tau, eps=eps)
    assert C.shape == (B, U, N)
    t2, s2 = t.clone().requires_grad_(), s.clone().requires_grad_()
    sigma2 = sigma.detach().clone().requires_grad_()
    ref = ni_compatibility_literal(s2.expand(B, U, D), t2, sigma2, math.inf if tau is None else tau, eps)
    torch.testing.assert_close(C, ref, rtol=0, atol=1e-12)
    g = torch.randn_like(C)
    for a, b in zip(torch.autograd.grad((C * g).sum(), (t1, s1, sigma)),
                    torch.autograd.grad((ref * g).sum(), (t2, s2, sigma2))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_truncation_keeps_close_pairs_only():
    """d ≤ τ is kept (the text of NI §2 / App. A.1.3, not Eq. 3's printed d > τ)."""
    s = torch.eye(3, dtype=torch.float64)[:2]                     # two functions
    t = torch.stack([s[0], -s[0], s[1]]).unsqueeze(0)              # variables at d = (0, 1), (2, 1), (1, 0)
    C = type_matching(t, s, 0.5, truncation=1.5, eps=0.0)
    assert C[0, 0, 0] > C[0, 1, 0] > 0                             # both near enough; the closer weighs more
    assert C[0, 0, 1] == 0 and C[0, 1, 1] == 1                     # antipodal to f_0 (d = 2 > τ): f_1 only
    # with τ = 0.5 only d = 0 pairs survive: variable 1 reaches no function → C = 0, finite at ε = 0
    C = type_matching(t, s, 0.5, truncation=0.5, eps=0.0)
    assert torch.isfinite(C).all() and C[0, :, 1].abs().max() == 0
    assert C[0, 0, 0] == 1 and C[0, 1, 2] == 1


def test_columns_sum_to_at_most_one_and_exactly_one_at_eps0():
    t, s = _inputs(1)
    C = type_matching(t, s, 1.0, truncation=None, eps=0.0)
    torch.testing.assert_close(C.sum(1), torch.ones(B, N, dtype=C.dtype), rtol=0, atol=1e-12)
    C = type_matching(t, s, 1.0, truncation=None, eps=0.5)
    assert (C.sum(1) < 1).all()


def test_single_function_no_truncation_eps0_is_all_ones():
    """The setting of the ViT reduction: U = 1, ε = 0, no truncation → C ≡ 1."""
    t, s = _inputs(2)
    C = type_matching(t, s[:1], 0.3, truncation=None, eps=0.0)
    torch.testing.assert_close(C, torch.ones_like(C), rtol=0, atol=1e-12)


def test_normalize_log_kernel_rejects_negative_delta():
    with pytest.raises(ValueError, match="delta must be >= 0"):
        normalize_log_kernel(torch.zeros(2, 2), delta=-1.0)
