"""Random drop subsets in ``modwire analyze`` (``analyze(..., draws=N, draw_seed=S)``): the same
index subsets for every run with as many modules, nested across fractions, scored exactly, with
the undropped model's metrics at 0% and the mean / std over the draws in the outputs."""
import csv
import json
import statistics

import pytest
import torch

from modwire.analysis import analyze
from modwire.analysis.dropping import drop_orders
from modwire.analysis.runs import open_run
from modwire.analysis.sparsify import keep_modules
from modwire.errors import UserError
from modwire.training import load_config, train
from modwire.training import evaluate, make_loader

U, N = 12, 8   # modules of nac_micro / latents of perceiver_io_micro; validation samples scored


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A NAC with a graph prior and a Perceiver IO, 2 steps on Sort-of-CLEVR."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for model, extra in (("nac_micro", ["model.overrides.graph_prior={name: ring_of_cliques, params: "
                                        "{num_cliques: 3}}", "aux_loss_weights.graph=1e-4"]),
                         ("perceiver_io_micro", [])):
        out[model] = root / model
        train(load_config(None, [f"out_dir={out[model]}", f"model.name={model}", "data.task=sort_of_clevr",
                                 "data.params.size={train: 2, val: 1}", "data.batch_size=8", "max_steps=2",
                                 "progress=false", *extra]))
    return out


def _score(run_dir, keep=None):
    """The run's metrics on its first N validation samples, with only the modules ``keep``."""
    r = open_run(run_dir, [], None, N, set())
    model = r.model if keep is None else keep_modules(r.model, torch.tensor(keep)).eval()
    loader = make_loader(r.dataset, r.cfg.data.batch_size, None, r.info, 0, drop_last=False)
    return evaluate(model, loader, r.info, torch.device("cpu"), r.cfg.precision)


@pytest.fixture(scope="module")
def drawn(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("analysis")
    calls = []
    summary = analyze(runs["nac_micro"], [runs["perceiver_io_micro"]], out_dir=out, drop=[0.0, 0.5, 0.75],
                      edges=[0.0], max_samples=N, batch=4, iters=1, plots=True, draws=3, draw_seed=7,
                      progress=lambda done, total: calls.append((done, total)), log=None)
    return summary, out, calls


def test_the_same_random_subsets_for_both_models_nested_and_differing_between_draws(drawn):
    summary, _, _ = drawn
    rows = [r for r in summary["modules_dropped"] if r["order"] == "random"]
    by = {(r["model"], r["fraction_dropped"], r["draw"]): r["dropped"] for r in rows}
    assert len(rows) == 2 * 3 * 3
    orders = drop_orders(U, 3, 7)
    for f, k in ((0.0, 0), (0.5, 6), (0.75, 9)):
        for d in range(3):
            expected = sorted(orders[d][:k].tolist())
            assert by[("nac_micro", f, d)] == by[("perceiver_io_micro", f, d)] == expected
    assert len({tuple(by[("nac_micro", 0.5, d)]) for d in range(3)}) == 3        # the draws differ
    for d in range(3):                                                           # a draw's subsets are nested
        assert set(by[("nac_micro", 0.5, d)]) < set(by[("nac_micro", 0.75, d)])
    assert drop_orders(U, 3, 7)[2].tolist() == orders[2].tolist()                # seeded: the same again
    assert drop_orders(U, 3, 8)[0].tolist() != orders[0].tolist()


def test_each_copy_is_scored_exactly_and_zero_dropped_is_the_full_model(drawn, runs):
    summary, _, _ = drawn
    for model, run_dir in runs.items():
        full = _score(run_dir)
        mine = [r for r in summary["modules_dropped"] if r["model"] == model]
        for r in mine:
            if r["fraction_dropped"] == 0.0:
                assert r["top1"] == pytest.approx(full["top1"]) and r["loss"] == pytest.approx(full["loss"], rel=1e-5)
                assert r["dropped"] == [] and r["modules_kept"] == U
        r = next(r for r in mine if (r["order"], r["fraction_dropped"], r["draw"]) == ("random", 0.75, 1))
        ref = _score(run_dir, keep=[i for i in range(U) if i not in r["dropped"]])
        assert r["top1"] == pytest.approx(ref["top1"]) and r["loss"] == pytest.approx(ref["loss"], rel=1e-5)
        own = {r["order"] for r in mine if r["order"] != "random"}
        assert own == {"importance" if model == "nac_micro" else "last"}
        for f in (0.5, 0.75):   # throughput and FLOPs depend on the count kept: measured once, shared
            same = [r for r in mine if r["fraction_dropped"] == f]
            assert len({(r["samples_per_s"], r["gflops_per_sample"]) for r in same}) == 1


def test_mean_and_std_over_the_draws_in_csv_and_json(drawn):
    summary, out, calls = drawn
    with open(out / "modules_dropped_stats.csv", newline="") as f:
        csv_stats = list(csv.DictReader(f))
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["drop_draws"] == 3 and on_disk["drop_seed"] == 7
    assert on_disk["modules_dropped_stats"] == summary["modules_dropped_stats"]
    assert len(csv_stats) == len(summary["modules_dropped_stats"]) == 2 * 3
    for s, c in zip(summary["modules_dropped_stats"], csv_stats):
        values = [r["top1"] for r in summary["modules_dropped"] if r["order"] == "random"
                  and (r["model"], r["fraction_dropped"]) == (s["model"], s["fraction_dropped"])]
        assert s["draws"] == 3 and len(values) == 3
        assert s["top1_mean"] == pytest.approx(statistics.fmean(values))
        assert s["top1_std"] == pytest.approx(statistics.stdev(values))
        assert float(c["top1_mean"]) == s["top1_mean"] and float(c["top1_std"]) == s["top1_std"]
    with open(out / "modules_dropped.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(summary["modules_dropped"]) == 2 * 3 * 4
    assert rows[-1]["dropped"] == " ".join(map(str, summary["modules_dropped"][-1]["dropped"]))
    # one evaluation per copy: the full model once per run, then 2 fractions × (own order + 3 draws)
    assert calls[-1] == (2 * (1 + 2 * 4), 2 * (1 + 2 * 4)) and [d for d, _ in calls] == list(range(1, 19))
    assert (out / "accuracy_vs_modules_dropped.png").stat().st_size > 2000


@pytest.mark.parametrize("draws, seed, expected", [(1, 0, "at least 2"), (-2, 0, "at least 2"),
                                                   (2.5, 0, "expected an integer"), (3, "x", "expected an integer")])
def test_bad_draws_are_refused_before_any_work(runs, tmp_path, draws, seed, expected):
    with pytest.raises(UserError, match=expected):
        analyze(runs["perceiver_io_micro"], out_dir=tmp_path / "out", drop=[0.0], plots=False, draws=draws,
                draw_seed=seed, log=None)
    assert not (tmp_path / "out").exists()
