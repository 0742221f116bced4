"""Built-in task generators: determinism, each generator's defining property, registry, collate."""
import itertools

import numpy as np
import pytest
import torch

import modwire.tasks as tasks
from modwire.tasks import InputSpec, build_dataset, describe_task, get_task, list_tasks, r2_score
from modwire.tasks.synthetic import fuzzy_boolean as fb
from modwire.tasks.synthetic import listops as lo
from modwire.tasks.synthetic import sort_of_clevr as soc
from modwire.tasks.synthetic import triangle as tri

GENERATORS = ["fuzzy_boolean", "fuzzy_boolean_adapt", "listops", "sort_of_clevr", "triangle"]
# Small settings so that the whole file stays fast.
SMALL = {
    "listops": {"size": 40, "min_len": 20, "max_len": 120},
    "triangle": {"size": 40},
    "sort_of_clevr": {"size": 3},
    "fuzzy_boolean": {"size": 10},
    "fuzzy_boolean_adapt": {"size": 10},
}


def small(name, split="train", **kw):
    return build_dataset(name, split, **{**SMALL[name], **kw})


def same(a, b):
    return a[0].shape == b[0].shape and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ----------------------------------------------------------------------------- registry


def test_registry_lists_generators():
    assert set(GENERATORS) <= set(list_tasks(kind="generator"))
    for name in GENERATORS:
        info = get_task(name)
        assert info.kind == "generator"
        assert {"seed", "size"} <= set(info.params)
    assert get_task("listops").collate is lo.collate
    assert get_task("fuzzy_boolean").loss == "mse" and get_task("fuzzy_boolean").metrics == ("r2", "r2_std")
    assert get_task("sort_of_clevr").inputs == InputSpec.vectors(225, 88)
    assert "relational" in get_task("sort_of_clevr").description


def test_unknown_param_and_split_error():
    with pytest.raises(KeyError, match="unknown parameter"):
        build_dataset("triangle", "train", sizee=3)
    with pytest.raises(ValueError, match="splits"):
        build_dataset("fuzzy_boolean", "test")
    with pytest.raises(ValueError):
        build_dataset("sort_of_clevr", "train", patch_size=4)
    with pytest.raises(ValueError):
        build_dataset("fuzzy_boolean", "train", function_ids=(0, 30))


@pytest.mark.parametrize("name", GENERATORS)
def test_item_shapes_match_task_info(name):
    info = get_task(name)
    ds = small(name)
    x, y = ds[0]
    spec = info.inputs
    if spec.kind == "tokens":
        assert x.dtype == torch.long and x.dim() == 1 and int(x.max()) < spec.vocab_size
        assert len(x) <= spec.length
    elif spec.kind == "vectors":
        assert x.dtype == torch.float32 and x.dim() == 2 and x.shape[-1] == spec.dim
        assert x.shape[0] <= spec.length
    else:
        assert x.shape == spec.shape and x.dtype == torch.float32
    if info.loss == "mse":
        assert y.dtype == torch.float32 and y.shape == (info.heads * info.num_classes,)  # fuzzy_boolean: [F]
    else:
        assert y.dtype == torch.long and y.dim() == 0 and 0 <= int(y) < info.num_classes
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert same(ds[-1], ds[len(ds) - 1])


# ----------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", GENERATORS)
def test_pure_function_of_seed_split_index(name):
    a, b = small(name), small(name)
    n = min(len(a), 12)
    forward = [a[i] for i in range(n)]
    backward = [b[i] for i in reversed(range(n))][::-1]  # other instance, other access order
    assert all(same(p, q) for p, q in zip(forward, backward))
    assert same(a[5], a[5])
    other_seed = small(name, seed=1)
    other_split = small(name, split="val")
    assert not all(same(forward[i], other_seed[i]) for i in range(n))
    assert not all(same(forward[i], other_split[i]) for i in range(n))
    # a sample does not depend on the split size
    bigger = build_dataset(name, "train", **{**SMALL[name], "size": {"train": 2 * len(a), "val": 1}})
    assert same(a[n - 1], bigger[n - 1])


