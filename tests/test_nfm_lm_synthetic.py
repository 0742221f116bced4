"""modwire.experiments.nfm_lm_synthetic: the generated corpus and a --quick run of every variant."""
import json

import numpy as np
import pytest

from modwire.tasks.loaders import wikitext


def test_corpus_has_the_wikitext_layout_and_number_agreement(tmp_path):
    from modwire.experiments import nfm_lm_synthetic as exp
    root = exp.write_corpus(tmp_path / "data", 40)
    vocab = wikitext.vocabulary(root)
    assert vocab[0] == "<eos>" and "=" in vocab and "<unk>" in vocab
    rng = np.random.default_rng(1)
    assert all(exp._verb(rng, True) in exp.VERBS for _ in range(20))          # plural: the bare verb
    assert all(exp._verb(rng, False) in [v + "s" for v in exp.VERBS] for _ in range(20))   # singular: + s
    words = exp.sentence(np.random.default_rng(3))
    assert words[-1] == "." and words[0] in ("the", "a", "one", "some", "many", "<unk>")


@pytest.mark.slow      # ~5 s (make test stays under 10 minutes)
def test_quick_run_writes_every_variant_and_seed(tmp_path):
    """--quick --seeds 2: a record per (variant, seed), seeds-major, on one corpus (the seed changes the
    training only); the table's mean ± std; --report rebuilds the same study.json results."""
    from modwire.experiments import nfm_lm_synthetic as exp
    assert exp.main(["--quick", "--seeds", "2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [(r["variant"], r["seed"]) for r in rows] == [(v, s) for s in (0, 1) for v in ("base", "nfm", "nfm_2pass")]
    # one γ per reading module (4 layers; the first module of the first pass reads only the null slot: none)
    assert rows[1]["parameters"] - rows[0]["parameters"] == 3 and rows[2]["parameters"] - rows[0]["parameters"] == 7
    assert all(r["steps"] == 4 and r["val"]["perplexity"] > 1 and r["seconds"] > 0 for r in rows)
    base = [r["val"]["perplexity"] for r in rows if r["variant"] == "base"]
    assert base[0] != base[1]                                                     # each seed its own run
    summary, per_run = (tmp_path / "table.md").read_text().split("\n\n")
    assert summary.count("\n") == 4 and per_run.count("\n") == 8
    mean_std = exp.common.format_mean_std(base, 3)
    assert f"| base | {rows[0]['parameters']:,} | 2 | {mean_std} | {base[0]:.3f}, {base[1]:.3f} |" in summary
    assert rows[0]["reads"] == {} and 0 <= rows[1]["reads"]["null_mass"] <= 1
    assert rows[2]["reads"]["top_down_share"] == rows[2]["reads"]["top_down_share"]    # not NaN: pass 2 reads pass 1
    assert (tmp_path / "read_map_nfm_2pass.png").stat().st_size > 0                  # seed 0's
    fresh = json.loads((tmp_path / "study.json").read_text())
    assert fresh["seeds"] == [0, 1] and fresh["config"]["seeds"] == 2
    assert exp.main(["--report", "--out", str(tmp_path)]) == 0                   # from results.json, no training
    study = json.loads((tmp_path / "study.json").read_text())
    assert json.dumps(study["results"]) == json.dumps(rows) and study["source"]["logs"][0].endswith("results.json")
    assert study["seeds"] == [0, 1]
