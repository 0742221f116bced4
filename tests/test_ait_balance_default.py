"""AiT's balance loss trains at the paper's σ = 1e-2 (AiT Eq. 6, §5.1) without a configured weight;
a configured ``aux_loss_weights.balance`` replaces it (``AiT.aux_loss_defaults``)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import toy_task  # noqa: E402,F401  (registers toy_sets)

from modwire.models.ait import AiT  # noqa: E402
from modwire.training import load_config, train  # noqa: E402
from modwire.training.objective import Objective  # noqa: E402


def run(tmp_path, *extra):
    cfg = load_config(None, [f"out_dir={tmp_path}", "model.name=ait_micro", "data.task=toy_sets",
                             "data.batch_size=16", "epochs=1", "max_steps=2", "progress=false", "log_every=1", *extra])
    return cfg, train(cfg)


def test_an_ait_trains_with_the_papers_balance_weight_by_default(tmp_path):
    assert AiT.aux_loss_defaults == {"balance": 1e-2}
    cfg, result = run(tmp_path)
    assert result["status"] == "finished" and cfg.aux_loss_weights == {}
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("aux/balance" in r for r in records)


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_a_configured_weight_replaces_the_default(tmp_path, weight):
    cfg = load_config(None, [f"out_dir={tmp_path}", "model.name=ait_micro", "data.task=toy_sets",
                             f"aux_loss_weights.balance={weight}"])
    assert Objective.from_config(cfg).weights(AiT(AiT.config_class())) == {"balance": weight}
