"""Scores of generated images: the Fréchet distance (Heusel et al. 2017), "classifier-FID" and,
optionally, the Inception FID / IS of NFM Table 4.

**classifier-FID** (offline, always available): the Fréchet distance between the statistics of
real and generated images in the 128-d penultimate features of a small CNN classifier
(:class:`FeatureClassifier`) trained on the GAN's own training data and labels. It is NOT the
Inception FID of the papers (other features, other data): compare classifier-FIDs only with
classifier-FIDs computed with the same classifier (same run directory / seed / data).

**Inception FID / IS** (NFM Table 4's metrics) come from ``torchmetrics`` (extra ``gan-fid``), only
when the user points ``eval.inception_weights`` at a local copy of the FID Inception weights
(``pt_inception-2015-12-05-6726825d.pth``, the file torch-fidelity reads): nothing is downloaded.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UserError
from ..files import atomic_write
from ..manifest import verify_manifest, write_manifest

CLASSIFIER_DIR, CLASSIFIER_WEIGHTS, REAL_STATS = "fid_classifier", "model.safetensors", "real_stats.safetensors"


def feature_stats(features: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``features [N, d]`` → ``(mean [d], covariance [d, d])`` in float64 (unbiased, as FID)."""
    x = features.detach().double().cpu().numpy()
    if x.ndim != 2 or len(x) < 2:
        raise UserError(f"feature_stats: expected features [N >= 2, d], got {list(features.shape)}")
    if not np.isfinite(x).all():     # e.g. a generator whose weights became NaN: say so, not LinAlgError
        raise UserError("feature_stats: the features are not finite (NaN / inf): the images they come from "
                        "(a generator's output?) are not finite")
    return x.mean(axis=0), np.cov(x, rowvar=False)


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """``‖μ₁ − μ₂‖² + Tr(Σ₁ + Σ₂ − 2 (Σ₁Σ₂)^½)`` (Heusel et al. 2017, Eq. 6). ``Tr (Σ₁Σ₂)^½`` is the
    sum of the square roots of the eigenvalues of the symmetric ``Σ₁^½ Σ₂ Σ₁^½`` (same spectrum),
    so no non-symmetric matrix square root (and no complex round-off) is needed."""
    w, v = np.linalg.eigh(sigma1)
    root1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T                          # Σ₁^½
    cross = np.linalg.eigvalsh(root1 @ sigma2 @ root1)
    trace_root = np.sqrt(np.clip(cross, 0, None)).sum()
    return float(((mu1 - mu2) ** 2).sum() + np.trace(sigma1) + np.trace(sigma2) - 2 * trace_root)


