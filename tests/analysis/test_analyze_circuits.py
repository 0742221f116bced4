"""``modwire train`` then ``modwire eval`` and ``modwire analyze`` on a conditional NAC run
(NAC §4.4, Fig. 6), end to end on built-in Sort-of-CLEVR."""
import json

import torch

from modwire import cli
from modwire.analysis.circuits import collect_link_probs
from modwire.analysis.report import load_run
from modwire.training import load_config, train

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_conditional_run_trains_evaluates_and_writes_fig6(tmp_path, capsys):
    run = tmp_path / "cond"
    result = train(load_config(None, [
        f"out_dir={run}", "model.name=nac_conditional_micro", "data.task=sort_of_clevr_conditional",
        "data.params.size={train: 2, val: 3}", "data.batch_size=8", "max_steps=3", "progress=false"]))
    assert set(result["val"]) >= {"top1", "top1_relational", "top1_non_relational"}
    assert cli.main(["eval", str(run)]) == 0
    out = tmp_path / "fig6"
    assert cli.main(["analyze", str(run), "--out", str(out), "--max-samples", "60"]) == 0
    for name in ("link_prob_embedding.png", "sample_graphs.png"):
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    report = json.loads((out / "conditional.json").read_text())
    sep = report["separation"]
    assert sep["num_samples"] == 60 and sep["num_classes"] == 6
    assert 0.0 <= sep["accuracy"] <= 1.0 and 0.0 < sep["chance"] < 1.0
    assert "held-out nearest-centroid accuracy" in capsys.readouterr().out

    # the collected P are the model's per-sample link probabilities, labelled by question type
    cfg, model, info, dataset = load_run(run)
    p, labels, names = collect_link_probs(model, dataset, info, max_samples=10)
    x = [dataset[i][0]["condition"] for i in range(10)]
    torch.testing.assert_close(p, model.link_probs(torch.stack(x)))
    assert names[0] == "non_relational/shape" and labels.max() < 6
