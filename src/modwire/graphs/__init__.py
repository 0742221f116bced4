"""Graph priors and the NAC graph structure regularizer (NAC App. A, Eq. 6-9).

>>> from modwire.graphs import GraphRegularizer, prior, list_priors
>>> reg = GraphRegularizer("scale_free")           # Eq. 8, β = 0.5
>>> loss = reg(model.link_probs())                 # Eq. 6 with σ from Eq. 9 + Hungarian
>>> P0 = prior("ring_of_cliques", 320, num_cliques=8)   # [320, 320]

networkx is optional (``pip install modwire[analysis]``); only ``sample_graph`` needs it.
"""
from .priors import (PRIORS, block_assignment, grid, list_priors, prior, sample_adjacency,
                     sample_graph)
from .regularizer import GraphRegularizer, graph_loss, match, matching_cost

__all__ = ["PRIORS", "GraphRegularizer", "block_assignment", "graph_loss", "grid", "list_priors",
           "match", "matching_cost", "prior", "sample_adjacency", "sample_graph"]
