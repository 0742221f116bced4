"""Which earlier layers and passes each Neural Function Module reads (NFM §1, Fig. 1: top-down
and bottom-up feedback).

Every reader of an NFM network (before block ``i`` of pass ``k``, NFM Alg. 1) records the attention
mass it puts on each memory entry ``(pass, layer)`` and on the null slot
(:class:`~modwire.nn.nfm.NFMRecord`, via ``model.forward_record(x).nfm``). :func:`read_map`
averages them over a dataset into a :class:`ReadMap`: rows are readers, columns are the ``K · N``
possible sources, ``NaN`` where a reader cannot read a source (a later block of its own or a later
pass).

Top-down vs bottom-up (NFM §1: "the later parts of the network from earlier passes correspond to
top-down feedback"): a source is **top-down** for the reader before block ``i`` of pass ``k`` when it
comes from an earlier pass and from block ``j ≥ i``, i.e. from deeper than the reader's query
``h^(i-1)``; every other source (this pass's earlier blocks, earlier passes' blocks ``j < i``) is
**bottom-up**. Shares are of the mass read from sources (the null slot excluded); ``null`` is
reported apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor

from .workspace import _batches, _record
from ..errors import UserError

__all__ = ["ReadMap", "generator_read_map", "read_map", "read_map_from_records", "is_top_down", "plot_read_map"]


def is_top_down(reader: tuple[int, int], source: tuple[int, int]) -> bool:
    """``source = (pass, layer)`` is top-down for ``reader = (pass, layer)`` (module docstring)."""
    return source[0] < reader[0] and source[1] >= reader[1]


@dataclass
class ReadMap:
    """``mass [R, S]``: mean attention mass of reader ``readers[r]`` on source ``sources[s]`` (NaN
    where it cannot read it); ``null [R]``: mean mass on the null slot; ``samples``: how many."""

    readers: list[tuple[int, int]]
    sources: list[tuple[int, int]]
    mass: Tensor
    null: Tensor
    samples: int

    def top_down_share(self) -> Tensor:
        """``[R]``: each reader's share of its source mass that is top-down (NaN: no top-down source)."""
        mask = torch.tensor([[is_top_down(r, s) for s in self.sources] for r in self.readers])
        m = self.mass.nan_to_num(0.0)
        total = m.sum(-1)
        share = (m * mask).sum(-1) / total.clamp_min(1e-12)
        return torch.where(mask.any(-1) & (total > 0), share, torch.full_like(share, float("nan")))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: readers and sources as ``[pass, layer]`` (0-based), ``mass`` rows (None where
        a reader cannot read a source), ``null``, each reader's ``top_down_share``, the summary."""
        def num(v: float) -> float | None:
            return None if v != v else v

        return {"readers": [list(r) for r in self.readers], "sources": [list(s) for s in self.sources],
                "mass": [[num(v) for v in row] for row in self.mass.tolist()], "null": self.null.tolist(),
                "top_down_share": [num(v) for v in self.top_down_share().tolist()],
                "summary": {k: num(v) for k, v in self.summary().items()}}

    def summary(self) -> dict[str, float]:
        """Over all readers that can read top-down (pass ≥ 2): mean top-down share and mean null mass;
        over all readers: mean null mass."""
        td = self.top_down_share()
        ok = ~td.isnan()
        return {"top_down_share": float(td[ok].mean()) if ok.any() else float("nan"),
                "bottom_up_share": float(1 - td[ok].mean()) if ok.any() else float("nan"),
                "null_mass": float(self.null.mean()), "samples": self.samples}


