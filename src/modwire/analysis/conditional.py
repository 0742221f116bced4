"""Do the graphs of a conditional NAC depend on the kind of input? NAC §4.4 and Fig. 6.

A conditional NAC generates its signatures from each input (App. G), hence one link
probability matrix ``P`` ``[U, U]`` (NAC Eq. 2) per sample. The paper flattens the
strictly lower triangle of each ``P``, reduces the ``U(U-1)/2`` values to 64 dimensions
by PCA, embeds those in 2-D by t-SNE and colours the points by question type (Fig. 6);
next to it, the graphs of a few samples (an edge where ``P_ij > 0.5``, a force-directed
NetworkX layout, module colours consistent over all panels). We add a number to the
picture: how well a nearest-centroid classifier recovers the question type from the
PCA embedding on held-out folds, against chance and against shuffled labels
(``separation_score``), since a t-SNE picture alone can show clusters that are not there.

Beyond the picture, what ``P`` depends on and what its graphs look like: ``separation_by``
(the same score for several labels, e.g. colour, type, subtype and the answer),
``variance_decomposition`` (an ANOVA of ``P`` over the labels: the fraction of its variance
each accounts for, and their interaction), ``additive_fit`` / ``remove_group_means`` (parts of
``P``, to ask which part mixes the labels up) and ``graph_statistics`` (per-sample sparsity,
row entropy of ``K̂``, greedy modularity; ``summarize_by`` averages them per label).

Everything here is a pure function of tensors (``P`` ``[S, U, U]`` and ``S`` labels);
the model is not needed. scikit-learn, matplotlib and networkx are imported inside the
functions (``pip install 'modwire[analysis]'``).
"""
from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .plots import _HINT, _pyplot, _save, draw_link_graph
from ..errors import UserError
from ..files import atomic_write_text

__all__ = ["additive_fit", "conditional_report", "embed_link_probs", "finite", "graph_statistics", "lower_triangle",
           "pca_link_probs", "plot_link_prob_embedding", "plot_sample_graphs", "remove_group_means", "separation_by",
           "separation_score", "summarize_by", "variance_decomposition"]

PCA_DIM = 64                 # NAC §4.4
EDGE_THRESHOLD = 0.5         # NAC §4.4 / Fig. 6: "more than 50% likely to be connected"


def _sklearn():
    try:
        import sklearn
    except ImportError:
        raise ImportError(f"the conditional-NAC analysis needs scikit-learn: {_HINT}") from None
    return sklearn


