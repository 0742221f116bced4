"""Post-hoc analysis of trained models: sparsification (NAC App. F: dropping modules,
eliminating edges, block-sparse inference), FLOP counting and timing, the curves and
pictures of ``modwire analyze``. matplotlib and networkx are imported only when a
picture is drawn."""
from .flops import count_flops, time_interleaved
from .plots import graph_from_link_probs, plot_curves, plot_graph, plot_link_probs, plot_priors
from .report import analyze, load_run
from .sparsify import (block_sparse, drop_modules, edge_mask, eliminate_edges, keep_modules, module_importance,
                       modules_to_keep, prior_groups)

__all__ = ["analyze", "block_sparse", "count_flops", "drop_modules", "edge_mask", "eliminate_edges",
           "graph_from_link_probs", "keep_modules", "load_run", "module_importance", "modules_to_keep",
           "plot_curves", "plot_graph", "plot_link_probs", "plot_priors", "prior_groups", "time_interleaved"]
