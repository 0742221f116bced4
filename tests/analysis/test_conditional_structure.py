"""What a conditional NAC's P depends on and what its graphs look like (NAC §4.4, Fig. 6):
separation by each label, the ANOVA of P over the question's labels, per-sample graph
statistics, and the input ablation. Synthetic P with known answers."""
import math

import networkx as nx
import numpy as np
import pytest
import torch

from modwire.analysis.circuits import ReplacedInput, predict
from modwire.analysis.conditional import (additive_fit, graph_statistics, lower_triangle, pca_link_probs, remove_group_means,
                                          separation_by, summarize_by, variance_decomposition)
from modwire.errors import UserError

U = 8


def sym(rng, scale=1.0):
    """A random symmetric ``[U, U]`` matrix, zero diagonal."""
    a = rng.normal(size=(U, U)) * scale
    a = (a + a.T) / 2
    np.fill_diagonal(a, 0.0)
    return a


def questions(per_cell=4, seed=0):
    """Balanced labels: every (colour 0-5, question type 0-5) cell ``per_cell`` times, shuffled."""
    cells = np.array([(c, t) for c in range(6) for t in range(6)] * per_cell)
    cells = cells[np.random.default_rng(seed).permutation(len(cells))]
    colour, qtype = cells[:, 0], cells[:, 1]
    return colour, qtype, qtype >= 3


def link_probs(colour, qtype, *, colour_scale=1.0, type_scale=0.0, inter_scale=0.0, noise=0.0, seed=0):
    """P = 0.5 + a[colour] + b[type] + c[colour, type] + noise, each term a symmetric random matrix."""
    rng = np.random.default_rng(seed)
    a = [sym(rng, colour_scale) for _ in range(6)]
    b = [sym(rng, type_scale) for _ in range(6)]
    c = {(i, j): sym(rng, inter_scale) for i in range(6) for j in range(6)}
    P = [0.5 + a[i] + b[j] + c[i, j] + (sym(rng, noise) if noise else 0.0) for i, j in zip(colour, qtype)]
    return np.stack(P)


def anova_literal(P, factors):
    """The ANOVA of variance_decomposition by its definition, loop by loop, fp64: within-cell
    fraction over the samples; on the equal-weight cell means, each factor's between-level
    sum of squares over the total."""
    X = [[P[s, i, j] for i in range(U) for j in range(i)] for s in range(len(P))]
    X = np.array(X, dtype=np.float64)
    keys = [tuple(f[s] for f in factors.values()) for s in range(len(X))]
    cells = sorted(set(keys))
    mean = {k: np.mean([X[s] for s in range(len(X)) if keys[s] == k], 0) for k in cells}
    grand = X.mean(0)
    total = sum(float(((x - grand) ** 2).sum()) for x in X)
    within = sum(float(((X[s] - mean[keys[s]]) ** 2).sum()) for s in range(len(X)))
    cgrand = np.mean([mean[k] for k in cells], 0)
    ctotal = sum(float(((mean[k] - cgrand) ** 2).sum()) for k in cells)
    eta = {}
    for f, name in enumerate(factors):
        levels = sorted({k[f] for k in cells})
        lmean = {v: np.mean([mean[k] for k in cells if k[f] == v], 0) for v in levels}
        eta[name] = sum(float(((lmean[k[f]] - cgrand) ** 2).sum()) for k in cells) / ctotal
    return within / total, eta


def test_p_of_colour_only_is_explained_by_colour_and_separates_colour_not_type():
    colour, qtype, rel = questions()
    P = link_probs(colour, qtype, colour_scale=0.1)
    v = variance_decomposition(P, {"colour": colour, "relational": rel, "question_type": qtype})
    assert v["factor"]["colour"] == pytest.approx(1.0, abs=1e-12)
    assert v["factor"]["question_type"] == pytest.approx(0.0, abs=1e-12)
    assert v["factor"]["relational"] == pytest.approx(0.0, abs=1e-12)
    assert v["additive"] == pytest.approx(1.0, abs=1e-12) and v["interaction"] == pytest.approx(0.0, abs=1e-12)
    assert v["within_cell"] == pytest.approx(0.0, abs=1e-12) and v["num_cells"] == 36
    sep = separation_by(pca_link_probs(P), {"colour": colour, "question_type": qtype}, permutations=10)
    assert sep["colour"]["accuracy"] == 1.0 and sep["colour"]["chance"] == pytest.approx(1 / 6)
    t = sep["question_type"]
    assert t["accuracy"] < t["shuffled_max"] + 0.05 and t["accuracy"] < 0.4   # chance 1/6: no type information


