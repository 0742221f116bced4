"""``grad_checkpointing: true`` in ``modwire train``: the model's own ``set_grad_checkpointing``, the same
losses and weights as without it; a model that cannot recompute its blocks is refused before the run writes."""
import json

import pytest
import torch
from safetensors.torch import load_file

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire.errors import UserError
from modwire.training import load_config, train


def cfg(run, *extra):
    return load_config(None, [f"out_dir={run}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                              "epochs=1", "optim.lr=3e-3", "progress=false", "log_every=1",
                              "model.overrides.kernel.train_mode=sample", *extra])


def test_a_checkpointed_run_gives_the_losses_and_weights_of_one_without(tmp_path, monkeypatch):
    from modwire.models.nac import NAC

    calls = []
    real = NAC.set_grad_checkpointing
    monkeypatch.setattr(NAC, "set_grad_checkpointing", lambda self, enable=True: (calls.append(enable), real(self, enable)))
    runs = {}
    for on in (False, True):
        runs[on] = tmp_path / str(on)
        train(cfg(runs[on], f"grad_checkpointing={str(on).lower()}"))
    assert calls == [False, True]

    def losses(run):
        return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(losses(runs[True])) == 4 and losses(runs[True]) == pytest.approx(losses(runs[False]), rel=1e-6)
    a, b = (load_file(runs[on] / "checkpoints" / "last" / "model.safetensors") for on in (False, True))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_model_that_cannot_recompute_its_blocks_is_refused_before_the_run_writes(tmp_path):
    run = tmp_path / "new" / "run"
    with pytest.raises(UserError, match=r"config key 'grad_checkpointing': set_grad_checkpointing: this AiT writes "
                                        r"each layer's workspace memory"):
        train(load_config(None, [f"out_dir={run}", "model.name=ait_micro", "data.task=toy_sets", "data.batch_size=16",
                                 "aux_loss_weights.balance=0.01", "progress=false", "grad_checkpointing=true"]))
    assert not run.exists()
