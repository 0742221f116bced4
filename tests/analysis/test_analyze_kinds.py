"""Issue 24: ``modwire analyze`` runs what applies to each kind of model, by its declared
capabilities: an AiT's workspace analyses (AiT Fig. 2, 7, 10, 11), an NFM model's read map (NFM
Fig. 1), every model's metrics (as ``modwire eval``); module surgery flags are refused with what
applies instead. Tiny runs trained here on the triangle task and a tiny WikiText-2 corpus."""
import ast
import json
import math
from pathlib import Path

import pytest
import torch

from modwire import cli, create_model
from modwire.analysis.catalog import ANALYSES, applicable
from modwire.analysis.nfm import read_map
from modwire.analysis.runs import load_run, other_analyses
from modwire.analysis.workspace import collect_energies, energy_summary, model_patch_diversity, slot_similarity
from modwire.models.capabilities import CAPABILITIES, HasNFM, HasWorkspace, capabilities
from modwire.training import load_config, make_loader, train

SRC = Path(__file__).resolve().parents[2] / "src" / "modwire"
TRIANGLE = ["data.task=triangle", "data.params={size: {train: 16, val: 12, test: 4}}", "data.batch_size=8",
            "max_steps=2", "progress=false"]


def _train(out, model, *extra):
    train(load_config(None, [f"out_dir={out}", f"model.name={model}", *extra]))
    return out


def _corpus(root):
    """WikiText-2's layout with counting sentences 'w3 w4 w5 w6 w7 .'."""
    d = root / "wikitext-2"
    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for name, n in (("train", 30), ("valid", 6), ("test", 6)):
        starts = torch.randint(0, 12, (n,), generator=g).tolist()
        (d / f"wiki.{name}.tokens").write_text("".join(" " + " ".join(f"w{s + i}" for i in range(5)) + " . \n"
                                                       for s in starts))
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An AiT (16 patches of the 64×64 triangles), an NFM PreActResNet, a plain and an NFM transformer LM."""
    root = tmp_path_factory.mktemp("kinds")
    corpus = _corpus(root / "data")
    lm = [f"data.task=wikitext2", f"data.params.root={corpus}", "data.params.seq_len=8", "data.batch_size=4",
          "max_steps=2", "progress=false"]
    return {"ait": _train(root / "ait", "ait_micro", *TRIANGLE, "model.overrides={tokenizer: {patch_size: 16}}"),
            "resnet": _train(root / "resnet", "nfm_preact_resnet_micro", *TRIANGLE),
            "lm": _train(root / "lm", "transformer_lm_micro", *lm),
            "nfm_lm": _train(root / "nfm_lm", "nfm_transformer_lm_micro", *lm)}


def _analyze(run, out, capsys, *args):
    capsys.readouterr()
    code = cli.main(["analyze", str(run), "--out", str(out), "--no-plots", *args])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    return json.loads((out / "summary.json").read_text()), printed.out


def _eval(run, capsys, *args):
    capsys.readouterr()
    assert cli.main(["eval", str(run), *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _loader(run, n):
    """The run's model and the first ``n`` samples of its split in batches of its batch size."""
    cfg, model, info, dataset = load_run(run, [f"data.max_samples={n}"])
    return model, make_loader(dataset, cfg.data.batch_size, None, info, 0, drop_last=False)


def _check_read_map(rm: dict, samples: int):
    """Each reader's mass on its sources plus the null slot is one; it reads only earlier entries."""
    assert rm["summary"]["samples"] == samples and rm["readers"][0] == [0, 0]
    for reader, row, null in zip(rm["readers"], rm["mass"], rm["null"]):
        readable = [m for m in row if m is not None]
        assert all(0 <= m <= 1 for m in readable) and 0 <= null <= 1
        assert math.isclose(sum(readable) + null, 1.0, rel_tol=1e-5)
    assert rm["mass"][0] == [None] * len(rm["sources"]) and rm["null"][0] == pytest.approx(1.0)
    assert all(0 <= s <= 1 for s in rm["top_down_share"] if s is not None)


