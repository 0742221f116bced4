"""Figures of the analysis (``modwire analyze``): sparsification curves (NAC Fig. 5,
10, 15) and pictures of a learned graph (NAC Fig. 8, App. A.2; ``draw_link_graph`` also
draws the per-sample graphs of NAC Fig. 6, ``modwire.analysis.conditional``); the
Associative Transformer's figures from :mod:`modwire.analysis.workspace`: attention-sparsity
violins (AiT Figure 7), slot maps (Figure 2), patch diversity over training (Figure 10) and
Hopfield energies (Figure 11).

matplotlib (Agg backend) and networkx are imported inside the functions, so that the
rest of :mod:`modwire.analysis` works without them; when missing, the error says
``pip install 'modwire[analysis]'``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..errors import UserError
from ..files import atomic_write
from ..fields import check_argument

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["draw_link_graph", "graph_from_link_probs", "plot_attention_sparsity", "plot_curves", "plot_energy",
           "plot_graph", "plot_link_probs", "plot_patch_diversity", "plot_priors", "plot_slot_maps",
           "require_plotting"]

_HINT = "pip install 'modwire[analysis]'"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError(f"plotting needs matplotlib: {_HINT} (or pass --no-plots)") from None
    matplotlib.use("Agg", force=True)   # files only; never open a window
    import matplotlib.pyplot as plt
    return plt


def _networkx():
    try:
        import networkx
    except ImportError:
        raise ImportError(f"graph pictures need networkx: {_HINT} (or pass --no-plots)") from None
    return networkx


def require_plotting(graphs: bool = True) -> None:
    """Raise the ImportError naming the extra now, before any long computation."""
    _pyplot()
    if graphs:
        _networkx()


def _as_matrix(p: Tensor | Any) -> Tensor:
    p = torch.as_tensor(p).detach().to("cpu", torch.float64)
    if p.dim() != 2 or p.shape[0] != p.shape[1]:
        raise UserError(f"expected a square link-probability matrix [U, U], got shape {tuple(p.shape)}")
    return p


def graph_from_link_probs(p: Tensor, threshold: float = 0.5) -> "nx.Graph":
    """Undirected graph on nodes ``0..U-1`` with an edge ``{i, j}`` (``i ≠ j``) wherever
    ``P_ij > threshold`` or ``P_ji > threshold`` (NAC Fig. 8 uses 0.5; the learned ``P``
    is symmetric, so the two agree)."""
    nx = _networkx()
    p = _as_matrix(p)
    u = p.shape[0]
    above = (p > threshold) | (p.T > threshold)
    above.fill_diagonal_(False)
    i, j = torch.triu_indices(u, u, offset=1)
    keep = above[i, j]
    g = nx.Graph()
    g.add_nodes_from(range(u))
    g.add_edges_from(zip(i[keep].tolist(), j[keep].tolist()))
    return g


LAYOUTS = ("edges", "link_probs")


def draw_link_graph(ax, p: Tensor, *, threshold: float = 0.5, seed: int = 0, layout: str = "edges",
                    node_color: Sequence[float] | None = None, cmap: str = "viridis",
                    vmin: float | None = None, vmax: float | None = None):
    """Draw the graph of ``P`` ``[U, U]`` on the matplotlib axes ``ax`` (NAC Fig. 6, Fig. 8):
    an edge where ``P_ij > threshold`` (``i ≠ j``), force-directed positions from
    ``networkx.spring_layout`` (seeded). Returns ``(graph, node collection)``.

    ``layout="edges"``: springs of unit strength on the drawn edges only (Fig. 8 as in
    ``plot_graph``). ``layout="link_probs"``: springs between every pair of modules with
    strength ``P_ij``, so attraction decreases with the signature distance (NAC §4.4:
    "the attractive force ... inversely proportional to the distance of their
    signatures"; ``P = exp(-d/ε)`` is our monotone stand-in). ``node_color``: ``U``
    values mapped through ``cmap`` on ``[vmin, vmax]`` (default: the degree).
    """
    nx = _networkx()
    check_argument("layout", layout, LAYOUTS)
    g = graph_from_link_probs(p, threshold)
    u = g.number_of_nodes()
    springs = g
    if layout == "link_probs":
        springs = nx.from_numpy_array(_as_matrix(p).clone().fill_diagonal_(0.0).numpy())  # weight = P_ij
    pos = nx.spring_layout(springs, seed=seed, k=None if u < 2 else 2.0 / u ** 0.5, weight="weight")
    colors = [d for _, d in g.degree()] if node_color is None else list(node_color)
    nx.draw_networkx_edges(g, pos, ax=ax, alpha=0.35, width=0.6)
    nodes = nx.draw_networkx_nodes(g, pos, ax=ax, node_color=colors, cmap=cmap, vmin=vmin, vmax=vmax,
                                   node_size=max(12.0, 3000.0 / max(u, 1)), linewidths=0.3, edgecolors="k")
    ax.set_axis_off()
    return g, nodes


def plot_graph(p: Tensor, path: str | Path, threshold: float = 0.5, seed: int = 0,
               title: str | None = None) -> Path:
    """NAC Fig. 8: the learned graph — an edge where ``P_ij > threshold`` (``i ≠ j``),
    a force-directed layout (``networkx.spring_layout``, seeded), node colour = degree."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    g, nodes = draw_link_graph(ax, p, threshold=threshold, seed=seed)
    u = g.number_of_nodes()
    degree = [d for _, d in g.degree()]
    if u and max(degree) > min(degree):
        fig.colorbar(nodes, ax=ax, shrink=0.8, label="degree")
    mean_deg = 2 * g.number_of_edges() / max(u, 1)
    ax.set_title(title or f"learned graph: edges where $P_{{ij}} > {threshold:g}$\n"
                          f"{u} modules, {g.number_of_edges()} edges, mean degree {mean_deg:.1f}")
    return _save(fig, plt, path)


def plot_link_probs(p: Tensor, path: str | Path, prior: Tensor | None = None,
                    order: Sequence[int] | Tensor | None = None, title: str | None = None) -> Path:
    """Heatmap of ``P`` with modules in ``order`` (``P[order][:, order]``; default: as
    they are), next to the prior ``P0`` when given. ``order = argsort(σ)`` with the
    matching ``σ[v]`` = prior node of module ``v`` shows ``P`` in the prior's frame:
    row ``k`` is the module matched to prior node ``k``."""
    plt = _pyplot()
    p = _as_matrix(p)
    u = p.shape[0]
    if order is not None:
        order = torch.as_tensor(order, dtype=torch.long).flatten().cpu()
        if sorted(order.tolist()) != list(range(u)):
            raise UserError(f"order must be a permutation of 0..{u - 1}")
        p = p[order][:, order]
    panels = [(p, "learned $P$" + (" (modules reordered)" if order is not None else ""))]
    if prior is not None:
        p0 = _as_matrix(prior)
        if p0.shape != p.shape:
            raise UserError(f"prior has shape {tuple(p0.shape)}, P has {tuple(p.shape)}")
        panels.append((p0, "prior $P^{(0)}$ (matched frame)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6), squeeze=False)
    for ax, (m, label) in zip(axes[0], panels):
        im = ax.imshow(m.numpy(), vmin=0.0, vmax=1.0, cmap="magma", interpolation="nearest")
        ax.set_title(label)
        ax.set_xlabel("module")
        ax.set_ylabel("module")
    fig.colorbar(im, ax=list(axes[0]), shrink=0.85, label="link probability")
    if title:
        fig.suptitle(title)
    return _save(fig, plt, path)


def plot_priors(path: str | Path, num_modules: int = 320, sample_modules: int = 64, seed: int = 0,
                priors: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    """NAC Fig. 7 and Fig. 3 side by side, one column per prior: the graphon on the Eq. 7
    grid (``P0`` for ``num_modules``), and one graph of ``sample_modules`` nodes sampled
    from it (force-directed layout, node colour = degree). ``priors``: name → parameters
    (default: every prior with its defaults)."""
    from ..graphs import list_priors, prior, sample_graph

    nx = _networkx()
    plt = _pyplot()
    priors = {name: {} for name in list_priors()} if priors is None else priors
    fig, axes = plt.subplots(2, len(priors), figsize=(3.6 * len(priors), 7.2), squeeze=False)
    for k, (name, params) in enumerate(priors.items()):
        top, bottom = axes[0][k], axes[1][k]
        top.imshow(prior(name, num_modules, **params).numpy(), vmin=0.0, vmax=1.0, cmap="magma",
                   interpolation="nearest")
        top.set_title(f"{name}\n$P^{{(0)}}$, U = {num_modules}", fontsize="small")
        top.set_axis_off()
        g = sample_graph(name, sample_modules, seed=seed, **params)
        pos = nx.spring_layout(g, seed=seed)
        nx.draw_networkx_edges(g, pos, ax=bottom, alpha=0.3, width=0.5)
        nx.draw_networkx_nodes(g, pos, ax=bottom, node_color=[d for _, d in g.degree()], cmap="viridis",
                               node_size=25, linewidths=0.3, edgecolors="k")
        bottom.set_title(f"a sample, U = {sample_modules}", fontsize="small")
        bottom.set_axis_off()
    return _save(fig, plt, path)


def plot_curves(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], path: str | Path,
                xlabel: str, ylabel: str, title: str | None = None, xscale: str = "linear",
                percent_x: bool = False) -> Path:
    """One line with markers per entry of ``series`` (label → (xs, ys)); points are
    drawn in the given order. ``percent_x`` labels the x axis in percent of 1."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, (xs, ys) in series.items():
        xs = [100 * x for x in xs] if percent_x else list(xs)
        ax.plot(xs, list(ys), marker="o", markersize=4, label=label)
    ax.set_xscale(xscale)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(fontsize="small")
    return _save(fig, plt, path)


# ----------------------------------------------------------------------------- Associative Transformer

# AiT Figure 7's groups of heads by their median score as a share of the patches: (I) at most
# 50% "high sparsity" light blue, (II) under 80% orange, (III) the rest red.
_SPARSITY_GROUPS = ((0.5, "#9ecae1"), (0.8, "#fd8d3c"), (float("inf"), "#de2d26"))


def plot_attention_sparsity(scores: Sequence[Tensor], path: str | Path, *, title: str | None = None) -> Path:
    """AiT Figure 7: one panel per layer, one violin per head of the distribution over patches of
    its sample-averaged Eq. 9 scores (``scores``: per layer ``[H, N]``, from
    :func:`~modwire.analysis.workspace.sparsity_scores`), heads sorted by their median ``s̄``,
    which is printed on each violin; colour = Figure 7's group (median ≤ 50% of the ``N``
    patches, < 80%, more)."""
    from .workspace import head_medians

    plt = _pyplot()
    if not scores:
        raise UserError("no layers to plot")
    cols = min(len(scores), 4)
    rows = -(-len(scores) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False, sharey=True)
    for k, ax in enumerate(axes.flat):
        if k >= len(scores):
            ax.set_axis_off()
            continue
        s = torch.as_tensor(scores[k]).detach().double().cpu()
        med = head_medians(s)
        order = torch.argsort(med, stable=True).tolist()
        parts = ax.violinplot([s[h].numpy() for h in order], showextrema=False)
        n = s.shape[1]
        for x, (body, h) in enumerate(zip(parts["bodies"], order), start=1):
            color = next(c for bound, c in _SPARSITY_GROUPS if med[h] <= bound * n)
            body.set_facecolor(color)
            body.set_alpha(0.85)
            if s[h].max() == s[h].min():              # a constant head has no violin: a bar instead
                ax.hlines(med[h].item(), x - 0.3, x + 0.3, colors=color, linewidth=4)
            ax.text(x, med[h].item(), f"{med[h].item():.3g}", ha="center", va="center", fontsize="x-small")
        ax.set_ylim(0, n + 1)
        ax.set_xticks(range(1, len(order) + 1), [str(h) for h in order], fontsize="x-small")
        ax.set_title(f"layer {k + 1}", fontsize="small")
        ax.set_xlabel("head (sorted by median)", fontsize="x-small")
        if k % cols == 0:
            ax.set_ylabel("patches for 90% of attention", fontsize="x-small")
    fig.suptitle(title or "attention sparsity (AiT Eq. 9), per head over patches")
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_slot_maps(maps: Tensor, path: str | Path, *, images: Tensor | None = None,
                   title: str | None = None) -> Path:
    """AiT Figure 2b: the bottleneck attention of every memory slot over each image's patches
    (``maps [S, M, rows, cols]`` from :func:`~modwire.analysis.workspace.slot_attention_maps`):
    one row per image (its picture first when ``images [S, C, H, W]`` are given, with the maps
    drawn over it), one column per slot; one colour scale per image."""
    import numpy as np

    plt = _pyplot()
    maps = torch.as_tensor(maps).detach().float().cpu()
    if maps.dim() != 4:
        raise UserError(f"expected slot maps [S, M, rows, cols], got shape {tuple(maps.shape)}")
    s, m = maps.shape[:2]
    if images is not None and len(images) != s:
        raise UserError(f"{len(images)} images for {s} samples of slot maps")
    first = 0 if images is None else 1
    fig, axes = plt.subplots(s, m + first, figsize=(0.9 * (m + first), 0.95 * s), squeeze=False)
    for b in range(s):
        picture = None if images is None else _picture(images[b])
        top = max(maps[b].max().item(), 1e-12)
        if picture is not None:
            axes[b][0].imshow(picture, cmap="gray", interpolation="nearest")
        for j in range(m):
            ax = axes[b][j + first]
            extent = None
            if picture is not None:
                h, w = picture.shape[:2]
                ax.imshow(picture, cmap="gray", interpolation="nearest")
                extent = (-0.5, w - 0.5, h - 0.5, -0.5)
            values = maps[b, j].numpy()
            if picture is not None:                   # patches no slot selected show the image
                values = np.ma.masked_where(values <= 0, values)
            ax.imshow(values, cmap="magma", vmin=0.0, vmax=top, interpolation="nearest",
                      alpha=0.7 if picture is not None else 1.0, extent=extent)
            if b == 0:
                ax.set_title(f"slot {j + 1}", fontsize="x-small")
        for ax in axes[b]:
            ax.set_axis_off()
    fig.suptitle(title or "bottleneck attention of each memory slot (AiT Eq. 3, after top-k)", fontsize="small")
    return _save(fig, plt, path)


def _picture(image: Tensor):
    """``[C, H, W]`` → an array matplotlib shows: grey for one channel, RGB for three, scaled to [0, 1]."""
    x = torch.as_tensor(image).detach().float().cpu()
    x = (x - x.min()) / (x.max() - x.min()).clamp_min(1e-12)
    return x[0].numpy() if x.shape[0] != 3 else x.permute(1, 2, 0).numpy()


def plot_patch_diversity(history: Sequence[tuple[int | None, Tensor]], path: str | Path, *,
                         title: str | None = None) -> Path:
    """AiT Figure 10 as a curve: the patch diversity (mean over bottleneck heads) of each
    workspace layer against the training step, from
    :func:`~modwire.analysis.workspace.diversity_over_training`."""
    if not history:
        raise UserError("no checkpoints to plot")
    steps = [0 if step is None else step for step, _ in history]
    values = torch.stack([torch.as_tensor(d).double().nanmean(dim=-1) for _, d in history])   # [T, layers]
    series = {f"layer {k + 1}": (steps, values[:, k].tolist()) for k in range(values.shape[1])}
    return plot_curves(series, path, "training step", "distinct / selected patches",
                       title=title or "patch diversity of the bottleneck attention (AiT §5.6)")


def plot_energy(energies: Sequence[tuple[Tensor, Tensor]], path: str | Path, *, title: str | None = None) -> Path:
    """AiT Figure 11: the distribution of the Hopfield energy (Eq. 7) of the tokens before and
    after retrieval, per workspace layer (``energies`` from
    :func:`~modwire.analysis.workspace.collect_energies`), with the fraction of tokens whose
    energy decreased."""
    from .workspace import energy_summary

    plt = _pyplot()
    if not energies:
        raise UserError("no layers to plot")
    summary = energy_summary(energies)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(energies), 4.2))
    for k, (before, after) in enumerate(energies):
        for offset, values, color in ((-0.2, before, "#9ecae1"), (0.2, after, "#de2d26")):
            v = torch.as_tensor(values).detach().double().flatten().cpu().numpy()
            parts = ax.violinplot([v], positions=[k + 1 + offset], widths=0.35, showextrema=False,
                                  showmedians=True)
            parts["cmedians"].set_color("k")
            for body in parts["bodies"]:
                body.set_facecolor(color)
                body.set_alpha(0.8)
    ax.set_xticks(range(1, len(energies) + 1),
                  [f"layer {k + 1}\n{100 * s['fraction_decreased']:.0f}% lower" for k, s in enumerate(summary)],
                  fontsize="small")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("#9ecae1", "#de2d26")]
    ax.legend(handles, ["before retrieval", "after retrieval"], fontsize="small")
    ax.set_ylabel("Hopfield energy (AiT Eq. 7)")
    ax.set_title(title or "token energy before and after Hopfield retrieval")
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, plt, path)


def _save(fig, plt, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:                          # a kill or a full disk never leaves half a picture
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, bbox_inches="tight", format=path.suffix[1:] or None))
    finally:
        plt.close(fig)
    return path