def _one_openmp_thread():
    """Context: OpenMP limited to one thread for scikit-learn's loops (Barnes-Hut t-SNE,
    NearestCentroid's distance reductions). On a busy machine their OpenMP threads spend
    most of each call waiting on each other at barriers, whereas these loops are small at
    the sizes of NAC Fig. 6 (hundreds of samples), so one thread costs little.
    threadpoolctl is a dependency of scikit-learn."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="openmp")


def _as_link_probs(P: Tensor | np.ndarray) -> np.ndarray:
    """``P`` as float64 numpy ``[S, U, U]``; ValueError unless it is a stack of square matrices."""
    P = torch.as_tensor(P).detach().to("cpu", torch.float64)
    if P.dim() != 3 or P.shape[1] != P.shape[2]:
        raise UserError("P must be per-sample link probabilities [S, U, U] (square matrices), "
                        f"got shape {tuple(P.shape)}")
    if P.shape[0] < 1 or P.shape[1] < 2:
        raise UserError(f"P needs at least one sample and two modules, got shape {tuple(P.shape)}")
    return P.numpy()


def _as_labels(labels: Sequence[Any] | Tensor | np.ndarray, num_samples: int) -> np.ndarray:
    """Labels as a numpy ``[S]`` array; ValueError on a count mismatch or fewer than 2 classes."""
    if isinstance(labels, Tensor):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] != num_samples:
        raise UserError(f"labels must be one per sample: expected shape ({num_samples},), "
                        f"got {labels.shape}")
    if np.unique(labels).size < 2:
        raise UserError(f"labels must contain at least 2 classes, got {np.unique(labels).tolist()}")
    return labels


def lower_triangle(P: Tensor | np.ndarray) -> np.ndarray:
    """The strictly lower triangle of each ``P`` ``[S, U, U]``, flattened row by row:
    ``[S, U(U-1)/2]`` float64, entry order ``(1,0), (2,0), (2,1), (3,0), ...`` (NAC §4.4:
    "we flatten the lower-triangular part of the link probability matrix"; the
    diagonal is 1 by Eq. 2 and ``P`` is symmetric, so nothing is lost)."""
    P = _as_link_probs(P)
    rows, cols = np.tril_indices(P.shape[1], k=-1)
    return P[:, rows, cols]


def default_perplexity(num_samples: int) -> float:
    """t-SNE perplexity: scikit-learn's 30 where there are enough samples, else
    ``(S - 1) / 3`` (the usual bound ``3·perplexity ≤ S - 1``), at least 1."""
    return float(min(30.0, max(1.0, (num_samples - 1) / 3)))


def embed_link_probs(P: Tensor | np.ndarray, *, pca_dim: int = PCA_DIM, seed: int = 0,
                     perplexity: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """NAC Fig. 6's embedding: ``lower_triangle(P)`` ``[S, U(U-1)/2]`` → PCA ``[S, k]`` with
    ``k = min(pca_dim, S - 1, U(U-1)/2)`` → t-SNE ``[S, 2]``. Returns ``(emb_pca, emb_2d)``,
    float64. ``perplexity`` defaults to ``default_perplexity(S)``; it must lie in
    ``(0, S)``. Deterministic for a given ``seed`` (PCA and t-SNE ``random_state``)."""
    S = _as_link_probs(P).shape[0]
    if S < 3:
        raise UserError(f"the embedding needs at least 3 samples, got {S}")
    perplexity = default_perplexity(S) if perplexity is None else float(perplexity)
    if not 0 < perplexity < S:
        raise UserError(f"perplexity must lie in (0, {S}) for {S} samples, got {perplexity}")
    emb_pca = pca_link_probs(P, pca_dim=pca_dim, seed=seed)
    k = emb_pca.shape[1]
    from sklearn.manifold import TSNE

    # t-SNE's "pca" init divides by the spread of the first component: NaN (and a crash in
    # scikit-learn's Barnes-Hut code) when all graphs are the same
    spread = k >= 2 and float(emb_pca[:, 0].std()) > 1e-12
    tsne = TSNE(n_components=2, perplexity=perplexity, init="pca" if spread else "random",
                learning_rate="auto", random_state=seed)
    with _one_openmp_thread():
        emb_2d = tsne.fit_transform(emb_pca)
    return emb_pca.astype(np.float64), emb_2d.astype(np.float64)


def pca_link_probs(P: Tensor | np.ndarray, *, pca_dim: int = PCA_DIM, seed: int = 0) -> np.ndarray:
    """NAC §4.4's PCA step alone: ``lower_triangle(P)`` ``[S, U(U-1)/2]`` → ``[S, k]`` float64,
    ``k = min(pca_dim, S - 1, U(U-1)/2)`` (what ``separation_score`` reads; no t-SNE)."""
    X = lower_triangle(P)
    if X.shape[0] < 2:
        raise UserError(f"the PCA needs at least 2 samples, got {X.shape[0]}")
    if isinstance(pca_dim, bool) or not isinstance(pca_dim, int) or pca_dim < 1:
        raise UserError(f"pca_dim must be an int >= 1, got {pca_dim!r}")
    _sklearn()
    from sklearn.decomposition import PCA

    k = min(pca_dim, X.shape[0] - 1, X.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):   # identical P: 0/0 explained variance
        return PCA(n_components=k, random_state=seed).fit_transform(X).astype(np.float64)


def _nearest_centroid(x: np.ndarray, y: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    """sklearn ``NearestCentroid`` fitted on ``(x, y)``, predictions for ``x_test``. Points
    that are all equal (scikit-learn refuses them) give equal centroids, whose tie
    scikit-learn breaks to the first class: predicted here without fitting."""
    from sklearn.neighbors import NearestCentroid

    if not np.any(x.std(0) > 0):
        return np.full(len(x_test), np.unique(y)[0])
    # scikit-learn's within-class std, which prediction does not use, warns (or divides by 0)
    # for features constant within classes (e.g. a one-hot code of the label)
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.filterwarnings("ignore", message=".*within_class_std_dev_.*")
        return NearestCentroid().fit(x, y).predict(x_test)


def _held_out_accuracy(emb: np.ndarray, labels: np.ndarray, folds: int,
                       seed: int) -> tuple[float, list[float]]:
    """Nearest-centroid accuracy pooled over the held-out parts of a stratified k-fold
    split, and the per-fold accuracies. Never scored on the samples it was fitted on."""
    from sklearn.model_selection import StratifiedKFold

    correct, per_fold = 0, []
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    with _one_openmp_thread():
        for train, test in split.split(emb, labels):
            hit = _nearest_centroid(emb[train], labels[train], emb[test]) == labels[test]
            correct += int(hit.sum())
            per_fold.append(float(hit.mean()))
    return correct / len(labels), per_fold


def separation_score(emb: np.ndarray | Tensor, labels: Sequence[Any] | Tensor | np.ndarray, *,
                     folds: int = 5, seed: int = 0, permutations: int = 20) -> dict[str, Any]:
    """Does ``P`` separate the question types (NAC Fig. 6, "different sentence types are
    assigned to different graph structures")? ``emb`` ``[S, k]`` (the PCA embedding of
    ``embed_link_probs``), ``labels`` ``[S]``.

    Score: accuracy of a nearest-centroid classifier (sklearn ``NearestCentroid``)
    predicting the label, pooled over the held-out folds of a stratified k-fold split
    (``folds`` lowered to the smallest class count; every class needs 2 samples).
    ``chance`` = frequency of the most common label. ``permutation``: the same score
    with the labels shuffled ``permutations`` times (mean, std, max) and the p-value
    ``(1 + #{shuffled ≥ observed}) / (1 + permutations)``. The PCA is fitted on all
    samples without labels, so the held-out labels never reach the classifier.
    """
    emb = torch.as_tensor(emb).detach().to("cpu", torch.float64).numpy()
    if emb.ndim != 2:
        raise UserError(f"emb must be [S, k], got shape {emb.shape}")
    labels = _as_labels(labels, emb.shape[0])
    classes, counts = np.unique(labels, return_counts=True)
    if counts.min() < 2:
        raise UserError(f"every class needs at least 2 samples for held-out scoring; counts "
                        f"{dict(zip(classes.tolist(), counts.tolist()))}")
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise UserError(f"folds must be an int >= 2, got {folds!r}")
    if isinstance(permutations, bool) or not isinstance(permutations, int) or permutations < 0:
        raise UserError(f"permutations must be an int >= 0, got {permutations!r}")
    _sklearn()
    k = min(folds, int(counts.min()))
    acc, per_fold = _held_out_accuracy(emb, labels, k, seed)
    rng = np.random.default_rng(seed)
    shuffled = [_held_out_accuracy(emb, rng.permutation(labels), k, seed)[0] for _ in range(permutations)]
    perm = {"num": permutations, "mean": float(np.mean(shuffled)) if shuffled else None,
            "std": float(np.std(shuffled)) if shuffled else None, "max": max(shuffled, default=None),
            "p_value": (1 + sum(s >= acc for s in shuffled)) / (1 + permutations)}
    return {"accuracy": acc, "fold_accuracies": per_fold, "chance": float(counts.max() / counts.sum()),
            "num_samples": int(emb.shape[0]), "num_classes": int(classes.size), "folds": k,
            "embedding_dim": int(emb.shape[1]), "classifier": "NearestCentroid",
            "class_counts": {str(c): int(n) for c, n in zip(classes.tolist(), counts.tolist())},
            "permutation": perm}


def separation_by(emb: np.ndarray | Tensor, labels: Mapping[str, Any], *, min_count: int = 5,
                  **kwargs: Any) -> dict[str, dict[str, Any]]:
    """``separation_score(emb, labels[name])`` for each label ``{name: labels [S]}`` (e.g. a
    question's colour, type and subtype, and its answer), in short: accuracy, chance,
    shuffled-label mean / std / max, p-value, classes, samples. Classes with fewer than
    ``min_count`` samples are left out of that label's score (``dropped``: their counts), so
    that a rare answer does not stop the k-fold split; a label left with one class gets
    ``None``. ``kwargs`` go to ``separation_score`` (``folds``, ``seed``, ``permutations``)."""
    emb = torch.as_tensor(emb).detach().to("cpu", torch.float64).numpy()
    out: dict[str, Any] = {}
    for name, y in labels.items():
        y = y.detach().cpu().numpy() if isinstance(y, Tensor) else np.asarray(y)
        if y.shape != (emb.shape[0],):
            raise UserError(f"labels {name!r} must be one per sample: expected shape ({emb.shape[0]},), got {y.shape}")
        classes, counts = np.unique(y, return_counts=True)
        keep = np.isin(y, classes[counts >= min_count])
        dropped = {str(c): int(n) for c, n in zip(classes.tolist(), counts.tolist()) if n < min_count}
        if np.unique(y[keep]).size < 2:
            out[name] = None
            continue
        r = separation_score(emb[keep], y[keep], **kwargs)
        out[name] = {"accuracy": r["accuracy"], "chance": r["chance"], "shuffled_mean": r["permutation"]["mean"],
                     "shuffled_std": r["permutation"]["std"], "shuffled_max": r["permutation"]["max"],
                     "p_value": r["permutation"]["p_value"], "num_classes": r["num_classes"],
                     "num_samples": r["num_samples"], "dropped": dropped}
    return out


def _label_names(labels: np.ndarray, names: Sequence[str] | Mapping[Any, str] | None) -> dict[Any, str]:
    """label value → legend text: ``names[label]`` (a mapping, or a sequence indexed by
    integer labels), else ``str(label)``."""
    out = {}
    for c in np.unique(labels).tolist():
        if isinstance(names, Mapping):
            out[c] = str(names.get(c, c))
        elif names is not None and isinstance(c, int) and 0 <= c < len(names):
            out[c] = str(names[c])
        else:
            out[c] = str(c)
    return out


def plot_link_prob_embedding(emb_2d: np.ndarray | Tensor, labels: Sequence[Any] | Tensor | np.ndarray,
                             names: Sequence[str] | Mapping[Any, str] | None, path: str | Path, *,
                             title: str | None = None) -> Path:
    """NAC Fig. 6 (left): the 2-D embedding ``emb_2d`` ``[S, 2]`` of ``embed_link_probs``,
    one colour per label (``labels`` ``[S]``; legend text from ``names``, see
    ``_label_names``). Writes a PNG to ``path`` and returns it."""
    plt = _pyplot()
    emb_2d = torch.as_tensor(emb_2d).detach().to("cpu", torch.float64).numpy()
    if emb_2d.ndim != 2 or emb_2d.shape[1] != 2:
        raise UserError(f"emb_2d must be [S, 2], got shape {emb_2d.shape}")
    labels = _as_labels(labels, emb_2d.shape[0])
    legend = _label_names(labels, names)
    cmap = plt.get_cmap("tab10" if len(legend) <= 10 else "tab20" if len(legend) <= 20 else "turbo")
    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    for k, (c, text) in enumerate(legend.items()):
        pts = emb_2d[labels == c]
        color = cmap(k if len(legend) <= 20 else k / max(len(legend) - 1, 1))
        ax.scatter(pts[:, 0], pts[:, 1], s=18, color=color, label=f"{text} ({len(pts)})", alpha=0.8)
    ax.set_title(title or f"t-SNE of PCA-{PCA_DIM} of lower-triangular $P$ (NAC Fig. 6)")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(fontsize="small", loc="best")
    return _save(fig, plt, path)


def plot_sample_graphs(P_samples: Tensor | np.ndarray, titles: Sequence[str], path: str | Path, *,
                       threshold: float = EDGE_THRESHOLD, seed: int = 0) -> Path:
    """NAC Fig. 6 (right): the graphs of ``k`` samples, ``P_samples`` ``[k, U, U]``, one
    panel each (title from ``titles``): an edge where ``P_ij > threshold`` (0.5), a
    force-directed layout with attraction ``∝ P_ij`` (``draw_link_graph(layout=
    "link_probs")``), node colour = module index, the same in every panel."""
    P = _as_link_probs(P_samples)
    if len(titles) != P.shape[0]:
        raise UserError(f"titles must be one per sample: {P.shape[0]} samples, {len(titles)} titles")
    plt = _pyplot()
    k, u = P.shape[0], P.shape[1]
    cols = min(k, 4)
    rows = math.ceil(k / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.8 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[k:]:
        ax.set_axis_off()
    for ax, p, text in zip(axes.flat, P, titles):
        g, _ = draw_link_graph(ax, torch.from_numpy(p), threshold=threshold, seed=seed, layout="link_probs",
                               node_color=range(u), cmap="turbo", vmin=0, vmax=u - 1)
        ax.set_title(f"{text}\n{g.number_of_edges()} edges with $P_{{ij}} > {threshold:g}$", fontsize="small")
    fig.suptitle(f"learned graphs of selected samples ({u} modules, colour = module)")
    return _save(fig, plt, path)


def _representatives(emb: np.ndarray, labels: np.ndarray, per_class: int) -> list[int]:
    """Per class (in sorted label order), the ``per_class`` samples closest to the class
    centroid of ``emb`` ``[S, k]`` (the most typical graphs), as sample indices."""
    chosen = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        dist = np.linalg.norm(emb[idx] - emb[idx].mean(0), axis=1)
        chosen += idx[np.argsort(dist, kind="stable")[:per_class]].tolist()
    return chosen


def finite(x: Any) -> Any:
    """``x`` with every non-finite float replaced by ``None`` (strict JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def conditional_report(P: Tensor | np.ndarray, labels: Sequence[Any] | Tensor | np.ndarray,
                       names: Sequence[str] | Mapping[Any, str] | None, out_dir: str | Path, *,
                       seed: int = 0, samples_per_type: int = 1) -> dict[str, Any]:
    """NAC Fig. 6 for per-sample link probabilities ``P`` ``[S, U, U]`` with question types
    ``labels`` ``[S]`` (legend text from ``names``). Writes to ``out_dir``:
    ``link_prob_embedding.png`` (t-SNE of PCA-64), ``sample_graphs.png`` (the
    ``samples_per_type`` samples nearest to each type's centroid) and ``conditional.json``
    (``separation_score`` with chance and the permutation baseline, and the settings).
    Returns the dict written to the JSON."""
    X = _as_link_probs(P)
    labels = _as_labels(labels, X.shape[0])
    if isinstance(samples_per_type, bool) or not isinstance(samples_per_type, int) or samples_per_type < 1:
        raise UserError(f"samples_per_type must be an int >= 1, got {samples_per_type!r}")
    out = Path(out_dir)
    emb_pca, emb_2d = embed_link_probs(X, seed=seed)
    separation = separation_score(emb_pca, labels, seed=seed)
    legend = _label_names(labels, names)
    title = f"t-SNE of PCA-{emb_pca.shape[1]} of lower-triangular $P$ (NAC Fig. 6)"
    plot_link_prob_embedding(emb_2d, labels, names, out / "link_prob_embedding.png", title=title)
    shown = _representatives(emb_pca, labels, samples_per_type)
    plot_sample_graphs(X[shown], [f"{legend[labels[i].item()]} (sample {i})" for i in shown],
                       out / "sample_graphs.png", seed=seed)
    with np.errstate(invalid="ignore", divide="ignore"):   # NaN (→ null) when all P are equal
        explained = float(emb_pca.var(0).sum() / lower_triangle(X).var(0).sum())
    result = {"separation": separation, "labels": {str(c): t for c, t in legend.items()},
              "settings": {"num_samples": int(X.shape[0]), "num_modules": int(X.shape[1]),
                           "features": int(X.shape[1] * (X.shape[1] - 1) // 2), "pca_dim": PCA_DIM,
                           "pca_dim_used": int(emb_pca.shape[1]), "pca_explained_variance": explained,
                           "perplexity": default_perplexity(X.shape[0]),
                           "edge_threshold": EDGE_THRESHOLD, "seed": seed, "samples_shown": shown},
              "files": ["link_prob_embedding.png", "sample_graphs.png", "conditional.json"]}
    result = finite(result)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "conditional.json", json.dumps(result, indent=2, allow_nan=False) + "\n")
    return result


# ----------------------------------------------------------------------------- what P depends on
# Fig. 6 shows that P differs between question types; these say by how much each label of the
# question accounts for P, and what the graphs look like (sparsity, modularity).


def _cells(factors: Mapping[str, Any], num_samples: int) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """The cells of ``factors`` ``{name: labels [S]}`` (checked), the distinct combinations of
    labels: each cell's level of each factor ``{name: [C]}`` (0-based), each sample's cell
    ``[S]``, and the number of cells ``C``."""
    if not factors:
        raise UserError("factors must name at least one label per sample, got none")
    codes = {}
    for name, labels in factors.items():
        labels = labels.detach().cpu().numpy() if isinstance(labels, Tensor) else np.asarray(labels)
        if labels.shape != (num_samples,):
            raise UserError(f"factor {name!r} must give one label per sample: expected shape ({num_samples},), "
                            f"got {labels.shape}")
        codes[name] = np.unique(labels, return_inverse=True)[1].reshape(-1)
    combos, cell = np.unique(np.stack(list(codes.values()), 1), axis=0, return_inverse=True)
    return {name: combos[:, k] for k, name in enumerate(codes)}, cell.reshape(-1), len(combos)


def _additive(M: np.ndarray, levels: Mapping[str, np.ndarray]) -> np.ndarray:
    """Least-squares fit of the cell means ``M`` ``[C, F]`` by a constant plus one term per level
    of each factor (``levels``: each cell's level, ``[C]``): ``[C, F]``."""
    design = np.concatenate([np.ones((len(M), 1))] + [np.eye(int(lv.max()) + 1)[lv] for lv in levels.values()], 1)
    return design @ np.linalg.lstsq(design, M, rcond=None)[0]


def _group_means(X: np.ndarray, group: np.ndarray, num: int) -> np.ndarray:
    """Mean of the rows of ``X`` ``[N, F]`` per group (``group`` ``[N]`` in ``0..num-1``): ``[num, F]``."""
    sums = np.zeros((num, X.shape[1]))
    np.add.at(sums, group, X)
    return sums / np.bincount(group, minlength=num)[:, None]


def variance_decomposition(P: Tensor | np.ndarray, factors: Mapping[str, Any]) -> dict[str, Any]:
    """How much of the variation of ``P`` ``[S, U, U]`` (its lower triangle, summed over the
    ``U(U-1)/2`` entries; or of any features ``[S, F]``, e.g. ``graph_statistics`` stacked) each
    label accounts for: an ANOVA over the cells, the distinct combinations of the ``factors``
    (``{name: labels [S]}``, e.g. a question's colour, type and subtype).

    * ``within_cell``: the fraction of the samples' total sum of squares left inside the cells
      (0 when ``P`` is a function of the factors).
    * On the cell means, each cell weighted equally (so that crossed factors are orthogonal
      when every combination occurs): ``factor[name]`` = between-level sum of squares of that
      factor alone / total (η²); ``additive`` = R² of the least-squares fit of the cell means by
      a sum of per-factor terms (one-hot, no interactions); ``interaction = 1 - additive``.
      With a complete crossing, the η² of crossed factors add up to ``additive``; a factor
      nested in another (a coarser label, e.g. relational within the 6 question types) has
      η² at most the other's, the difference being what the finer label adds.
    Fractions are ``nan`` where ``P`` does not vary."""
    X = torch.as_tensor(P).detach().to("cpu", torch.float64).numpy() if np.ndim(P) == 2 else lower_triangle(P)
    if X.shape[0] < 1:
        raise UserError(f"P needs at least one sample, got shape {tuple(X.shape)}")
    level, cell, C = _cells(factors, X.shape[0])
    M = _group_means(X, cell, C)                                        # [C, F]
    total = float(((X - X.mean(0)) ** 2).sum())
    within = float(((X - M[cell]) ** 2).sum())
    centred = M - M.mean(0)
    total_cells = float((centred ** 2).sum())
    eta = {}
    for n, lv in level.items():
        L = _group_means(centred, lv, int(lv.max()) + 1)
        eta[n] = float((L[lv] ** 2).sum())
    residual = float(((M - _additive(M, level)) ** 2).sum())

    def frac(x: float, of: float) -> float:
        return x / of if of > 1e-12 * max(1.0, X.shape[1]) else float("nan")
    additive = 1.0 - frac(residual, total_cells)
    return {"within_cell": frac(within, total), "factor": {n: frac(v, total_cells) for n, v in eta.items()},
            "additive": additive, "interaction": 1.0 - additive, "num_cells": C,
            "levels": {n: int(lv.max()) + 1 for n, lv in level.items()}, "num_samples": int(X.shape[0])}


def additive_fit(P: Tensor | np.ndarray, factors: Mapping[str, Any]) -> np.ndarray:
    """``P`` ``[S, U, U]`` with each sample replaced by the additive model of its cell: the
    least-squares fit of the equal-weight cell means by a sum of per-factor terms (what
    ``variance_decomposition`` calls ``additive``), float64, same shape. What is left of ``P``
    without the interactions of the factors and without the variation inside a cell."""
    X = _as_link_probs(P)
    level, cell, C = _cells(factors, X.shape[0])
    flat = X.reshape(X.shape[0], -1)
    return _additive(_group_means(flat, cell, C), level)[cell].reshape(X.shape)


def remove_group_means(P: Tensor | np.ndarray, labels: Sequence[Any] | Tensor | np.ndarray) -> np.ndarray:
    """``P`` ``[S, U, U]`` with the mean of its label group subtracted and the overall mean added
    back (float64, same shape): what is left of ``P`` once that label's main effect is removed
    (e.g. colour's, to ask whether the colour is what mixes question types up)."""
    X = _as_link_probs(P)
    labels = _as_labels(labels, X.shape[0])
    group = np.unique(labels, return_inverse=True)[1].reshape(-1)
    flat = X.reshape(X.shape[0], -1)
    out = flat - _group_means(flat, group, int(group.max()) + 1)[group] + flat.mean(0)
    return out.reshape(X.shape)


def _modularity(nx, weights: np.ndarray) -> tuple[float, int]:
    """Greedy (Clauset-Newman-Moore) modularity communities of the undirected graph with
    off-diagonal edge weights ``weights`` ``[U, U]`` (0 = no edge): ``(Q, number of
    communities)``; ``(nan, U)`` for a graph without edges."""
    w = np.triu(weights, 1)
    if not np.any(w > 0):
        return float("nan"), int(len(weights))
    g = nx.Graph()
    g.add_nodes_from(range(len(weights)))
    i, j = np.nonzero(w)
    g.add_weighted_edges_from(zip(i.tolist(), j.tolist(), w[i, j].tolist()))
    comms = nx.community.greedy_modularity_communities(g, weight="weight")
    return float(nx.community.modularity(g, comms, weight="weight")), len(comms)


def graph_statistics(P: Tensor | np.ndarray, *, threshold: float = EDGE_THRESHOLD,
                     seed: int = 0) -> dict[str, np.ndarray]:
    """How sparse and how modular each sample's graph is. ``P`` ``[S, U, U]`` → ``{name: [S]}``:

    * ``density``: fraction of the off-diagonal pairs with ``P_ij > threshold`` (NAC Fig. 6's
      edges); ``mean_p``: mean off-diagonal ``P_ij``;
    * ``row_entropy``: entropy of each row of ``K̂ = P / Σ_j P_ij`` (NAC Eq. 3 at evaluation,
      ``K = P``, δ → 0), divided by ``log U`` and averaged over rows (1: every module listens
      to all others equally; low: to a few);
    * ``modularity`` / ``communities``: modularity Q of networkx's greedy communities on the
      complete graph weighted by ``P_ij``, and their number; ``modularity_shuffled``: the same
      on the same weights randomly reassigned among the pairs (``seed``), a graph with the
      same weights and no structure;
    * ``modularity_edges`` / ``communities_edges``: the same on the unweighted graph of the
      edges ``P_ij > threshold`` (Q ``nan`` for a graph without edges).
    """
    X = _as_link_probs(P)
    from .plots import _networkx

    nx = _networkx()
    S, U = X.shape[:2]
    off = ~np.eye(U, dtype=bool)
    K = X / X.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(K > 0, K * np.log(K), 0.0)
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(U, 1)
    out = {"density": (X[:, off] > threshold).mean(1), "mean_p": X[:, off].mean(1),
           "row_entropy": -plogp.sum(-1).mean(-1) / math.log(U)}
    cols: dict[str, list[float]] = {k: [] for k in ("modularity", "communities", "modularity_shuffled",
                                                   "modularity_edges", "communities_edges")}
    for p in X:
        sym = np.where(off, (p + p.T) / 2, 0.0)
        q, n = _modularity(nx, sym)
        shuffled = np.zeros_like(sym)
        shuffled[iu] = rng.permutation(sym[iu])
        q_edges, n_edges = _modularity(nx, (sym > threshold).astype(np.float64))
        for k, v in zip(cols, (q, n, _modularity(nx, shuffled + shuffled.T)[0], q_edges, n_edges)):
            cols[k].append(v)
    return {**out, **{k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}}


def summarize_by(stats: Mapping[str, np.ndarray], labels: Sequence[Any] | Tensor | np.ndarray,
                 names: Sequence[str] | Mapping[Any, str] | None = None) -> dict[str, Any]:
    """Per-sample statistics ``{name: [S]}`` (e.g. ``graph_statistics``) → ``{"all": {name: {mean,
    std}}, "by_label": {label text: {name: mean}}}`` (text from ``names``, see ``_label_names``;
    NaN entries skipped; ``None`` where a group has none)."""
    labels = np.asarray(labels.detach().cpu().numpy() if isinstance(labels, Tensor) else labels)
    legend = _label_names(labels, names)

    def mean(v: np.ndarray) -> float | None:
        v = v[np.isfinite(v)]
        return float(v.mean()) if v.size else None
    out: dict[str, Any] = {"all": {}, "by_label": {}}
    for name, v in stats.items():
        v = np.asarray(v, dtype=np.float64)
        if v.shape != labels.shape:
            raise UserError(f"statistic {name!r} must be one value per sample {labels.shape}, got {v.shape}")
        fin = v[np.isfinite(v)]
        out["all"][name] = {"mean": mean(v), "std": float(fin.std()) if fin.size else None}
        for c, text in legend.items():
            out["by_label"].setdefault(text, {})[name] = mean(v[labels == c])
    return out
