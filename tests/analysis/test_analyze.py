"""``modwire analyze`` (NAC Fig. 5, 8, 10, 15): tiny trained runs on a built-in synthetic
task, the CSV/JSON/PNG outputs, the graph-picture helper, the FLOP counter, bad input."""
import csv
import json
import sys
import types

import pytest
import torch

import modwire
from modwire import cli
from modwire.analysis import count_flops, graph_from_link_probs, load_run
from modwire.analysis.edges import graph_frame
from modwire.analysis.runs import AnalyzedRun
from modwire.models.nac import FrozenGraphConfig
from modwire.training import load_config, train
from modwire.training import evaluate, make_loader

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
U = 12  # processor modules of nac_micro, latents of perceiver_io_micro


def _train(root, model, *extra):
    out = root / model
    train(load_config(None, [f"out_dir={out}", f"model.name={model}", "data.task=sort_of_clevr",
                             "data.params.size={train: 2, val: 1}", "data.batch_size=8", "max_steps=3",
                             "optim.lr=3e-3", "progress=false", "log_every=1", *extra]))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A NAC (with a ring-of-cliques graph prior) and a Perceiver IO trained for 3 steps on
    Sort-of-CLEVR (40 train, 20 val items)."""
    root = tmp_path_factory.mktemp("runs")
    nac = _train(root, "nac_micro", "model.overrides.graph_prior={name: ring_of_cliques, params: {num_cliques: 3}}",
                 "aux_loss_weights.graph=1e-4")
    return nac, _train(root, "perceiver_io_micro")


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _reference(run, n):
    """The run's metrics on the first ``n`` validation samples, as ``modwire eval`` computes them."""
    cfg, model, info, dataset = load_run(run)
    loader = make_loader(torch.utils.data.Subset(dataset, range(n)), cfg.data.batch_size, None, info, 0, False)
    return evaluate(model, loader, info, torch.device("cpu"), cfg.precision)


def _check_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 2000, path
    from PIL import Image

    with Image.open(path) as im:
        im.verify()


def test_analyze_nac_with_pio_baseline_end_to_end(runs, tmp_path, capsys):
    nac, pio = runs
    out = tmp_path / "analysis"
    drops, edge_fracs, n = [0.0, 0.25, 0.5, 0.75], [0.0, 0.5, 1.0], 16
    assert cli.main(["analyze", str(nac), "--baseline", str(pio), "--out", str(out),
                     "--drop", ",".join(map(str, drops)), "--edges", ",".join(map(str, edge_fracs)),
                     "--max-samples", str(n), "--batch", "8", "--iters", "1"]) == 0
    printed = capsys.readouterr().out
    assert "samples/s" in printed and "wrote:" in printed and str(out / "summary.json") in printed

    rows = _rows(out / "modules_dropped.csv")
    assert list(rows[0])[:4] == ["run", "model", "fraction_dropped", "modules_kept"]
    assert list(rows[0])[4:7] == ["order", "draw", "top1"]
    assert list(rows[0])[-3:] == ["samples_per_s", "gflops_per_sample", "dropped"]
    assert {"loss", "top1_relational", "top1_non_relational"} <= set(rows[0])   # every metric of the task
    assert len(rows) == 2 * len(drops)
    by_model = {m: [r for r in rows if r["model"] == m] for m in ("nac_micro", "perceiver_io_micro")}
    for model, run in (("nac_micro", nac), ("perceiver_io_micro", pio)):
        got = by_model[model]
        assert [float(r["fraction_dropped"]) for r in got] == drops
        assert [int(r["modules_kept"]) for r in got] == [U - round(f * U) for f in drops]
        gflops = [float(r["gflops_per_sample"]) for r in got]
        assert all(a > b for a, b in zip(gflops, gflops[1:])), gflops   # fewer modules, fewer FLOPs
        assert all(float(r["samples_per_s"]) > 0 for r in got)
        # without --draws each model's own order: the NAC's least important modules, the PIO's last latents
        assert {r["order"] for r in got} == {"importance" if model == "nac_micro" else "last"}
        assert {r["draw"] for r in got} == {""}
        if model == "perceiver_io_micro":
            assert [r["dropped"] for r in got] == [" ".join(map(str, range(U - round(f * U), U))) for f in drops]
        ref = _reference(run, n)                      # the undropped model, same samples
        assert float(got[0]["top1"]) == pytest.approx(ref["top1"])
        assert float(got[0]["loss"]) == pytest.approx(ref["loss"], rel=1e-5)

    edges = _rows(out / "edges_removed.csv")
    assert list(edges[0])[:4] == ["run", "fraction_removed", "edges_kept", "top1"]
    assert [r["run"] for r in edges] == [nac.name] * len(edge_fracs)        # the PIO has no edges
    assert [int(r["edges_kept"]) for r in edges] == [66 - round(f * 66) for f in edge_fracs]
    assert float(edges[0]["top1"]) == pytest.approx(float(by_model["nac_micro"][0]["top1"]))
    # block-sparse propagators (modules ordered by the matched ring-of-cliques blocks) are exact
    assert all(float(r["block_sparse_max_abs_diff"]) < 1e-4 for r in edges)
    assert all(float(r["samples_per_s_dense_masked"]) > 0 and float(r["samples_per_s_block_sparse"]) > 0
               for r in edges)
    assert float(edges[0]["block_density"]) == 1.0          # nothing removed: one dense block

    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "nac_micro" and summary["num_samples"] == n and summary["metric"] == "top1"
    assert summary["baselines"][0]["model"] == "perceiver_io_micro"
    assert len(summary["modules_dropped"]) == len(rows) and len(summary["edges_removed"]) == len(edges)
    assert summary["graphs"][nac.name]["num_modules"] == U
    assert summary["graphs"][nac.name]["prior"] == "ring_of_cliques"
    pngs = {"accuracy_vs_modules_dropped.png", "throughput_vs_modules_dropped.png", "accuracy_vs_gflops.png",
            "accuracy_vs_edges_removed.png", "throughput_vs_edges_removed.png", "graph.png", "link_probs.png"}
    assert {p.name for p in out.iterdir()} == pngs | {"modules_dropped.csv", "edges_removed.csv", "summary.json"}
    assert sorted(summary["files"]) == sorted(str(p) for p in out.iterdir())
    for name in pngs:
        _check_png(out / name)


