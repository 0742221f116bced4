"""One way to derive seeds: every random stream in modwire (sample generators, per-item
augmentation, epoch shuffles, mixup draws) is seeded by :func:`derive_seed` of the run's seed
and the integers that locate the draw, e.g. ``derive_seed(seed, epoch, index)``.

``numpy.random.SeedSequence`` mixes the parts, so nearby tuples give unrelated streams, the
result does not depend on Python's ``hash`` or on global RNG state, and a resumed run draws
exactly what an uninterrupted one would.
"""
from __future__ import annotations

import numpy as np
import torch

from .errors import UserError, UserTypeError


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that is a pure, well-mixed function of the integers ``parts``."""
    if not parts:
        raise UserError("derive_seed needs at least one integer")
    words = []
    for p in parts:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)):
            raise UserTypeError(f"derive_seed takes integers, got {p!r} ({type(p).__name__})")
        words.append(int(p) & (2**64 - 1))
    lo, hi = np.random.SeedSequence(words).generate_state(2, np.uint32)
    return (int(hi) << 31) ^ int(lo)


def torch_generator(*parts: int) -> torch.Generator:
    """A fresh CPU ``torch.Generator`` seeded with ``derive_seed(*parts)``."""
    return torch.Generator().manual_seed(derive_seed(*parts))


def numpy_rng(*parts: int) -> np.random.Generator:
    """A fresh numpy ``Generator`` seeded with ``derive_seed(*parts)``."""
    return np.random.default_rng(derive_seed(*parts))