def test_no_global_rng_use():
    np.random.seed(0)
    torch.manual_seed(0)
    state_np, state_t = np.random.get_state()[1].copy(), torch.get_rng_state().clone()
    for name in GENERATORS:
        small(name)[3]
    assert np.array_equal(np.random.get_state()[1], state_np) and torch.equal(torch.get_rng_state(), state_t)


def test_splits_disjoint_fuzzy_points():
    tr, va = small("fuzzy_boolean"), small("fuzzy_boolean", split="val")
    pts = lambda ds: {tuple(ds.point(p).round(12)) for p in range(ds.num_points)}  # noqa: E731
    assert not pts(tr) & pts(va)


# ----------------------------------------------------------------------------- ListOps


def _parse(tokens):
    """Token strings → nested lists ``[op, arg, ...]`` / ints (independent of modwire's evaluator)."""
    def node(i):
        t = tokens[i]
        if t.startswith("["):
            out, i = [t[1:]], i + 1
            while tokens[i] != "]":
                child, i = node(i)
                out.append(child)
            return out, i + 1
        return int(t), i + 1
    tree, end = node(0)
    assert end == len(tokens)
    return tree


def _value(tree):
    if isinstance(tree, int):
        return tree
    op, args = tree[0], [_value(a) for a in tree[1:]]
    return {"MIN": min, "MAX": max, "MED": lambda a: int(np.median(a)), "SM": lambda a: sum(a) % 10}[op](args)


def _depth(tree):
    return 1 if isinstance(tree, int) else 1 + max(_depth(a) for a in tree[1:])


def _nodes(tree):
    if isinstance(tree, list):
        yield tree
        for a in tree[1:]:
            yield from _nodes(a)


def test_listops_labels_lengths_tokens():
    ds = small("listops", size=60)
    seen_ops, labels = set(), []
    for i in range(len(ds)):
        x, y = ds[i]
        assert 20 < len(x) < 120
        assert int(x.min()) >= 1 and int(x.max()) < lo.VOCAB_SIZE  # no pad inside an item
        tree = _parse(lo.to_string(x).split())
        assert _value(tree) == int(y) == lo.evaluate(x)
        assert _depth(tree) <= 10
        for n in _nodes(tree):
            assert 2 <= len(n) - 1 <= 10
            seen_ops.add(n[0])
        labels.append(int(y))
    assert seen_ops == {"MIN", "MAX", "MED", "SM"}
    assert len(set(labels)) >= 5


def test_listops_default_lengths_and_depth():
    ds = build_dataset("listops", "val", size=3, max_depth=10)
    for i in range(3):
        x, y = ds[i]
        assert 500 < len(x) < 2000
        tree = _parse(lo.to_string(x).split())
        assert _value(tree) == int(y) and _depth(tree) <= 10
    shallow = build_dataset("listops", "train", size=5, min_len=5, max_len=400, max_depth=3)
    assert all(_depth(_parse(lo.to_string(shallow[i][0]).split())) <= 3 for i in range(5))


def test_listops_operators():
    tok = lambda s: [lo.TOKEN_NAMES.index(t) for t in s.split()]  # noqa: E731
    assert lo.evaluate(tok("[MED 2 5 ]")) == 3  # truncated median: int(3.5)
    assert lo.evaluate(tok("[MED 9 1 4 ]")) == 4
    assert lo.evaluate(tok("[SM 9 8 [MAX 1 7 ] ]")) == 4
    assert lo.evaluate(tok("[MIN 3 [MAX 2 9 ] 0 ]")) == 0
    assert lo.evaluate([0, 0] + tok("7") + [0]) == 7  # pads are skipped
    with pytest.raises(ValueError):
        lo.evaluate(tok("[MIN 3 4"))


