"""Post-hoc analysis of trained models (NAC App. F: dropping modules, eliminating edges)."""
from .sparsify import (drop_modules, edge_mask, eliminate_edges, keep_modules,
                       module_importance, modules_to_keep)

__all__ = ["drop_modules", "edge_mask", "eliminate_edges", "keep_modules",
           "module_importance", "modules_to_keep"]
from .flops import count_flops, time_interleaved  # noqa: E402
from .plots import graph_from_link_probs, plot_curves, plot_graph, plot_link_probs  # noqa: E402  (lazy matplotlib)
from .report import analyze, load_run  # noqa: E402

__all__ += ["analyze", "count_flops", "graph_from_link_probs", "load_run", "plot_curves", "plot_graph",
            "plot_link_probs", "time_interleaved"]
