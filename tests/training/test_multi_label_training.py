"""Training on a multi-label task (loss ``bce``, NFM §4.2's multi-digit images): the trainer
logs exact-match and per-label accuracy, keeps the best checkpoint by exact match, and
``modwire eval`` reproduces the run's numbers."""
import json

import pytest

from modwire import cli
from modwire.training import load_config, train


def test_multi_digit_run_logs_multilabel_metrics_and_eval_reproduces_them(tmp_path, capsys):
    cfg = load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=vit_micro", "data.task=multi_digit",
                             "data.params.size={train: 48, val: 24, test: 24}", "data.params.image_size=32",
                             "data.params.digit_size=10", "data.params.counts=[1, 2]", "data.batch_size=16",
                             "epochs=2", "progress=false", "log_every=1", "optim.lr=3e-3"])
    result = train(cfg)
    records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    vals = [r for r in records if "val_exact_match" in r]
    assert len(vals) == 2 and set(result["val"]) == {"loss", "exact_match", "label_accuracy"}
    assert result["best"]["exact_match"] == max(r["val_exact_match"] for r in vals)
    # 24 images of 1-2 digits: label accuracy is a multiple of 1/240, exact match of 1/24
    assert (result["val"]["label_accuracy"] * 240) == pytest.approx(round(result["val"]["label_accuracy"] * 240))
    assert 0.0 <= result["val"]["exact_match"] <= result["val"]["label_accuracy"] <= 1.0
    assert cli.main(["eval", str(tmp_path / "run" / "checkpoints" / "last")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["exact_match"] == pytest.approx(result["val"]["exact_match"])
    assert out["label_accuracy"] == pytest.approx(result["val"]["label_accuracy"])
    assert out["loss"] == pytest.approx(result["val"]["loss"], rel=1e-5)


def test_label_smoothing_is_refused_for_a_multilabel_task(tmp_path):
    cfg = load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=vit_micro", "data.task=multi_digit",
                             "data.params.size=16", "data.params.image_size=32", "data.params.digit_size=10",
                             "data.params.counts=[1]", "data.batch_size=8", "max_steps=1", "progress=false",
                             "optim.label_smoothing=0.1"])
    with pytest.raises(ValueError, match="label_smoothing applies to cross-entropy"):
        train(cfg)