def test_anova_matches_the_literal_definition_with_noise_and_interactions():
    colour, qtype, rel = questions(per_cell=3, seed=1)
    P = link_probs(colour, qtype, colour_scale=0.1, type_scale=0.2, inter_scale=0.05, noise=0.03, seed=2)
    factors = {"colour": colour, "relational": rel, "question_type": qtype}
    v = variance_decomposition(torch.from_numpy(P), factors)
    within, eta = anova_literal(P, factors)
    assert v["within_cell"] == pytest.approx(within, rel=1e-9)
    for k in factors:
        assert v["factor"][k] == pytest.approx(eta[k], rel=1e-9)
    # a complete balanced crossing: the crossed main effects and the interaction add up to 1;
    # relational is nested in the question type
    assert v["factor"]["colour"] + v["factor"]["question_type"] + v["interaction"] == pytest.approx(1.0, abs=1e-9)
    assert 0 < v["factor"]["relational"] < v["factor"]["question_type"]
    assert 0.05 < v["interaction"] < 0.5 and 0 < within < 0.5


def test_additive_terms_leave_no_interaction_and_a_pure_interaction_has_no_main_effect():
    colour, qtype, _ = questions(per_cell=2)
    v = variance_decomposition(link_probs(colour, qtype, colour_scale=0.1, type_scale=0.1),
                               {"colour": colour, "question_type": qtype})
    assert v["interaction"] == pytest.approx(0.0, abs=1e-12)
    assert v["factor"]["colour"] + v["factor"]["question_type"] == pytest.approx(1.0, abs=1e-12)
    # c[colour, type] = x_colour · y_type with zero-mean x, y: no main effect at all
    x, y = np.array([1, -1, 2, -2, 0.5, -0.5]), np.array([1, 1, -1, -1, 2, -2])
    base = sym(np.random.default_rng(3), 0.1)
    P = np.stack([0.5 + x[c] * y[t] * base for c, t in zip(colour, qtype)])
    v = variance_decomposition(P, {"colour": colour, "question_type": qtype})
    assert v["factor"]["colour"] == pytest.approx(0.0, abs=1e-12)
    assert v["factor"]["question_type"] == pytest.approx(0.0, abs=1e-12)
    assert v["interaction"] == pytest.approx(1.0, abs=1e-12)


def test_features_and_constant_p():
    colour, qtype, _ = questions(per_cell=1)
    feats = np.stack([colour * 2.0, qtype * 0.0], 1)                      # [S, F] features, not P
    v = variance_decomposition(feats, {"colour": colour, "question_type": qtype})
    assert v["factor"]["colour"] == pytest.approx(1.0)
    v = variance_decomposition(np.full((36, U, U), 0.3), {"colour": colour})
    assert math.isnan(v["factor"]["colour"]) and math.isnan(v["within_cell"])
    with pytest.raises(UserError, match="factor 'colour' must give one label per sample"):
        variance_decomposition(np.full((36, U, U), 0.3), {"colour": colour[:5]})
    with pytest.raises(UserError, match="at least one label"):
        variance_decomposition(np.full((36, U, U), 0.3), {})


def test_removing_colour_means_leaves_the_type_structure():
    colour, qtype, _ = questions()
    P = link_probs(colour, qtype, colour_scale=0.3, type_scale=0.05, seed=4)
    R = remove_group_means(P, colour)
    assert R.shape == P.shape
    flat = lower_triangle(R)
    for c in range(6):
        np.testing.assert_allclose(flat[colour == c].mean(0), lower_triangle(P).mean(0), atol=1e-12)
    v = variance_decomposition(R, {"colour": colour, "question_type": qtype})
    assert v["factor"]["colour"] == pytest.approx(0.0, abs=1e-12)
    assert v["factor"]["question_type"] == pytest.approx(1.0, abs=1e-9)
    sep = separation_by(pca_link_probs(R), {"question_type": qtype}, permutations=0)
    assert sep["question_type"]["accuracy"] == 1.0


