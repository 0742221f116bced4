"""The GAN objectives: the hinge loss (SNGAN, Miyato et al. 2018; Lim & Ye 2017), the
non-saturating loss (Goodfellow et al. 2014), and InfoMax-GAN's contrastive term (Lee, Tran &
Cheung 2021): an InfoNCE loss between the discriminator's global and local features.

InfoMax-GAN adds ``α · L_NCE(real images)`` to the discriminator's loss and ``β · L_NCE(generated
images)`` to the generator's (α = β = 0.2 by default; ``gan.loss`` in the training config: :class:`modwire.training.gan_config.GANLossSection`).
For image ``i`` with global feature ``g_i [R]`` and local features ``l_ij [R]`` (``j`` over the
positions of the local map), the positive pair is ``(g_i, l_ij)`` and the negatives are every
local feature of every OTHER image of the batch, ``(g_i, l_kj')`` with ``k ≠ i``::

    L_NCE = − mean_{i,j} log( exp(g_i·l_ij) / (exp(g_i·l_ij) + Σ_{k≠i, j'} exp(g_i·l_kj')) )

Deviation (documented): Mimicry's implementation keeps the ``k = i`` pairs among the negatives
with their score replaced by −10 (a tiny constant term); here they are left out exactly.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UserError

GAN_LOSSES = ("hinge", "ns")


def discriminator_loss(kind: str, real: Tensor, fake: Tensor) -> Tensor:
    """Hinge: ``E[ReLU(1 − D(x))] + E[ReLU(1 + D(G(z)))]``; ``ns``: ``E[softplus(−D(x))] + E[softplus(D(G(z)))]``
    (binary cross-entropy with logits). ``real`` / ``fake``: logits ``[B, 1]``."""
    if kind == "hinge":
        return F.relu(1.0 - real).mean() + F.relu(1.0 + fake).mean()
    if kind == "ns":
        return F.softplus(-real).mean() + F.softplus(fake).mean()
    raise UserError(f"GAN loss: got {kind!r}, expected one of {list(GAN_LOSSES)}")


def generator_loss(kind: str, fake: Tensor) -> Tensor:
    """Hinge: ``−E[D(G(z))]``; ``ns``: ``E[softplus(−D(G(z)))]``."""
    if kind == "hinge":
        return -fake.mean()
    if kind == "ns":
        return F.softplus(-fake).mean()
    raise UserError(f"GAN loss: got {kind!r}, expected one of {list(GAN_LOSSES)}")


def infonce_loss(local: Tensor, glob: Tensor) -> Tensor:
    """InfoMax-GAN's InfoNCE (module docstring). ``local [B, R, L]``, ``glob [B, R]`` → a scalar.

    Cost ``O(B²·L·R)`` (one batched product); the shared negatives' log-sum-exp is taken once per
    image instead of once per positive."""
    if local.dim() != 3 or glob.dim() != 2 or local.shape[:2] != glob.shape:
        raise UserError(f"infonce_loss: expected local [B, R, L] and global [B, R], got {list(local.shape)} "
                        f"and {list(glob.shape)}")
    b = local.shape[0]
    if b < 2:
        raise UserError(f"infonce_loss: needs at least 2 images (the negatives are the other images), got {b}")
    scores = torch.einsum("ir,krl->ikl", glob.float(), local.float())          # [B(global), B(local), L]
    positive = scores.diagonal(dim1=0, dim2=1).transpose(0, 1)                 # [B, L]: g_i · l_ij
    own = torch.eye(b, dtype=torch.bool, device=scores.device)[:, :, None]     # [B, B, 1]: k = i
    negative = scores.masked_fill(own, float("-inf")).flatten(1).logsumexp(dim=1)  # [B]: log Σ_{k≠i, j'}
    return (torch.logaddexp(positive, negative[:, None]) - positive).mean()