def read_map_from_records(batches: Sequence[Sequence[Any]]) -> ReadMap:
    """A :class:`ReadMap` from the NFM records of several forwards (one list of records per batch),
    each sample weighted equally."""
    if not batches or not batches[0]:
        raise UserError("expected NFM records (NFMModelRecord.nfm) from at least one forward; got none: "
                        "is NFM enabled in this model (nfm.enabled)?")
    first = batches[0]
    readers = [(r.pass_index, r.layer_index) for r in first]
    passes, layers = max(p for p, _ in readers) + 1, max(i for _, i in readers) + 1
    sources = [(p, j) for p in range(passes) for j in range(layers)]
    col = {s: c for c, s in enumerate(sources)}
    mass = torch.zeros(len(readers), len(sources), dtype=torch.float64)
    null = torch.zeros(len(readers), dtype=torch.float64)
    readable = torch.zeros(len(readers), len(sources), dtype=torch.bool)
    n = 0
    for records in batches:
        if [(r.pass_index, r.layer_index) for r in records] != readers:
            raise UserError("NFM records of different networks (reader lists differ) cannot be averaged")
        b = records[0].null.shape[0]
        for row, r in enumerate(records):
            cols = [col[s] for s in r.sources]
            mass[row, cols] += r.mass.detach().double().sum(0).cpu()
            readable[row, cols] = True
            null[row] += r.null.detach().double().sum().cpu()
        n += b
    mass = torch.where(readable, mass / n, torch.full_like(mass, float("nan")))
    return ReadMap(readers, sources, mass, null / n, n)


def read_map(model: torch.nn.Module, batches: Iterable, *, max_batches: int | None = None) -> ReadMap:
    """Run ``model.forward_record`` (eval mode, no gradients) on ``batches`` (a loader of
    ``(x, y)``, or inputs) and average what its NFM readers read."""
    was = model.training
    model.eval()
    try:
        recs = [list(_record(model, batch).nfm) for batch in _batches(batches, max_batches)]
    finally:
        model.train(was)
    return read_map_from_records(recs)


def generator_read_map(model: torch.nn.Module, *, samples: int = 256, batch: int = 64, seed: int = 0) -> ReadMap:
    """The read map of a generator running in NFM (NFM §4.1, Fig. 1; a model with the
    :class:`~modwire.models.capabilities.Adversarial` capability) over ``samples`` latents
    ``z ~ N(0, I)`` drawn from ``seed`` (eval mode, no gradients)."""
    from ..models.capabilities import Adversarial, nfm_modules

    bodies = nfm_modules(model) if isinstance(model, Adversarial) else []
    if not bodies:
        raise UserError(f"expected a GAN whose generator runs in NFM (nfm.enabled), got {type(model).__name__}")
    if samples < 1 or batch < 1:
        raise UserError(f"samples and batch must be >= 1, got {samples} and {batch}")
    g = torch.Generator().manual_seed(seed)
    was = model.training
    model.eval()
    recs = []
    try:
        with torch.no_grad():
            for start in range(0, samples, batch):
                model.generate(model.sample_latents(min(batch, samples - start), generator=g), record=True)
                recs.append(list(bodies[0].records))
    finally:
        model.train(was)
    return read_map_from_records(recs)


def plot_read_map(rm: ReadMap, path: str | Path, *, title: str | None = None) -> Path:
    """Heatmap: readers (rows, ``pass k · before block i``) × sources (columns, ``pass · block``),
    plus a null-slot column; cells a reader cannot read are blank; top-down cells are outlined."""
    from .plots import _pyplot, _save

    plt = _pyplot()
    data = torch.cat([rm.mass, rm.null[:, None]], dim=1).numpy()
    fig, ax = plt.subplots(figsize=(1.0 + 0.45 * data.shape[1], 1.0 + 0.4 * data.shape[0]))
    im = ax.imshow(data, cmap="viridis", vmin=0, vmax=max(1e-6, float(torch.nan_to_num(torch.as_tensor(data)).max())))
    ax.set_xticks(range(data.shape[1]), [f"p{p + 1}·b{j + 1}" for p, j in rm.sources] + ["null"], rotation=90)
    ax.set_yticks(range(data.shape[0]), [f"p{p + 1} → b{i + 1}" for p, i in rm.readers])
    for r, reader in enumerate(rm.readers):
        for s, source in enumerate(rm.sources):
            if is_top_down(reader, source):
                ax.add_patch(plt.Rectangle((s - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="white", lw=1.2))
    ax.set_xlabel("source: pass · block output (outlined: top-down)")
    ax.set_ylabel("reader: pass → before block")
    fig.colorbar(im, ax=ax, label="attention mass")
    s = rm.summary()
    ax.set_title(title or f"NFM reads: top-down share {s['top_down_share']:.2f}, null {s['null_mass']:.2f}")
    return _save(fig, plt, path)