def test_additive_fit_is_colour_mean_plus_type_mean_minus_the_grand_mean_on_a_balanced_crossing():
    colour, qtype, _ = questions(per_cell=2, seed=5)
    P = link_probs(colour, qtype, colour_scale=0.1, type_scale=0.1, inter_scale=0.1, noise=0.02, seed=6)
    A = additive_fit(P, {"colour": colour, "question_type": qtype})
    assert A.shape == P.shape
    grand = P.mean(0)
    for s in range(0, len(P), 7):                                          # literal, sample by sample
        lit = P[colour == colour[s]].mean(0) + P[qtype == qtype[s]].mean(0) - grand
        np.testing.assert_allclose(A[s], lit, atol=1e-12)
    v = variance_decomposition(A, {"colour": colour, "question_type": qtype})
    assert v["interaction"] == pytest.approx(0.0, abs=1e-12) and v["within_cell"] == pytest.approx(0.0, abs=1e-12)


def test_separation_by_drops_rare_classes_and_a_label_left_with_one_class():
    colour, qtype, _ = questions(per_cell=2)
    P = link_probs(colour, qtype, colour_scale=0.1)
    answer = colour.copy()
    answer[:3] = 9                                                         # a class seen 3 times
    sep = separation_by(pca_link_probs(P), {"answer": answer, "one": np.where(colour == 0, 1, 0) * (qtype == 9)},
                        permutations=0)
    assert sep["answer"]["dropped"] == {"9": 3} and sep["answer"]["num_samples"] == 69
    assert sep["answer"]["num_classes"] == 6 and sep["one"] is None
    with pytest.raises(UserError, match="labels 'answer' must be one per sample"):
        separation_by(pca_link_probs(P), {"answer": answer[:4]})


def two_cliques(inside=0.9, between=0.2):
    P = np.full((U, U), between)
    P[:4, :4] = P[4:, 4:] = inside
    np.fill_diagonal(P, 1.0)
    return P


def weighted_modularity_literal(W, groups):
    """Newman's modularity of the weighted graph ``W`` (zero diagonal) for the partition ``groups``."""
    m = W.sum() / 2
    k = W.sum(1)
    return sum(W[i, j] - k[i] * k[j] / (2 * m) for g in groups for i in g for j in g) / (2 * m)


def test_graph_statistics_of_two_cliques_match_their_definitions():
    P = np.stack([two_cliques(), np.full((U, U), 0.3) + 0.7 * np.eye(U)])
    s = graph_statistics(P, seed=0)
    assert s["density"].tolist() == pytest.approx([24 / 56, 0.0])               # 2·4·3 of 8·7 pairs
    assert s["mean_p"][0] == pytest.approx((24 * 0.9 + 32 * 0.2) / 56) and s["mean_p"][1] == pytest.approx(0.3)
    row = np.array([1.0, 0.9, 0.9, 0.9, 0.2, 0.2, 0.2, 0.2])
    k = row / row.sum()
    assert s["row_entropy"][0] == pytest.approx(-(k * np.log(k)).sum() / math.log(U))
    k = np.array([1.0] + [0.3] * 7) / 3.1
    assert s["row_entropy"][1] == pytest.approx(-(k * np.log(k)).sum() / math.log(U))
    # thresholded: two disjoint 4-cliques, Q = 1/2; none above 0.5 in the second graph
    assert s["modularity_edges"][0] == pytest.approx(0.5) and s["communities_edges"][0] == 2
    assert math.isnan(s["modularity_edges"][1]) and s["communities_edges"][1] == U
    W = two_cliques()
    np.fill_diagonal(W, 0.0)
    assert s["modularity"][0] == pytest.approx(weighted_modularity_literal(W, [range(4), range(4, 8)]))
    assert s["communities"][0] == 2 and s["modularity_shuffled"][0] < s["modularity"][0]
    Wn = nx.from_numpy_array(W)
    assert s["modularity"][0] == pytest.approx(nx.community.modularity(Wn, [set(range(4)), set(range(4, 8))]))
    assert s["modularity"][1] == pytest.approx(0.0, abs=1e-12)             # all weights equal: no structure


