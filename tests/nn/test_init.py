"""modwire.nn.init: the fast truncated normal draws exactly the documented distribution
(checked against scipy's truncnorm with a Kolmogorov-Smirnov test on 200k draws)."""
import math

import pytest
import torch
from scipy import stats

from modwire.nn import ModulatedLinear, init_linear_, trunc_normal_

N = 200_000


def _ks_pvalue(x: torch.Tensor, mean: float, std: float, a: float, b: float) -> float:
    ref = stats.truncnorm((a - mean) / std, (b - mean) / std, loc=mean, scale=std)
    return stats.kstest(x.double().numpy(), ref.cdf).pvalue


@pytest.mark.parametrize("mean,std,a,b", [
    (0.0, 0.02, -0.04, 0.04),     # init_linear_: ±2σ, acceptance 95.4% → resample the outliers
    (0.0, 1.0, -0.5, 3.0),        # asymmetric window
    (1.0, 2.0, 2.0, 2.5),         # narrow window (acceptance ~5%) → inverse CDF
    (0.0, 1.0, 2.0, 6.0),         # a tail-only window
])
def test_trunc_normal_matches_the_truncated_normal(mean, std, a, b):
    g = torch.Generator().manual_seed(0)
    x = trunc_normal_(torch.empty(400, N // 400), mean=mean, std=std, a=a, b=b, generator=g).flatten()
    assert x.min() >= a and x.max() <= b
    ref = stats.truncnorm((a - mean) / std, (b - mean) / std, loc=mean, scale=std)
    se = ref.std() / math.sqrt(N)
    assert abs(x.double().mean().item() - ref.mean()) < 5 * se
    assert abs(x.double().std().item() / ref.std() - 1) < 0.01
    assert _ks_pvalue(x, mean, std, a, b) > 1e-3


def test_ks_test_would_see_a_clamped_normal():
    """The test has power: clamping instead of truncating (mass piled on the bounds) fails it."""
    x = torch.randn(N, generator=torch.Generator().manual_seed(0)).clamp_(-2, 2)
    assert _ks_pvalue(x, 0.0, 1.0, -2.0, 2.0) < 1e-6


def test_trunc_normal_fills_non_contiguous_views_and_is_seeded():
    base = torch.zeros(300, 200)
    view = base.t()[:, ::2]                                   # [200, 150], non-contiguous
    trunc_normal_(view, std=1.0, a=-2.0, b=2.0, generator=torch.Generator().manual_seed(3))
    assert (base[::2] != 0).float().mean() > 0.99 and (base[1::2] == 0).all()
    again = trunc_normal_(torch.empty(200, 150), std=1.0, a=-2.0, b=2.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(view.contiguous(), again)             # the same draws, whatever the layout


def test_trunc_normal_refuses_an_empty_window_and_skips_meta():
    with pytest.raises(ValueError, match="a < b"):
        trunc_normal_(torch.empty(3), std=1.0, a=1.0, b=1.0)
    meta = torch.empty(3, 4, device="meta")
    assert trunc_normal_(meta, std=1.0) is meta


def test_init_linear_and_modulated_linear_use_the_documented_init():
    w, b = torch.empty(500, 400), torch.ones(500)
    init_linear_(w, b, std=0.02)
    assert (b == 0).all() and w.abs().max() <= 0.04
    assert _ks_pvalue(w.flatten(), 0.0, 0.02, -0.04, 0.04) > 1e-3
    layer = ModulatedLinear(256, 512, code_dim=64)
    s = 1 / math.sqrt(64)
    assert _ks_pvalue(layer.code_proj.detach().flatten(), 0.0, s, -2 * s, 2 * s) > 1e-3
    assert layer.weight.abs().max() <= 0.04 and (layer.bias == 0).all()


def test_no_module_calls_torchs_trunc_normal(monkeypatch):
    """One initialiser: building every preset never reaches torch.nn.init.trunc_normal_."""
    import modwire

    def refuse(*args, **kwargs):
        raise AssertionError("torch.nn.init.trunc_normal_ called; use modwire.nn.init.trunc_normal_")

    monkeypatch.setattr(torch.nn.init, "trunc_normal_", refuse)
    for name in ("nac_micro", "nac_conditional_micro", "perceiver_io_micro"):
        modwire.create_model(name)
