"""modwire.analysis.conditional: the conditional-NAC analysis of NAC §4.4 / Fig. 6
(lower triangle of P → PCA-64 → t-SNE; held-out separation of question types)."""
import json
import sys

import numpy as np
import pytest
import torch

from modwire.analysis import (conditional_report, draw_link_graph, embed_link_probs, lower_triangle,
                              plot_link_prob_embedding, plot_sample_graphs, separation_score)

PNG = b"\x89PNG\r\n\x1a\n"


def designs(num_types, U=24, d=16, seed=0):
    """Per question type, signatures ``[U, d]`` around 2 or 3 cluster centres (cliques in
    P), with a different assignment of modules to cliques for each type."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for c in range(num_types):
        centres = torch.nn.functional.normalize(torch.randn(2 + c % 2, d, generator=g), dim=1)
        out.append(centres[torch.randint(0, centres.shape[0], (U,), generator=g)])
    return out


def link_probs_from(design_per_sample, noise=0.1, eps=0.3, seed=1):
    """NAC Eq. 2 for each sample: P = exp(-(1 - cos)/ε) of the design + Gaussian noise; [S, U, U]."""
    g = torch.Generator().manual_seed(seed)
    P = []
    for s0 in design_per_sample:
        s = torch.nn.functional.normalize(s0 + noise * torch.randn(s0.shape, generator=g), dim=1)
        P.append(torch.exp(-(1 - s @ s.T) / eps))
    return torch.stack(P)


def balanced_labels(num_types, per_type, seed=2):
    labels = np.repeat(np.arange(num_types), per_type)
    return np.random.default_rng(seed).permutation(labels)


def strict_json(path):
    def reject(const):
        raise AssertionError(f"non-standard JSON constant {const}")
    return json.loads(path.read_text(), parse_constant=reject)


def test_lower_triangle_is_the_strict_lower_triangle_row_by_row():
    P = torch.rand(3, 6, 6, generator=torch.Generator().manual_seed(0))     # not symmetric: order matters
    lit = [[P[s, i, j].item() for i in range(6) for j in range(i)] for s in range(3)]
    out = lower_triangle(P)
    assert out.shape == (3, 15) and out.dtype == np.float64
    np.testing.assert_allclose(out, np.array(lit), rtol=0, atol=1e-7)
    np.testing.assert_array_equal(lower_triangle(P.numpy()), out)


def test_embedding_shapes_pca_dim_and_determinism():
    labels = balanced_labels(2, 8)
    P = link_probs_from([designs(2)[y] for y in labels])                    # S = 16, U = 24: 276 features
    pca, two = embed_link_probs(P, seed=0)
    assert pca.shape == (16, 15) and two.shape == (16, 2)                   # k = min(64, S - 1, 276)
    assert np.isfinite(two).all()
    np.testing.assert_array_equal(embed_link_probs(P, seed=0)[1], two)
    assert embed_link_probs(P[:, :4, :4], pca_dim=64)[0].shape == (16, 6)    # k = U(U-1)/2 = 6
    assert embed_link_probs(P[:4], pca_dim=2)[0].shape == (4, 2)             # small S: default perplexity fits
    with pytest.raises(ValueError, match="perplexity"):
        embed_link_probs(P, perplexity=16)


def test_distinct_graph_structures_separate_far_above_chance():
    labels = balanced_labels(3, 20)
    P = link_probs_from([designs(3)[y] for y in labels])
    score = separation_score(embed_link_probs(P)[0], labels)
    assert score["num_samples"] == 60 and score["num_classes"] == 3 and score["folds"] == 5
    assert score["chance"] == pytest.approx(1 / 3)
    assert score["accuracy"] >= 0.95
    perm = score["permutation"]
    assert perm["num"] == 20 and perm["mean"] < 0.55 and perm["p_value"] == pytest.approx(1 / 21)
    assert score["accuracy"] > perm["max"]


def test_graphs_independent_of_the_labels_score_near_chance():
    labels = balanced_labels(3, 20)
    one = designs(1)[0]
    P = link_probs_from([one for _ in labels])
    score = separation_score(embed_link_probs(P)[0], labels)
    assert abs(score["accuracy"] - score["chance"]) < 0.2
    assert abs(score["permutation"]["mean"] - score["chance"]) < 0.15
    assert score["permutation"]["p_value"] > 0.05


def test_chance_is_the_majority_frequency_and_folds_shrink_to_the_smallest_class():
    labels = np.array(["a"] * 9 + ["b"] * 3)
    emb = np.random.default_rng(0).normal(size=(12, 4))
    score = separation_score(emb, labels, permutations=3)
    assert score["chance"] == pytest.approx(9 / 12) and score["folds"] == 3
    assert score["class_counts"] == {"a": 9, "b": 3} and len(score["fold_accuracies"]) == 3


def test_report_writes_pictures_and_strict_json(tmp_path):
    labels = balanced_labels(3, 6)
    P = link_probs_from([designs(3)[y] for y in labels])
    names = ["hard cardinality", "soft cardinality", "existential"]
    result = conditional_report(P, labels, names, tmp_path / "out", samples_per_type=2)
    for f in ("link_prob_embedding.png", "sample_graphs.png"):
        assert (tmp_path / "out" / f).read_bytes()[:8] == PNG
    written = strict_json(tmp_path / "out" / "conditional.json")
    assert written == result
    assert result["labels"] == {"0": names[0], "1": names[1], "2": names[2]}
    assert result["settings"]["pca_dim"] == 64 and result["settings"]["pca_dim_used"] == 17
    assert 0.99 < result["settings"]["pca_explained_variance"] <= 1 + 1e-9   # 17 of 18 samples
    shown = result["settings"]["samples_shown"]
    assert len(shown) == 6 and [labels[i] for i in shown] == [0, 0, 1, 1, 2, 2]
    sep = result["separation"]
    assert 0 <= sep["accuracy"] <= 1 and sep["chance"] == pytest.approx(1 / 3)


def test_identical_graphs_report_chance_and_null_not_nan(tmp_path):
    labels = ["spatial", "existential"] * 4
    P = link_probs_from([designs(1)[0]] * 8, noise=0.0)                  # a collapsed generator
    result = conditional_report(P, labels, {"spatial": "spatial relation"}, tmp_path)
    assert strict_json(tmp_path / "conditional.json") == result
    assert result["labels"] == {"existential": "existential", "spatial": "spatial relation"}
    assert result["settings"]["pca_explained_variance"] is None         # 0/0
    assert result["separation"]["accuracy"] <= 0.5 + 1e-9
    score = separation_score(np.zeros((6, 2)), [0, 1] * 3, permutations=0)
    assert score["permutation"] == {"num": 0, "mean": None, "std": None, "max": None, "p_value": 1.0}


def test_bad_input_gives_clear_errors(tmp_path):
    P = link_probs_from([designs(1)[0]] * 6)
    with pytest.raises(ValueError, match="square"):
        lower_triangle(torch.rand(6, 5, 4))
    with pytest.raises(ValueError, match=r"\[S, U, U\]"):
        conditional_report(torch.rand(5, 5), [0, 1, 0, 1, 0], None, tmp_path)
    with pytest.raises(ValueError, match="one per sample"):
        conditional_report(P, [0, 1, 0, 1, 0], None, tmp_path)
    with pytest.raises(ValueError, match="at least 2 classes"):
        conditional_report(P, [1] * 6, None, tmp_path)
    with pytest.raises(ValueError, match="at least 2 samples"):
        separation_score(np.zeros((6, 3)), [0, 0, 0, 0, 0, 1])
    with pytest.raises(ValueError, match="one per sample"):
        plot_link_prob_embedding(np.zeros((6, 2)), [0, 1], None, tmp_path / "e.png")
    with pytest.raises(ValueError, match="titles"):
        plot_sample_graphs(P[:2], ["only one"], tmp_path / "g.png")
    assert not (tmp_path / "conditional.json").exists()


def test_missing_scikit_learn_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)       # as if not installed: imports fail
    P = link_probs_from([designs(1)[0]] * 6)
    with pytest.raises(ImportError, match=r"modwire\[analysis\]"):
        embed_link_probs(P)
    with pytest.raises(ImportError, match=r"modwire\[analysis\]"):
        separation_score(np.zeros((6, 2)), [0, 1] * 3)


def test_sample_graph_panels_draw_edges_above_one_half_and_colour_by_module():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    P = link_probs_from([designs(2)[1]])[0].double()
    before = P.clone()
    fig, ax = plt.subplots()
    g, nodes = draw_link_graph(ax, P, layout="link_probs", node_color=range(24), cmap="turbo", vmin=0, vmax=23)
    plt.close(fig)
    assert torch.equal(P, before)                             # the layout does not touch P
    expected = {(i, j) for i in range(24) for j in range(i + 1, 24) if P[i, j] > 0.5}
    assert {tuple(sorted(e)) for e in g.edges} == expected and 0 < len(expected) < 24 * 23 // 2
    assert nodes.get_array().tolist() == list(range(24))
    with pytest.raises(ValueError, match="layout"):
        draw_link_graph(None, P, layout="circular")
