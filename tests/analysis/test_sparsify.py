"""modwire.analysis.sparsify: NAC App. F module dropping (Eq. 10) and edge elimination,
and Perceiver IO latent dropping."""
import pytest
import torch

import modwire
from modwire.analysis import (drop_modules, edge_mask, eliminate_edges, keep_modules,
                              module_importance, modules_to_keep)
from modwire.analysis.sparsify import get_edge_mask, set_edge_mask

torch.manual_seed(0)


@pytest.fixture
def nac():
    torch.manual_seed(1)
    return modwire.create_model("nac_micro").eval()


@pytest.fixture
def pio():
    torch.manual_seed(2)
    return modwire.create_model("perceiver_io_micro").eval()


@pytest.fixture
def x():
    return torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(3))


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_untouched(model, snap, cls, num):
    assert type(model) is cls
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {k: tuple(v.shape) for k, v in snap.items()}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in snap.items())
    field = "num_processor_modules" if cls is modwire.NAC else "num_latents"
    assert getattr(model.config, field) == num


def reference(model, keep):
    """A freshly built model of the smaller size, loaded with the kept per-module rows
    and all shared weights of ``model``."""
    if isinstance(model, modwire.NAC):
        cfg = model.config.replace(num_processor_modules=len(keep))
        names = ("generator.processors.signatures", "generator.processors.codes")
    else:
        cfg = model.config.replace(num_latents=len(keep))
        names = ("latents",)
    with torch.inference_mode(False):  # ordinary parameters, even when called in inference mode
        ref = type(model)(cfg).eval()
        state = {k: (v[keep] if k in names else v) for k, v in model.state_dict().items()}
        ref.load_state_dict(state, strict=True)
    return ref


@torch.inference_mode()
def test_importance_is_row_sum_of_link_probs(nac):
    q = module_importance(nac)
    p = nac.link_probs()
    assert q.shape == (nac.config.num_processor_modules,)
    torch.testing.assert_close(q, p.sum(1), rtol=0, atol=0)


@torch.inference_mode()
def test_drop_zero_modules_is_exact(nac, pio, x):
    for model in (nac, pio):
        same = drop_modules(model, 0)
        assert same is not model
        assert torch.equal(same(x), model(x))


@pytest.mark.parametrize("k", [1, 5, 11])
@torch.inference_mode()
def test_drop_modules_removes_least_important(nac, x, k):
    snap, u = snapshot(nac), nac.config.num_processor_modules
    q = module_importance(nac)
    small = drop_modules(nac, k)
    keep = modules_to_keep(nac, k)
    dropped = sorted(set(range(u)) - set(keep.tolist()))
    # the dropped ones are the least connected (Eq. 10), the kept ones stay in order
    assert len(dropped) == k and keep.tolist() == sorted(keep.tolist())
    assert q[dropped].max() <= q[keep].min()
    assert small.config.num_processor_modules == u - k
    assert torch.equal(small.generator.processors.signatures, nac.generator.processors.signatures[keep])
    assert torch.equal(small.generator.processors.codes, nac.generator.processors.codes[keep])
    assert isinstance(small.generator.processors.codes, torch.nn.Parameter)
    # really smaller: states and attention are over U_p - k modules
    inter = small.forward_record(x)
    assert inter.states.shape == (3, u - k, nac.config.d_model)
    assert inter.propagator_attention[0].shape[-2:] == (u - k, u - k)
    torch.testing.assert_close(inter.logits, small(x))  # weights path vs fused attention
    assert torch.equal(small(x), reference(nac, keep)(x))
    assert_untouched(nac, snap, modwire.NAC, u)


@torch.inference_mode()
def test_drop_fraction_order_and_errors(nac):
    assert drop_modules(nac, 0.5).config.num_processor_modules == 6
    keep = modules_to_keep(nac, 2, order=[3, 0, 7])
    assert 3 not in keep and 0 not in keep and 7 in keep and len(keep) == 10
    for bad in (12, -1, 1.0, True):
        with pytest.raises((ValueError, TypeError)):
            drop_modules(nac, bad)
    with pytest.raises(ValueError):
        modules_to_keep(nac, 2, order=[1])


