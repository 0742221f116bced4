"""modwire.experiments.nfm_multi_digit (NFM Table 5 at CPU scale): each run is the CPU config with the
regime's counts and the model's preset; an in-process smoke run trains, scores every count and
tabulates next to the paper."""
import json

import pytest

from modwire.experiments import nfm_multi_digit as md
from modwire.training import build_model_for_task, load_config


def sets(regime, model, tmp_path, **kw):
    return load_config(md.CONFIG, values=md.overrides(regime, model, 0, 100, tmp_path, **kw))


def test_runs_are_the_cpu_config_with_the_regime_and_the_model(tmp_path):
    cfg = sets("1_5", "nfm", tmp_path)
    assert cfg.data.task == "multi_digit" and cfg.model.name == "nfm_preact_resnet18_multi_digit"
    assert cfg.data.params["counts"] == {"train": [1, 5], "val": [1, 5], "test": [1, 2, 3, 4, 5]}
    assert cfg.max_steps == 100 and cfg.out_dir == str(tmp_path / "1_5-nfm-seed0")
    base = sets("1_3", "baseline", tmp_path, root="/data/mnist")
    assert base.model.name == "preact_resnet18_multi_digit" and base.data.params["root"] == "/data/mnist"
    assert base.data.params["counts"]["train"] == [1, 3] and base.model.overrides == cfg.model.overrides
    assert md.PAPER["1_5"][3] == ((57.11, 3.57), (66.58, 5.24))
    with pytest.raises(SystemExit):
        md.parse(["--regimes", "1_4"])


@pytest.mark.parametrize("config", [md.CONFIG, md.common.CONFIGS / "nfm_multi_digit_1_5.yaml"])
def test_configs_read_nfm_eight_times(config):
    cfg = load_config(str(config))
    model = build_model_for_task(cfg)
    body = model.body
    assert body.passes == 2 and len(body.readers) == 8                      # §4.2: "used 8 times"
    assert body.readers[0].k == 5 and model.num_classes == 10 and cfg.data.params["counts"]["train"][0] == 1


def test_quick_run_trains_scores_each_count_and_tabulates(tmp_path, capsys):
    args = ["--quick", "--workers", "0", "--regimes", "1_5", "--out", str(tmp_path)]
    assert md.main(args) == 0
    records = [json.loads(l) for l in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in records) == ["1_5-baseline-seed0", "1_5-nfm-seed0"]
    for r in records:
        assert sorted(r["test"]) == ["1", "2", "3", "4", "5"]
        assert all(0 <= t["exact_match"] <= t["label_accuracy"] <= 1 for t in r["test"].values())
    table = (tmp_path / "table.md").read_text()
    nfm = next(r for r in records if r["model"] == "nfm")
    assert "| (1,5) | 3 | 57.11 ± 3.57 | 66.58 ± 5.24 |" in table
    assert f"{100 * nfm['test']['3']['label_accuracy']:.2f}" in table
    assert md.main(args) == 0                                   # everything done: nothing retrained
    assert "2 runs, 2 already in" in capsys.readouterr().out
