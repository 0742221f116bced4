"""Figures of the analysis (``modwire analyze``): sparsification curves (NAC Fig. 5,
10, 15) and pictures of a learned graph (NAC Fig. 8, App. A.2; ``draw_link_graph`` also
draws the per-sample graphs of NAC Fig. 6, ``modwire.analysis.conditional``).

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

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["draw_link_graph", "graph_from_link_probs", "plot_curves", "plot_graph", "plot_link_probs",
           "plot_priors", "require_plotting"]

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
        raise ValueError(f"expected a square link-probability matrix [U, U], got shape {tuple(p.shape)}")
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
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
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
            raise ValueError(f"order must be a permutation of 0..{u - 1}")
        p = p[order][:, order]
    panels = [(p, "learned $P$" + (" (modules reordered)" if order is not None else ""))]
    if prior is not None:
        p0 = _as_matrix(prior)
        if p0.shape != p.shape:
            raise ValueError(f"prior has shape {tuple(p0.shape)}, P has {tuple(p.shape)}")
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


def _save(fig, plt, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
