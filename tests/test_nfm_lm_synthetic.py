"""experiments/nfm_lm_synthetic.py: the generated corpus and a --quick run of every variant."""
import json

import numpy as np

from experiment_script import load
from modwire.tasks.loaders import wikitext


def test_corpus_has_the_wikitext_layout_and_number_agreement(tmp_path):
    exp = load("nfm_lm_synthetic")
    root = exp.write_corpus(tmp_path / "data", 40)
    vocab = wikitext.vocabulary(root)
    assert vocab[0] == "<eos>" and "=" in vocab and "<unk>" in vocab
    rng = np.random.default_rng(1)
    assert all(exp._verb(rng, True) in exp.VERBS for _ in range(20))          # plural: the bare verb
    assert all(exp._verb(rng, False) in [v + "s" for v in exp.VERBS] for _ in range(20))   # singular: + s
    words = exp.sentence(np.random.default_rng(3))
    assert words[-1] == "." and words[0] in ("the", "a", "one", "some", "many", "<unk>")


def test_quick_run_writes_every_variant(tmp_path):
    exp = load("nfm_lm_synthetic")
    assert exp.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [r["variant"] for r in rows] == ["base", "nfm", "nfm_2pass"]
    assert rows[1]["parameters"] - rows[0]["parameters"] == 4 and rows[2]["parameters"] - rows[0]["parameters"] == 8
    assert all(r["steps"] == 4 and r["val"]["perplexity"] > 1 for r in rows)
    assert (tmp_path / "table.md").read_text().count("\n") == 5
    assert rows[0]["reads"] == {} and 0 <= rows[1]["reads"]["null_mass"] <= 1
    assert rows[2]["reads"]["top_down_share"] == rows[2]["reads"]["top_down_share"]    # not NaN: pass 2 reads pass 1
    assert (tmp_path / "read_map_nfm_2pass.png").stat().st_size > 0
    assert exp.main(["--report", "--out", str(tmp_path)]) == 0                   # from results.json, no training
    study = json.loads((tmp_path / "study.json").read_text())
    assert json.dumps(study["results"]) == json.dumps(rows) and study["source"]["logs"][0].endswith("results.json")