@torch.inference_mode()
def test_perceiver_io_latents(pio, x):
    snap = snapshot(pio)
    small = drop_modules(pio, 4)                      # default: the last latents
    assert small.config.num_latents == 8
    assert torch.equal(small.latents, pio.latents[:8])
    assert torch.equal(small(x), reference(pio, torch.arange(8))(x))
    a, b = modules_to_keep(pio, 5, seed=0), modules_to_keep(pio, 5, seed=0)
    assert torch.equal(a, b) and len(a) == 7
    keep = torch.tensor([1, 2, 5, 9])
    chosen = keep_modules(pio, keep)
    assert torch.equal(chosen(x), reference(pio, keep)(x))
    by_order = drop_modules(pio, 8, order=[i for i in range(12) if i not in keep.tolist()])
    assert torch.equal(by_order.latents, pio.latents[keep])
    assert_untouched(pio, snap, modwire.PerceiverIO, 12)
    with pytest.raises(TypeError):
        module_importance(pio)


@torch.inference_mode()
def test_eliminate_zero_edges_is_exact(nac, x):
    masked, mask = eliminate_edges(nac, 0.0)
    assert mask.all() and get_edge_mask(masked) is not None and get_edge_mask(nac) is None
    assert torch.equal(masked(x), nac(x))


@pytest.mark.parametrize("f", [0.3, 0.9, 1.0])
@torch.inference_mode()
def test_eliminate_edges(nac, x, f):
    snap, u = snapshot(nac), nac.config.num_processor_modules
    p, y0 = nac.link_probs(), nac(x)
    ps = (p + p.T) / 2
    masked, mask = eliminate_edges(nac, f)
    assert torch.equal(get_edge_mask(masked), mask) and mask.dtype == torch.bool
    assert mask.diagonal().all() and torch.equal(mask, mask.T)        # symmetric, diagonal kept
    off = ~torch.eye(u, dtype=torch.bool)
    n_pairs = u * (u - 1) // 2
    kept_pairs = int(mask.triu(1).sum())
    assert kept_pairs == n_pairs - round(f * n_pairs)                 # (1 - f) of each triangle
    if 0 < kept_pairs < n_pairs:                                      # the largest P are kept
        assert ps[mask & off].min() >= ps[~mask].max()
    inter = masked.forward_record(x)
    for w in inter.propagator_attention:                               # [B, H, U, U]
        assert (w[..., ~mask] == 0).all()
        assert (w[..., mask] > 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert torch.equal(inter.link_probs, p.masked_fill(~mask, 0))
    if f > 0:
        assert not torch.allclose(inter.logits, nac(x))
    assert_untouched(nac, snap, modwire.NAC, u)
    assert torch.equal(nac(x), y0)


def test_edge_mask_in_train_mode_and_composition(nac, x):
    masked, mask = eliminate_edges(nac, 0.6)
    masked.train()
    torch.manual_seed(0)
    inter = masked.forward_record(x)
    for w in inter.propagator_attention:
        assert (w[..., ~mask] == 0).all()
    masked.eval()
    with torch.inference_mode():
        # dropping modules from an edge-eliminated model selects the mask too
        small = drop_modules(masked, 4)
        keep = modules_to_keep(masked, 4)
        assert torch.equal(get_edge_mask(small), mask[keep][:, keep])
        inter = small.forward_record(x)
        assert (inter.propagator_attention[0][..., ~get_edge_mask(small)] == 0).all()
        # eliminating again ANDs the masks
        again, mask2 = eliminate_edges(masked, 0.8)
        assert not (mask2 & ~mask).any() and torch.equal(edge_mask(masked, 0.0), mask)
    assert get_edge_mask(nac) is None and type(nac) is modwire.NAC


def test_edge_mask_round_trips_through_save_pretrained(nac, x, tmp_path):
    masked, mask = eliminate_edges(nac, 0.7)
    masked.save_pretrained(tmp_path)
    loaded = modwire.from_pretrained(tmp_path).eval()
    assert torch.equal(get_edge_mask(loaded), mask)
    with torch.inference_mode():
        assert torch.equal(loaded(x), masked(x))
    with pytest.raises(ValueError, match=r"shape \(12, 12\)"):
        set_edge_mask(nac, torch.ones(3, 3, dtype=torch.bool))