def test_listops_collate():
    ds = small("listops")
    batch = [ds[i] for i in range(4)]
    ids, y = get_task("listops").collate(batch)
    lens = [len(x) for x, _ in batch]
    assert ids.shape == (4, max(lens)) and ids.dtype == torch.long
    assert y.shape == (4,) and y.dtype == torch.long
    for k, (x, t) in enumerate(batch):
        assert torch.equal(ids[k, : lens[k]], x) and bool((ids[k, lens[k]:] == lo.PAD).all())
        assert int(y[k]) == int(t) == lo.evaluate(ids[k])
    loader = torch.utils.data.DataLoader(ds, batch_size=5, collate_fn=get_task("listops").collate)
    out = next(iter(loader))
    assert isinstance(out, (tuple, list)) and len(out) == 2


# ----------------------------------------------------------------------------- Triangle


def test_triangle_geometry_labels_rendering():
    n = 200
    ds = build_dataset("triangle", "train", size=n)
    labels = []
    for i in range(n):
        t = ds.triangle(i)
        x, y = ds[i]
        assert int(y) == t.label
        labels.append(t.label)
        centres = t.points.mean(1)
        np.testing.assert_allclose(centres, t.vertices, atol=1e-9)
        assert np.all(np.abs(t.points - t.vertices[:, None]) <= 1 + 1e-9)  # within ±1 px per axis
        assert np.all((t.vertices >= 1) & (t.vertices <= 63))
        s = tri.side_lengths(centres)
        if t.label == tri.EQUILATERAL:
            np.testing.assert_allclose(s, s.mean(), rtol=1e-6)
            assert np.all(t.vertices[:2] == np.round(t.vertices[:2]))  # two integer vertices
        else:
            assert s.max() > 1.1 * s.min()
            assert np.all(t.vertices == np.round(t.vertices))
        assert s.min() >= 8
        img = x[0].numpy()
        assert img.min() >= 0 and img.max() <= 1
        # every point is the centre of a lit disc of radius 2; nothing is lit farther away
        yy, xx = np.mgrid[0:64, 0:64]
        d2 = ((xx[None] - t.points.reshape(-1, 2)[:, 0, None, None]) ** 2
              + (yy[None] - t.points.reshape(-1, 2)[:, 1, None, None]) ** 2).min(0)
        assert np.array_equal(img == 1, d2 <= 4) and bool(np.all((img == 0) | (img == 1)))
        for vx, vy in np.round(t.vertices).astype(int):
            assert img[vy, vx] == 1  # the disc around a point within 1 px covers the vertex pixel
    assert sum(labels) == n // 2  # balanced
    assert {tuple(ds[i][0].shape) for i in range(3)} == {(1, 64, 64)}


def test_triangle_near_equilateral_rule():
    eq = np.array([[0.0, 0.0], [10.0, 0.0], [5.0, 5 * np.sqrt(3)]])
    assert tri.is_near_equilateral(eq)
    assert tri.is_near_equilateral(np.array([[0.0, 0.0], [10.0, 0.0], [5.0, 9.0]]))  # sides 10, 10.3, 10.3
    assert not tri.is_near_equilateral(np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]))


# ----------------------------------------------------------------------------- Sort-of-CLEVR


def _independent_answer(objs, color, relational, subtype):
    """Answer string from the object list ``[(colour, shape_name, x, y)]``."""
    me = objs[color]
    if not relational:
        return [me[1], "yes" if me[2] < 37.5 else "no", "yes" if me[3] < 37.5 else "no"][subtype]
    if subtype == 2:
        return str(sum(o[1] == me[1] for o in objs))
    dist = {o[0]: np.hypot(o[2] - me[2], o[3] - me[3]) for o in objs if o[0] != me[0]}
    pick = min(dist, key=dist.get) if subtype == 0 else max(dist, key=dist.get)
    return next(o[1] for o in objs if o[0] == pick)


