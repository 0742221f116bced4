"""Post-hoc analysis of trained models: sparsification (NAC App. F: dropping modules,
eliminating edges, block-sparse inference), FLOP counting and timing, the curves and
pictures of ``modwire analyze``, and the conditional-NAC analysis of NAC §4.4 / Fig. 6
(``conditional_report``). matplotlib, networkx and scikit-learn are imported only when
a picture is drawn or an embedding computed."""
from .conditional import (additive_fit, conditional_report, embed_link_probs, graph_statistics, lower_triangle,
                          pca_link_probs, plot_link_prob_embedding, plot_sample_graphs, remove_group_means,
                          separation_by, separation_score, summarize_by, variance_decomposition)
from .flops import count_flops, time_interleaved
from .plots import draw_link_graph, graph_from_link_probs, plot_curves, plot_graph, plot_link_probs, plot_priors
from .report import analyze, load_run
from .sparsify import (block_sparse, drop_modules, edge_mask, eliminate_edges, keep_modules, module_importance,
                       modules_to_keep, prior_groups)

__all__ = ["additive_fit", "analyze", "block_sparse", "conditional_report", "count_flops", "draw_link_graph",
           "drop_modules", "edge_mask", "eliminate_edges", "embed_link_probs", "graph_from_link_probs",
           "graph_statistics", "keep_modules", "load_run", "lower_triangle", "module_importance", "modules_to_keep",
           "pca_link_probs", "plot_curves", "plot_graph", "plot_link_prob_embedding", "plot_link_probs",
           "plot_priors", "plot_sample_graphs", "prior_groups", "remove_group_means", "separation_by",
           "separation_score", "summarize_by", "time_interleaved", "variance_decomposition"]