class FeatureClassifier(nn.Module):
    """The classifier-FID feature network: three conv3×3 → BN → ReLU stages (32, 64, 128 channels,
    the first two followed by 2×2 max-pooling), global average pooling → ``features [B, 128]`` →
    linear → ``logits [B, classes]``. Input: images ``[B, C, S, S]`` in [-1, 1]."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        def stage(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]
        self.body = nn.Sequential(*stage(channels, 32), nn.MaxPool2d(2), *stage(32, 64), nn.MaxPool2d(2),
                                  *stage(64, 128))
        self.head = nn.Linear(128, classes)

    def features(self, x: Tensor) -> Tensor:
        return self.body(x).mean(dim=(2, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def train_feature_classifier(batches: Callable[[int], Iterable[tuple[Tensor, Tensor]]], channels: int, classes: int,
                             *, epochs: int, device: torch.device, seed: int) -> FeatureClassifier:
    """Train :class:`FeatureClassifier` with Adam (lr 1e-3) for ``epochs`` passes; ``batches(epoch)``
    yields ``(images in [-1, 1], labels)``. Deterministic given ``seed`` and the batches."""
    with torch.random.fork_rng(devices=[]):                 # the caller's RNG state is left as it was
        torch.manual_seed(seed)
        net = FeatureClassifier(channels, classes).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for epoch in range(epochs):
        for x, y in batches(epoch):
            loss = F.cross_entropy(net(x.to(device)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return net.eval()


@torch.no_grad()
def classifier_accuracy(net: FeatureClassifier, batches: Iterable[tuple[Tensor, Tensor]], device) -> float:
    hits = total = 0
    for x, y in batches:
        hits += int((net(x.to(device)).argmax(-1).cpu() == y).sum())
        total += len(y)
    return hits / max(total, 1)


@torch.no_grad()
def features_of(net: FeatureClassifier, images: Iterable[Tensor], device) -> Tensor:
    """``[N, 128]`` features of batches of images in [-1, 1]."""
    return torch.cat([net.features(x.to(device)).float().cpu() for x in images])


class ClassifierFID:
    """classifier-FID against fixed real statistics (module docstring). ``score(images)`` with an
    iterable of generated batches ``[B, C, S, S]`` in [-1, 1]."""

    def __init__(self, net: FeatureClassifier, real_mu: np.ndarray, real_sigma: np.ndarray, device) -> None:
        self.net, self.mu, self.sigma, self.device = net.eval(), real_mu, real_sigma, device

    def score(self, images: Iterable[Tensor]) -> float:
        mu, sigma = feature_stats(features_of(self.net, images, self.device))
        return frechet_distance(self.mu, self.sigma, mu, sigma)

    def save(self, directory: Path) -> None:
        """The classifier's weights and the real statistics, each atomically, and their sha256 manifest."""
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        files = {CLASSIFIER_WEIGHTS: {k: v.contiguous() for k, v in self.net.state_dict().items()},
                 REAL_STATS: {"mu": torch.from_numpy(self.mu), "sigma": torch.from_numpy(self.sigma)}}
        for name, tensors in files.items():
            atomic_write(directory / name, lambda p, t=tensors: save_file(t, str(p)))
        write_manifest(directory, list(files))

    @classmethod
    def load(cls, directory: Path, channels: int, classes: int, device) -> "ClassifierFID":
        """Verified against its manifest; a damaged or foreign file is a :class:`UserError` naming it and
        saying how to rebuild it (delete the directory: the next evaluation trains it again)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        rebuild = f"delete {directory} and evaluate again: the classifier is retrained from the task's data"
        try:
            verify_manifest(directory)
            net = FeatureClassifier(channels, classes)
            net.load_state_dict(load_file(str(directory / CLASSIFIER_WEIGHTS)))
            stats = load_file(str(directory / REAL_STATS))
            mu, sigma = stats["mu"].numpy(), stats["sigma"].numpy()
        except (UserError, SafetensorError, OSError, RuntimeError, KeyError) as e:
            raise UserError(f"the FID classifier in {directory} cannot be used ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else e!r}); {rebuild}") from None
        return cls(net.to(device), mu, sigma, device)


def inception_metrics(weights: str, real: Iterable[Tensor], fake: Iterable[Tensor], device) -> dict[str, float]:
    """Inception FID and IS (NFM Table 4) with torchmetrics, from the local weights file ``weights``.
    Batches are images in [-1, 1] (1-channel images are repeated to RGB)."""
    path = Path(weights).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"eval.inception_weights: {path} is not a file; expected a local copy of the FID "
                                f"Inception weights (pt_inception-2015-12-05-6726825d.pth); nothing is downloaded")
    try:
        from torchmetrics.image.fid import FrechetInceptionDistance, NoTrainInceptionV3
        from torchmetrics.image.inception import InceptionScore
    except ImportError as e:
        raise ImportError(f"eval.inception_weights needs torchmetrics with its image extra "
                          f"(pip install 'modwire[gan-fid]'): {e}") from None
    fid = FrechetInceptionDistance(feature=2048, normalize=True, feature_extractor_weights_path=str(path)).to(device)
    logits = NoTrainInceptionV3(name="inception-v3-compat", features_list=["logits_unbiased"],
                                feature_extractor_weights_path=str(path))   # the same local weights
    inception = InceptionScore(feature=logits, normalize=True).to(device)

    def rgb01(x: Tensor) -> Tensor:
        x = ((x.to(device) + 1) / 2).clamp(0, 1)
        return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x

    for x in real:
        fid.update(rgb01(x), real=True)
    for x in fake:
        x = rgb01(x)
        fid.update(x, real=False)
        inception.update(x)
    is_mean, is_std = inception.compute()
    return {"inception_fid": float(fid.compute()), "inception_score": float(is_mean), "inception_score_std": float(is_std)}


__all__ = ["CLASSIFIER_DIR", "ClassifierFID", "FeatureClassifier", "classifier_accuracy", "feature_stats",
           "features_of", "frechet_distance", "inception_metrics", "train_feature_classifier"]
