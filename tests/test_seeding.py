import numpy as np
import pytest
import torch

from modwire.seeding import derive_seed, numpy_rng, torch_generator


def test_derive_seed_is_pure_and_separates_nearby_tuples():
    assert derive_seed(3, 1, 4) == derive_seed(3, 1, 4)
    seeds = {derive_seed(s, e, i) for s in range(3) for e in range(3) for i in range(3)}
    assert len(seeds) == 27 and all(0 <= s < 2**63 for s in seeds)
    # the same seed whatever the integer type of the parts; the generators draw from it
    assert derive_seed(np.int64(7), np.int32(2)) == derive_seed(7, 2)
    assert torch.equal(torch.rand(4, generator=torch_generator(7, 2)), torch.rand(4, generator=torch_generator(7, 2)))
    assert not torch.equal(torch.rand(4, generator=torch_generator(7, 2)),
                           torch.rand(4, generator=torch_generator(2, 7)))
    assert np.array_equal(numpy_rng(7, 2).random(3), numpy_rng(7, 2).random(3))
    assert not np.array_equal(numpy_rng(7, 2).random(3), numpy_rng(2, 7).random(3))


@pytest.mark.parametrize("bad", [(), (1.5,), ("1",), (True,)])
def test_derive_seed_rejects_non_integers(bad):
    with pytest.raises((TypeError, ValueError), match="integer"):
        derive_seed(*bad)