def test_summarize_by_label_skips_nan():
    stats = {"q": np.array([1.0, 3.0, np.nan, 5.0]), "d": np.array([0.0, 1.0, 2.0, 3.0])}
    out = summarize_by(stats, np.array([0, 0, 1, 1]), ["a", "b"])
    assert out["by_label"] == {"a": {"q": 2.0, "d": 0.5}, "b": {"q": 5.0, "d": 2.5}}
    assert out["all"]["q"]["mean"] == pytest.approx(3.0)
    assert out["all"]["d"]["std"] == pytest.approx(np.std([0, 1, 2, 3]))
    with pytest.raises(UserError, match="statistic 'q' must be one value per sample"):
        summarize_by({"q": np.zeros(3)}, np.array([0, 0, 1, 1]))


class Items(torch.utils.data.Dataset):
    """Items ``({"x": [2, 3], "condition": [3]}, target)``: x filled with the item's index."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return {"x": torch.full((2, 3), float(i)), "condition": torch.tensor([i, 6, 8])}, torch.tensor(i % 2)


def test_replaced_input_swaps_or_fills_one_input_and_keeps_the_rest():
    ds = Items()
    swapped = ReplacedInput(ds, "x", source=[1, 2, 3, 4, 0])
    x, y = swapped[4]
    assert torch.equal(x["x"], torch.zeros(2, 3)) and x["condition"].tolist() == [4, 6, 8] and int(y) == 0
    filled = ReplacedInput(ds, "x", value=torch.ones(2, 3))
    assert torch.equal(filled[2][0]["x"], torch.ones(2, 3)) and len(filled) == 5
    with pytest.raises(UserError, match="exactly one of"):
        ReplacedInput(ds, "x")
    with pytest.raises(UserError, match="one index per item: 5 items, got 2"):
        ReplacedInput(ds, "x", source=[0, 1])
    with pytest.raises(UserError, match=r"must have its shape \(2, 3\), got \(3,\)"):
        ReplacedInput(ds, "x", value=torch.ones(3))[0]
    with pytest.raises(UserError, match="an input 'image'"):
        ReplacedInput(ds, "image", value=torch.ones(3))[0]


class ReadsX(torch.nn.Module):
    """Logits whose argmax is round(x[0, 0]) mod 4 (reads the image) or the condition's first id."""

    def __init__(self, read="x"):
        super().__init__()
        self.read = read

    def forward(self, x, *, condition):
        k = x[:, 0, 0].round().long() if self.read == "x" else condition[:, 0]
        return torch.nn.functional.one_hot(k % 4, 4).float()


def test_predict_calls_the_model_with_named_inputs():
    from modwire.tasks import get_task

    info = get_task("sort_of_clevr_conditional")
    pred, y = predict(ReadsX(), Items(), info, batch=2)
    assert pred.tolist() == [0, 1, 2, 3, 0] and y.tolist() == [0, 1, 0, 1, 0]
    pred, _ = predict(ReadsX(), ReplacedInput(Items(), "x", source=[2, 2, 2, 2, 2]), info)
    assert pred.tolist() == [2] * 5                                       # the image is what it reads
    pred, _ = predict(ReadsX("condition"), ReplacedInput(Items(), "x", value=torch.zeros(2, 3)), info)
    assert pred.tolist() == [0, 1, 2, 3, 0]                               # one that ignores the image


def test_graph_statistics_do_not_depend_on_the_order_of_the_modules():
    rng = np.random.default_rng(0)
    P = np.stack([np.exp(-np.abs(sym(rng, 1.0))) for _ in range(3)])       # P_ii = 1, symmetric
    perm = rng.permutation(U)
    s, t = graph_statistics(P), graph_statistics(P[:, perm][:, :, perm])
    assert set(s) == {"density", "mean_p", "row_entropy", "modularity", "communities", "modularity_shuffled",
                      "modularity_edges", "communities_edges"}
    for k in set(s) - {"modularity_shuffled"}:                            # the shuffle draws over pairs in order
        np.testing.assert_allclose(s[k], t[k], rtol=1e-9, err_msg=k)
    assert np.all((s["row_entropy"] > 0) & (s["row_entropy"] <= 1)) and s["modularity"].shape == (3,)