def test_ait_run_gets_metrics_and_the_workspace_analyses(runs, tmp_path, capsys):
    summary, printed = _analyze(runs["ait"], tmp_path / "a", capsys, "--max-samples", "10")
    assert summary["analyses"] == ["workspace"] and "nfm_read_map" in summary["other_analyses"]
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics == _eval(runs["ait"], capsys, "--max-samples", "10") == summary["metrics"]
    ws = json.loads((tmp_path / "a" / "workspace.json").read_text())
    model, loader = _loader(runs["ait"], 10)
    batches = list(loader)                                              # 8 + 2: the pool of each batch
    assert ws["samples"] == 10 and ws["layers"] == 2 and ws["skipped"] == {} and ws["memory_unchanged"] is True
    assert [d["step"] for d in ws["diversity"]] == [2]                   # best-2 = last-2: one checkpoint
    assert ws["diversity"][0]["per_head"] == model_patch_diversity(model, batches).tolist()
    assert ws["energy"] == energy_summary(collect_energies(model, batches))
    assert ws["slot_cosine"] == [slot_similarity(w.memory) for w in model.workspaces]
    assert all(-1 <= c <= 1 for c in ws["slot_cosine"])
    assert len(ws["slot_maps"]["selected_per_slot"]) == 4 and ws["slot_maps"]["grid"] == [4, 4]
    assert "memory unchanged by the analysis: True" in printed and "For other kinds of model" in printed
    assert not list((tmp_path / "a").glob("*.png"))                     # --no-plots


def test_the_experiment_script_and_analyze_share_the_workspace_numbers(runs, tmp_path, capsys):
    from modwire.experiments import ait_analysis as script
    assert script.main([str(runs["ait"]), "--samples", "10", "--no-plots", "--out", str(tmp_path / "e")]) == 0
    from_script = json.loads((tmp_path / "e" / "summary.json").read_text())["ait"]
    _analyze(runs["ait"], tmp_path / "a", capsys, "--max-samples", "10")
    from_cli = json.loads((tmp_path / "a" / "workspace.json").read_text())
    assert {k: v for k, v in from_script.items() if k != "run"} == {k: v for k, v in from_cli.items() if k != "run"}


def test_nfm_resnet_run_writes_its_read_map(runs, tmp_path, capsys):
    summary, printed = _analyze(runs["resnet"], tmp_path / "r", capsys)
    assert summary["analyses"] == ["nfm_read_map"] and summary["num_samples"] == 12
    assert summary["metrics"] == _eval(runs["resnet"], capsys)
    rm = json.loads((tmp_path / "r" / "nfm_read_map.json").read_text())
    _check_read_map(rm, 12)
    model, loader = _loader(runs["resnet"], 12)
    direct = read_map(model, loader)
    assert rm["mass"] == [[None if math.isnan(v) else v for v in row] for row in direct.mass.tolist()]
    assert rm["summary"]["top_down_share"] == pytest.approx(direct.summary()["top_down_share"])
    assert "NFM reads (4 readers, 12 samples)" in printed


def test_plain_lm_gets_its_metrics_and_the_list_of_analyses(runs, tmp_path, capsys):
    summary, printed = _analyze(runs["lm"], tmp_path / "l", capsys)
    assert summary["analyses"] == [] and set(summary["other_analyses"]) == {a.name for a in ANALYSES}
    assert summary["metrics"] == _eval(runs["lm"], capsys) and "perplexity" in summary["metrics"]
    assert "no model-specific analysis applies to this 'transformer_lm' model" in printed
    assert "workspace (AiT with global-workspace layers)" in printed and "nfm_read_map (models with NFM" in printed
    assert sorted(p.name for p in (tmp_path / "l").iterdir()) == ["metrics.json", "summary.json"]


