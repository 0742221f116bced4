"""Post-hoc analysis of trained models: sparsification (NAC App. F: dropping modules,
eliminating edges, block-sparse inference), FLOP counting and timing, the curves and
pictures of ``modwire analyze``, and the conditional-NAC analysis of NAC §4.4 / Fig. 6
(``conditional_report``). matplotlib, networkx and scikit-learn are imported only when
a picture is drawn or an embedding computed."""
from .conditional import (conditional_report, embed_link_probs, lower_triangle, plot_link_prob_embedding,
                          plot_sample_graphs, separation_score)
from .flops import count_flops, time_interleaved
from .plots import draw_link_graph, graph_from_link_probs, plot_curves, plot_graph, plot_link_probs, plot_priors
from .report import analyze, load_run
from .sparsify import (block_sparse, drop_modules, edge_mask, eliminate_edges, keep_modules, module_importance,
                       modules_to_keep, prior_groups)

__all__ = ["analyze", "block_sparse", "conditional_report", "count_flops", "draw_link_graph", "drop_modules",
           "edge_mask", "eliminate_edges", "embed_link_probs", "graph_from_link_probs", "keep_modules",
           "load_run", "lower_triangle", "module_importance", "modules_to_keep", "plot_curves", "plot_graph",
           "plot_link_prob_embedding", "plot_link_probs", "plot_priors", "plot_sample_graphs", "prior_groups",
           "separation_score", "time_interleaved"]