def test_pio_run_alone_without_plots(runs, tmp_path, monkeypatch, capsys):
    _, pio = runs
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # as if not installed: imports fail
    assert cli.main(["analyze", str(pio), "--out", str(tmp_path / "b"), "--drop", "0"]) == 2
    assert "pip install 'modwire[analysis]'" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()                    # said so before computing anything
    out = tmp_path / "a"
    assert cli.main(["analyze", str(pio), "--out", str(out), "--drop", "0, 0.5", "--max-samples", "8",
                     "--batch", "4", "--iters", "1", "--no-plots"]) == 0
    assert {p.name for p in out.iterdir()} == {"modules_dropped.csv", "summary.json"}   # no edges, no PNGs
    rows = _rows(out / "modules_dropped.csv")
    assert [int(r["modules_kept"]) for r in rows] == [U, U // 2]


def test_default_output_dir_is_inside_the_run(runs):
    _, pio = runs
    assert cli.main(["analyze", str(pio), "--drop", "0", "--max-samples", "4", "--batch", "2", "--iters", "1",
                     "--no-plots"]) == 0
    assert (pio / "analysis" / "modules_dropped.csv").is_file()


@pytest.mark.parametrize("args, expected", [
    (["--drop", "0,1.0"], "[0, 1)"),
    (["--drop", "-0.1"], "[0, 1)"),
    (["--drop", "half"], "'half'"),
    (["--edges", "0,1.5"], "[0, 1]"),
    (["--drop", "0.99"], "would drop all 12 modules"),   # round(0.99 · 12) = 12
    (["--batch", "0"], "--batch"),
])
def test_bad_fractions_exit_2(runs, tmp_path, capsys, args, expected):
    nac, _ = runs
    assert cli.main(["analyze", str(nac), "--out", str(tmp_path), "--no-plots", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modwire analyze: error:") and expected in err


def test_missing_run_and_edges_on_a_pio_exit_2(runs, tmp_path, capsys):
    _, pio = runs
    assert cli.main(["analyze", str(tmp_path / "missing"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "no run directory or checkpoint at" in err and "missing" in err
    (tmp_path / "empty").mkdir()
    assert cli.main(["analyze", str(tmp_path / "empty"), "--no-plots"]) == 2
    assert "checkpoints/best" in capsys.readouterr().err
    assert cli.main(["analyze", str(pio), "--edges", "0,0.5", "--out", str(tmp_path / "o"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "--edges needs a NAC run" in err and "perceiver_io" in err
    assert not (tmp_path / "o").exists()   # rejected before anything was computed or written


def test_eval_still_reports_the_runs_metrics(runs, capsys):
    nac, _ = runs
    assert cli.main(["eval", str(nac)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["task"] == "sort_of_clevr" and out["split"] == "val"
    assert out["top1"] == pytest.approx(_reference(nac, 20)["top1"])


# ----------------------------------------------------------------------------- helpers


def test_graph_has_exactly_the_edges_above_the_threshold():
    g = torch.Generator().manual_seed(0)
    for symmetric in (True, False):
        p = torch.rand(15, 15, generator=g)
        if symmetric:
            p = (p + p.T) / 2
        p.fill_diagonal_(1.0)
        for t in (0.5, 0.8):
            graph = graph_from_link_probs(p, threshold=t)
            expected = set()
            for i in range(15):
                for j in range(15):
                    if i != j and p[i, j] > t:
                        expected.add((min(i, j), max(i, j)))
            assert {(min(e), max(e)) for e in graph.edges()} == expected
            assert set(graph.nodes()) == set(range(15))


def test_plot_graph_and_link_probs_write_pngs(tmp_path):
    from modwire.analysis import plot_graph, plot_link_probs

    p = torch.rand(10, 10, generator=torch.Generator().manual_seed(1))
    p = (p + p.T) / 2
    _check_png(plot_graph(p, tmp_path / "g.png", seed=0))
    _check_png(plot_link_probs(p, tmp_path / "l.png", prior=torch.eye(10), order=torch.arange(9, -1, -1)))
    with pytest.raises(ValueError, match="permutation"):
        plot_link_probs(p, tmp_path / "x.png", order=[0] * 10)


def test_plot_priors_draws_figures_3_and_7(tmp_path):
    from modwire.analysis import plot_priors

    _check_png(plot_priors(tmp_path / "priors.png", num_modules=40, sample_modules=16))


def test_count_flops_of_a_linear_layer():
    b, i, o = 3, 7, 5
    layer = torch.nn.Linear(i, o)
    x = torch.randn(b, i)
    assert count_flops(lambda: layer(x)) == 2 * b * i * o
    with torch.inference_mode():   # works inside inference mode too
        assert count_flops(lambda: layer(x)) == 2 * b * i * o


def test_link_probs_frame_follows_the_prior_matching(monkeypatch):
    """With a graph prior, modules are shown in the prior's frame: order = argsort(σ)."""
    u = 6
    sigma = torch.tensor([3, 0, 5, 1, 4, 2])
    p0 = torch.rand(u, u)
    calls = {}

    def prior(name, n, **params):
        calls["prior"] = (name, n, params)
        return p0

    def match(p, q, align="degree"):
        calls["match"], calls["align"] = q, align
        return sigma

    fake = types.SimpleNamespace(prior=prior, match=match)
    monkeypatch.setattr(modwire, "graphs", fake, raising=False)
    monkeypatch.setitem(sys.modules, "modwire.graphs", fake)
    gp = types.SimpleNamespace(name="ring_of_cliques", params={"num_cliques": 2}, align="none")
    model = types.SimpleNamespace(config=types.SimpleNamespace(graph_prior=gp,
                                                               frozen_graph=FrozenGraphConfig()))  # name=None
    run = AnalyzedRun(None, "r", None, model, None, None, "nac", u, True)
    p = torch.rand(u, u)
    order, shown_prior, name, _ = graph_frame(run, p)
    assert calls["prior"] == ("ring_of_cliques", u, {"num_cliques": 2}) and calls["match"] is shown_prior
    assert calls["align"] == "none"   # matched as the run's regularizer did
    assert order.tolist() == torch.argsort(sigma).tolist() and name == "ring_of_cliques"
    assert all(sigma[order[k]] == k for k in range(u))   # row k of the reordered P is prior node k
    # without a prior: by descending q_i = Σ_j P_ij, P shown alone
    run.model.config.graph_prior = types.SimpleNamespace(name=None, params={})
    order, shown_prior, name, _ = graph_frame(run, p)
    assert shown_prior is None and name is None
    assert order.tolist() == torch.sort(p.sum(1), descending=True, stable=True).indices.tolist()


@pytest.mark.slow
def test_analyze_a_small_nac_on_triangles(tmp_path):
    """The realistic path: nac_small (with a scale-free graph prior) and perceiver_io_small
    (conv tokenizer) trained a few dozen steps on the triangle task, analysed with the
    default fractions."""
    common = ["data.task=triangle", "data.params.size={train: 384, val: 64}", "data.batch_size=16",
              "max_steps=24", "progress=false", "log_every=8", "optim.lr=1e-3"]
    train(load_config(None, [f"out_dir={tmp_path / 'nac_small'}", "model.name=nac_small", *common,
                             "model.overrides.graph_prior=scale_free", "aux_loss_weights.graph=1e-4"]))
    train(load_config(None, [f"out_dir={tmp_path / 'perceiver_io_small'}", "model.name=perceiver_io_small", *common]))
    out = tmp_path / "analysis"
    assert cli.main(["analyze", str(tmp_path / "nac_small"), "--baseline", str(tmp_path / "perceiver_io_small"),
                     "--out", str(out), "--max-samples", "64", "--batch", "16", "--iters", "2"]) == 0
    rows = _rows(out / "modules_dropped.csv")
    assert len(rows) == 2 * 8
    nac_rows = [r for r in rows if r["model"] == "nac_small"]
    assert [int(r["modules_kept"]) for r in nac_rows] == [64, 48, 32, 24, 16, 12, 8, 4]
    gflops = [float(r["gflops_per_sample"]) for r in nac_rows]
    assert all(a > b for a, b in zip(gflops, gflops[1:]))
    assert len(_rows(out / "edges_removed.csv")) == 9
    assert json.loads((out / "summary.json").read_text())["graphs"]["nac_small"]["prior"] == "scale_free"
    for name in ("graph.png", "link_probs.png", "accuracy_vs_gflops.png", "accuracy_vs_edges_removed.png"):
        _check_png(out / name)