def test_sort_of_clevr_scene_answers_and_tokens():
    n_images = 6
    ds = build_dataset("sort_of_clevr", "train", size=n_images)
    assert len(ds) == 20 * n_images
    kinds = []
    for img_idx in range(n_images):
        sc = ds.scene(img_idx)
        c = sc.centers
        assert c.shape == (6, 2) and np.all((c >= 5) & (c < 70))
        assert all(((c[a] - c[b]) ** 2).sum() >= 100 for a, b in itertools.combinations(range(6), 2))
        objs = [(k, soc.SHAPES[s], int(x), int(y)) for k, ((x, y), s) in enumerate(zip(c, sc.shapes))]
        img = soc.render(sc)
        assert img.shape == (75, 75, 3) and img.min() >= 0 and img.max() <= 1
        rgb = {"red": (1, 0, 0), "green": (0, 1, 0), "blue": (0, 0, 1), "orange": (1, 156 / 255, 0),
               "gray": (128 / 255,) * 3, "yellow": (1, 1, 0)}
        for k, name, x, y in objs:
            np.testing.assert_allclose(img[y, x], rgb[soc.COLORS[k]], atol=1e-6)  # centre pixel
            corner = img[y - 5, x - 5]  # square corner is coloured; a circle leaves it background
            if name == "rectangle":
                np.testing.assert_allclose(corner, rgb[soc.COLORS[k]], atol=1e-6)
        assert (img == 1).all(-1).mean() > 0.5  # white background
        for q in range(20):
            x, y = ds[20 * img_idx + q]
            assert x.shape == (225, 88)
            qv = x[0, 75:86]
            assert torch.equal(x[:, 75:86], qv.expand(225, 11))  # every token carries the question
            assert qv.sum() == 3 and qv[:6].sum() == 1 and qv[6:8].sum() == 1 and qv[8:].sum() == 1
            color, relational, subtype = int(qv[:6].argmax()), int(qv[7]), int(qv[8:].argmax())
            assert relational == (q >= 10)
            assert soc.ANSWERS[int(y)] == _independent_answer(objs, color, relational, subtype)
            assert soc.question_kind(x) == ("relational" if relational else "non_relational")
            kinds.append(relational)
            # patch tokens: first token is the top-left 5x5 patch, row-major within the patch
            if q == 0:
                np.testing.assert_allclose(x[0, :75].numpy(), img[:5, :5].reshape(-1))
                np.testing.assert_allclose(x[16, :75].numpy(), img[5:10, 5:10].reshape(-1))  # row 1, col 1
                np.testing.assert_allclose(x[16, 86:].numpy(), [1.5 / 15, 1.5 / 15])
    assert sum(kinds) == len(kinds) // 2


def test_sort_of_clevr_kind_helpers_and_patch_size():
    ds = small("sort_of_clevr")
    xs, ys = zip(*[ds[i] for i in range(40)])
    x, y = torch.stack(xs), torch.stack(ys)
    rel = soc.is_relational(x)
    assert rel.tolist() == [i % 20 >= 10 for i in range(40)]
    logits = torch.nn.functional.one_hot(y, 10).float()
    logits[rel] = -logits[rel]  # wrong on every relational question
    acc = soc.accuracy_by_kind(logits, y, x)
    assert acc == {"top1": 0.5, "top1_relational": 0.0, "top1_non_relational": 1.0}
    assert soc.accuracy_by_kind(logits, y, rel) == acc
    big = build_dataset("sort_of_clevr", "train", size=1, patch_size=15)
    xb, yb = big[12]
    assert xb.shape == (25, 3 * 15 * 15 + 13) and soc.question_kind(xb) == "relational"
    assert int(yb) == int(ds[12][1])  # the patch size changes only the tokens


# ----------------------------------------------------------------------------- Fuzzy Boolean


def test_fuzzy_boolean_corners_range_and_r2():
    corners = np.array(list(itertools.product([0, 1], repeat=5)), dtype=np.float64)
    idx = (corners * (1 << np.arange(5))).sum(1).astype(int)
    tables = [fb.truth_table(u) for u in range(30)]
    assert len({t.tobytes() for t in tables}) == 30
    assert 0.3 < np.mean(tables) < 0.7  # Bernoulli(0.5)
    rng = np.random.default_rng(0)
    for t in tables:
        np.testing.assert_array_equal(fb.evaluate(corners, t), t[idx].astype(float))
        v = fb.evaluate(rng.random((200, 5)), t)
        assert v.min() >= 0 and v.max() <= 1
    # the sum-of-products form against a direct product-logic expansion (NI Eq. 16-18)
    x = rng.random(5)
    t = tables[3]
    acc = 0.0
    for m in np.flatnonzero(t):
        term = np.prod([x[k] if (m >> k) & 1 else 1 - x[k] for k in range(5)])
        acc = 1 - (1 - acc) * (1 - term)  # or(acc, term)
    assert np.isclose(fb.evaluate(x, t), acc)