def test_nfm_lm_gets_its_read_map_on_the_split_asked_for(runs, tmp_path, capsys):
    summary, _ = _analyze(runs["nfm_lm"], tmp_path / "n", capsys, "--split", "test", "--max-samples", "3")
    assert summary["analyses"] == ["nfm_read_map"] and summary["split"] == "test"
    assert summary["metrics"] == _eval(runs["nfm_lm"], capsys, "--split", "test", "--max-samples", "3")
    _check_read_map(json.loads((tmp_path / "n" / "nfm_read_map.json").read_text()), 3)


@pytest.mark.parametrize("args, flag", [(["--drop", "0,0.5"], "--drop"), (["--edges", "0"], "--edges"),
                                        (["--baseline", "BASE"], "--baseline"), (["--batch", "8"], "--batch"),
                                        (["--iters", "1"], "--iters"), (["--block-size", "2"], "--block-size")])
def test_module_surgery_flags_name_what_applies(runs, tmp_path, capsys, args, flag):
    args = [str(runs["lm"]) if a == "BASE" else a for a in args]
    assert cli.main(["analyze", str(runs["ait"]), "--out", str(tmp_path / "o"), "--no-plots", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modwire analyze: error:") and f"{flag} is for dropping modules" in err
    assert "this run's 'ait' model does not. What applies to it: modwire analyze RUN" in err
    assert "workspace: slot attention maps" in err and "['eval_memory_forward']" in err
    assert not (tmp_path / "o").exists()                                # refused before anything was written


def test_gan_generator_read_map_over_latents(tmp_path, capsys):
    gan = create_model("nfm_gan_resnet_micro")
    gan.save_pretrained(tmp_path / "ckpt")
    summary, printed = _analyze(tmp_path / "ckpt", tmp_path / "g", capsys, "--max-samples", "6")
    assert summary["analyses"] == ["nfm_read_map"] and summary["metrics"] is None and "modwire eval" in printed
    _check_read_map(json.loads((tmp_path / "g" / "nfm_read_map.json").read_text()), 6)
    assert cli.main(["analyze", str(tmp_path / "ckpt"), "--split", "val", "--no-plots"]) == 2
    assert "--split does not apply" in capsys.readouterr().err


def test_capabilities_and_the_table_of_analyses_agree():
    ait, vit = create_model("ait_micro"), create_model("vit_micro")
    no_memory = create_model("ait_micro", workspace=False)
    nfm, plain = create_model("nfm_preact_resnet_micro"), create_model("preact_resnet_micro")
    assert isinstance(ait, HasWorkspace) and not isinstance(vit, HasWorkspace)
    assert isinstance(no_memory, HasWorkspace) and [a.name for a in applicable(no_memory)] == []
    assert isinstance(nfm, HasNFM) and not isinstance(plain, HasNFM) and not isinstance(ait, HasNFM)
    assert "workspace" in capabilities(type(ait)) and "nfm" in capabilities(type(plain))   # the config option
    assert "workspace" not in capabilities(type(vit)) and "nfm" not in capabilities(type(ait))
    assert [a.name for a in applicable(ait)] == ["workspace"] and [a.name for a in applicable(nfm)] == ["nfm_read_map"]
    assert {a.capability for a in ANALYSES} <= set(CAPABILITIES)
    assert "nfm_read_map: which layers and passes" in other_analyses(nfm)
    assert "workspace" not in other_analyses(plain)


@pytest.mark.parametrize("name", ["sparsify.py", "edges.py", "circuits.py", "catalog.py", "kinds.py",
                                  "workspace_report.py"])
def test_no_getattr_capability_probe(name):
    """No ``getattr(obj, name, default)``: capabilities are declared (isinstance), config fields read."""
    tree = ast.parse((SRC / "analysis" / name).read_text())
    probes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
              and getattr(n.func, "id", None) in ("getattr", "hasattr") and len(n.args) != 2 or
              isinstance(n, ast.Call) and getattr(n.func, "id", None) == "hasattr"]
    assert probes == []