def test_fuzzy_boolean_pair_layout_items():
    ds = small("fuzzy_boolean", layout="pair")
    assert len(ds) == 10 * 20
    ys, preds = [], []
    for i in range(len(ds)):
        x, y = ds[i]
        u = i % 20
        assert x.shape == (6, 31)
        assert torch.equal(x[5], torch.nn.functional.one_hot(torch.tensor(u + 1), 31).float())
        assert bool((x[:5, 1:] == 0).all()) and bool(((x[:5, 0] >= 0) & (x[:5, 0] <= 1)).all())
        assert int(fb.function_id_of(x)) == u
        truth = fb.evaluate(x[:5, 0].double().numpy(), fb.truth_table(u))
        assert abs(float(y) - truth) < 1e-6 and 0 <= float(y) <= 1
        ys.append(y)
        preds.append(torch.tensor([truth], dtype=torch.float32))
    assert torch.equal(ds[0][0][:5], ds[19][0][:5])  # the 20 functions share a point
    assert r2_score(torch.stack(preds), torch.stack(ys)) == pytest.approx(1.0, abs=1e-6)
    assert r2_score(torch.stack(ys), torch.stack(ys)) == 1.0
    adapt = small("fuzzy_boolean_adapt", layout="pair")
    assert len(adapt) == 10 * 10 and int(fb.function_id_of(adapt[3][0])) == 23
    pair = {"layout": "pair"}
    assert describe_task("fuzzy_boolean", pair).inputs == describe_task("fuzzy_boolean_adapt", pair).inputs \
        == InputSpec.vectors(6, 31, ordered=True)
    assert describe_task("fuzzy_boolean", pair).heads == 1
    # other function seed → other functions, same points
    other = small("fuzzy_boolean", function_seed=1, layout="pair")
    assert torch.equal(other[0][0], ds[0][0]) and not all(
        torch.equal(other[i][1], ds[i][1]) for i in range(20))
    assert tasks.compute_metrics(("r2",), torch.stack(ys), torch.stack(ys))["r2"] == 1.0


def test_fuzzy_boolean_sample_layout_is_nis():
    """NI §4.1: one sample = the 5 scalars [5, 1] and the targets of all F functions [F]; heads = F."""
    ds = small("fuzzy_boolean")
    pair = small("fuzzy_boolean", layout="pair")
    assert len(ds) == 10 and ds.num_points == pair.num_points == 10
    for p in range(10):
        x, y = ds[p]
        assert x.shape == (5, 1) and x.dtype == y.dtype == torch.float32 and y.shape == (20,)
        assert torch.equal(x[:, 0], pair[20 * p][0][:5, 0])               # the same points in both layouts
        assert torch.equal(y, torch.cat([pair[20 * p + u][1] for u in range(20)]))  # and the same targets
        for u in (0, 7, 19):                                               # against the one-function form
            assert abs(float(y[u]) - fb.evaluate(x[:, 0].double().numpy(), fb.truth_table(u))) < 1e-6
    adapt = small("fuzzy_boolean_adapt")
    assert adapt[4][1].shape == (10,) and torch.equal(adapt[4][0], ds[4][0])
    assert abs(float(adapt[4][1][3]) - fb.evaluate(ds[4][0][:, 0].double().numpy(), fb.truth_table(23))) < 1e-6
    own = small("fuzzy_boolean", function_ids=(5, 2))                      # the order of function_ids is kept
    assert torch.equal(own[1][1], ds[1][1][[5, 2]])
    for name, heads in (("fuzzy_boolean", 20), ("fuzzy_boolean_adapt", 10)):
        info = get_task(name)
        assert (info.inputs, info.heads, info.num_classes) == (InputSpec.vectors(5, 1, ordered=True), heads, 1)
    assert describe_task("fuzzy_boolean", {"function_ids": (1, 2, 3)}).heads == 3
    assert get_task("fuzzy_boolean").params["size"] == {"train": 131072, "val": 32768}   # 163840 per function, 80/20


def test_fuzzy_boolean_evaluate_all_matches_one_at_a_time():
    x = np.random.default_rng(1).random((7, 5))
    tables = np.stack([fb.truth_table(u) for u in range(30)])
    want = np.stack([fb.evaluate(x, t) for t in tables], -1)
    np.testing.assert_allclose(fb.evaluate_all(x, tables), want, rtol=0, atol=1e-15)
    assert fb.evaluate_all(x, np.zeros((1, 32), bool)).max() == 0      # an empty table: f ≡ 0


def test_r2_per_function_mean_and_std():
    """r2 on [N, F] is the mean of the per-column R² (sklearn's uniform_average), not pooled."""
    g = torch.Generator().manual_seed(0)
    y = torch.rand(200, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 10.0, 0.1], dtype=torch.float64)
    pred = y + 0.05 * torch.randn(200, 3, generator=g, dtype=torch.float64)
    per = [1 - ((y[:, k] - pred[:, k]) ** 2).sum() / ((y[:, k] - y[:, k].mean()) ** 2).sum() for k in range(3)]
    per = torch.stack(per).double()
    m = tasks.compute_metrics(("r2", "r2_std"), pred, y)
    assert m["r2"] == pytest.approx(per.mean().item(), abs=1e-9) and m["r2_std"] == pytest.approx(
        per.std(unbiased=False).item(), abs=1e-9)
    assert m["r2"] < 0.9 < r2_score(pred.reshape(-1), y.reshape(-1))  # pooling would hide the poor third column
    one = tasks.compute_metrics(("r2", "r2_std"), pred[:, :1], y[:, :1])
    assert one["r2"] == pytest.approx(per[0].item(), abs=1e-9) and one["r2_std"] == 0.0
    assert r2_score(pred[:, 1], y[:, 1]) == pytest.approx(per[1].item(), abs=1e-9)


def test_listops_nesting_depth():
    ids = lambda s: [lo.TOKEN_NAMES.index(t) for t in s.split()]   # noqa: E731
    assert lo.nesting_depth(ids("[MAX 2 9 ]")) == 1
    assert lo.nesting_depth(ids("[MAX 2 [MIN 4 [SM 1 2 ] ] [MED 3 4 ] ]")) == 3
    assert lo.nesting_depth(torch.tensor(ids("[SM 1 [MIN 4 7 ] ]") + [lo.PAD, lo.PAD])) == 2
    # a tree of max_depth levels (leaves included) nests at most max_depth - 1 operators
    ds = build_dataset("listops", "train", size=60, min_len=5, max_len=64, max_depth=3)
    depths = {lo.nesting_depth(ds[i][0]) for i in range(len(ds))}
    assert depths == {1, 2}


def test_size_mapping_with_an_unknown_split_name_is_refused():
    """`size={train:8}` (no space after the colon) is YAML for the key "train:8": refused, not ignored."""
    with pytest.raises(ValueError, match=r"unknown split name\(s\) \['train:8'\].*a space after each colon"):
        build_dataset("listops", "train", size={"train": 8, "train:8": None}, min_len=5, max_len=64)


def test_r2_of_a_constant_target_column_is_finite():
    """SS_tot = 0 (a one-sample split, a constant function): 1 for an exact fit, else 0 (as
    scikit-learn's force_finite), never a silent inf or NaN."""
    from modwire.tasks.metrics import r2_per_column

    target = torch.tensor([[0.5, 1.0], [0.5, 2.0], [0.5, 3.0]])
    exact = r2_per_column(target.clone(), target)
    off = r2_per_column(target + torch.tensor([0.1, 0.0]), target)
    assert exact.tolist() == [1.0, 1.0] and off.tolist() == [0.0, 1.0]
