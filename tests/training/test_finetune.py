"""Fine-tuning on the trainer (``modwire finetune``, ``modwire.training.finetune``): frozen
parameter sets, new task outputs, seeded k-shot n-way subsets, several seeds and resume."""
import json
import os
import signal

import pytest
import torch

import toy_fewshot  # noqa: F401  (registers "toy_classes")
import toy_task  # noqa: F401  (registers "toy_sets")
import modwire
from modwire import cli, create_model
from modwire.models import from_pretrained
from modwire.tasks import build_dataset, describe_task
from modwire.training import load_config, train
from modwire.training.finetune import summarize
from modwire.training.finetune_setup import few_shot_indices, few_shot_splits, pretrained_model

QUIET = ["progress=false", "log_every=1"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """One short pretraining run per micro preset on the 2-class toy task (4 steps each)."""
    root = tmp_path_factory.mktemp("pre")
    runs = {}
    for name in ("nac_micro", "perceiver_io_micro", "vit_micro"):
        train(load_config(None, [f"out_dir={root / name}", f"model.name={name}", "data.task=toy_sets",
                                 "data.batch_size=16", "epochs=1", *QUIET]))
        runs[name] = root / name
    return runs


def finetune_cfg(run, out, *extra):
    return load_config(None, [f"out_dir={out}", "model.name=x", "data.task=toy_classes", f"finetune.init={run}",
                              "finetune.new_task=true", "data.few_shot.shots=3", "data.few_shot.ways=4",
                              "data.batch_size=12", "epochs=2", "optim.name=radam", "optim.lr=0.01",
                              "optim.weight_decay=0.05", *QUIET, *extra])


@pytest.mark.parametrize("name,sets", [("nac_micro", "head"), ("perceiver_io_micro", "head"),
                                       ("nac_micro", "readout"), ("vit_micro", "cls")])
def test_frozen_parameters_stay_bit_identical_and_trainable_ones_change(pretrained, tmp_path, name, sets):
    # 6 steps: RAdam's first 5 updates are lr·(momentum of the gradient), which rounds away on a weight
    # whose gradient is ~1e-6 at initialisation (a NAC's read-out query LayerNorm); from the 6th it adapts
    cfg = finetune_cfg(pretrained[name], tmp_path / "ft", f"finetune.train=[{sets}]", "epochs=6")
    torch.manual_seed(cfg.seed)                       # the trainer's draw of the new head
    start = pretrained_model(cfg, describe_task("toy_classes")).state_dict()
    before = from_pretrained(pretrained[name] / "checkpoints" / "last").state_dict()
    result = train(cfg)
    after = result["model"].state_dict()
    prefixes = result["model"].parameter_sets()[sets]
    trained = [k for k in after if k.startswith(prefixes)]
    assert trained and len(trained) < len(after)
    for k, v in after.items():
        if k.startswith(prefixes):
            assert not torch.equal(v, start[k]), f"{k} did not train"
        else:
            assert torch.equal(v, before[k]), f"{k} is frozen but changed"
    assert result["model"].eval()(torch.randn(2, 6, 8)).shape == (2, 4)   # 4-way: new task outputs
    state = torch.load(tmp_path / "ft" / "checkpoints" / "last" / "state.pt", weights_only=True)
    in_optimizer = sum(len(g["params"]) for g in state["optimizer"]["param_groups"])
    assert in_optimizer == sum(p.requires_grad for p in result["model"].parameters()) == len(trained)


def test_few_shot_indices_are_k_per_class_n_classes_and_seeded():
    labels = torch.arange(60) % 6                                     # 10 samples of each of 6 classes
    draws = {}
    for seed in range(5):
        idx, classes = few_shot_indices(labels, shots=3, ways=4, seed=seed)
        assert (idx, classes) == few_shot_indices(labels, shots=3, ways=4, seed=seed)   # deterministic
        assert len(classes) == 4 and classes == sorted(set(classes))
        picked = labels[idx]
        assert sorted(set(picked.tolist())) == classes
        assert all((picked == c).sum() == 3 for c in classes) and len(set(idx)) == 12
        draws[seed] = (tuple(idx), tuple(classes))
    assert len(set(draws.values())) == 5                              # each seed its own subset
    assert len({c for _, c in draws.values()}) > 1                    # and its own classes
    idx, classes = few_shot_indices(labels, shots=0, ways=0, seed=0)  # off: everything, unchanged
    assert idx == list(range(60)) and classes == list(range(6))


def test_few_shot_splits_renumber_labels_and_cut_validation_to_the_same_classes(tmp_path):
    cfg = load_config(None, ["data.task=toy_classes", "data.few_shot.shots=2", "data.few_shot.ways=3", "seed=7"])
    train_raw, val_raw = build_dataset("toy_classes", "train"), build_dataset("toy_classes", "val")
    train_set, val_set = few_shot_splits(cfg, describe_task("toy_classes"), train_raw, val_raw)
    classes = train_set.class_ids
    assert len(train_set) == 6 and len(classes) == 3
    assert train_set.classes == val_set.classes == [str(c) for c in classes]   # toy_classes names none
    for subset, raw in ((train_set, train_raw), (val_set, val_raw)):
        for i in range(len(subset)):
            x, y = subset[i]
            x_raw, y_raw = raw[subset.indices[i]]
            assert torch.equal(x, x_raw) and classes[int(y)] == int(y_raw)   # class classes[j] is now j
    assert sorted(int(val_set[i][1]) for i in range(len(val_set))) == sorted(
        classes.index(int(val_raw[i][1])) for i in range(len(val_raw)) if int(val_raw[i][1]) in classes)
    assert len(val_set) == 30                                         # 10 of each kept class in 60


@pytest.mark.parametrize("name", ["nac_micro", "perceiver_io_micro"])
def test_new_task_replaces_the_head_and_the_saved_model_loads_back(tmp_path, name):
    torch.manual_seed(0)
    model = create_model(name)
    old_head = model.read_out.head.weight.clone()
    body = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("read_out.head.")}
    model.new_task(7)
    assert model.read_out.head.weight.shape == (7, old_head.shape[1]) and model.config.num_classes == 7
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in body.items())      # the rest untouched
    x = torch.randn(3, 6, 8)
    assert model(x).shape == (3, 7)
    loaded = from_pretrained(model.save_pretrained(tmp_path / "m"))
    assert loaded.config.num_classes == 7
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="gives heads=3 predictions per sample"):
        model.new_task(1, heads=3)


def test_summary_mean_and_sample_std():
    s = summarize({0: 0.5, 1: 0.7, 2: 0.9})
    assert s["n"] == 3 and s["mean"] == pytest.approx(0.7) and s["std"] == pytest.approx(0.2)
    assert summarize({3: 0.25}) == {"n": 1, "mean": 0.25, "std": None}


def test_cli_runs_seeds_and_an_interrupted_sweep_resumes_skipping_finished_seeds(pretrained, tmp_path, monkeypatch,
                                                                                capsys):
    from modwire.training import supervised, trainer

    real_step, real_train = supervised.optimizer_step, trainer.train

    def step_then_term(run, state, *rest):                            # SIGTERM in seed 1's first step
        real_step(run, state, *rest)
        if run.cfg.seed == 1 and state.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(supervised, "optimizer_step", step_then_term)
    out = tmp_path / "ft"
    args = ["finetune", str(pretrained["nac_micro"]), "--task", "toy_classes", "--shots", "3", "--ways", "4",
            "--seeds", "0,1,2", "--epochs", "2", "--train", "head", "--out", str(out), "--set", *QUIET]
    assert cli.main(args) == 143
    assert (out / "seed-0" / "result.json").is_file() and not (out / "seed-1" / "result.json").exists()
    assert not (out / "seed-2").exists()
    monkeypatch.setattr(supervised, "optimizer_step", real_step)
    calls = []
    monkeypatch.setattr(trainer, "train", lambda cfg, resume=False: calls.append((cfg.seed, resume))
                        or real_train(cfg, resume=resume))
    capsys.readouterr()
    assert cli.main(args) == 0
    assert calls == [(1, True), (2, False)]                           # seed 0 skipped, seed 1 resumed
    summary = json.loads((out / "summary.json").read_text())
    finals = {}
    for s in (0, 1, 2):
        vals = [json.loads(l) for l in (out / f"seed-{s}" / "metrics.jsonl").read_text().splitlines()]
        finals[str(s)] = [r["val_top1"] for r in vals if "val_top1" in r][-1]
    assert summary["values"] == finals and summary["metric"] == "top1" and summary["n"] == 3
    assert summary["mean"] == pytest.approx(sum(finals.values()) / 3)
    assert summary["std"] == pytest.approx(torch.tensor(list(finals.values())).std().item())
    assert summary["shots"] == 3 and summary["ways"] == 4 and summary["lr"] == 0.05 and summary["batch_size"] == 12
    assert summary["train"] == ["head"] and summary["seeds"] == [0, 1, 2] and summary["new_task"] is True
    assert summary["init"] == str((pretrained["nac_micro"] / "checkpoints" / "best").resolve())   # pinned
    cfg = load_config(str(out / "seed-1" / "config.yaml"))
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps) == ("radam", 0.05, 0.05, 0)
    table = capsys.readouterr().out
    assert "mean" in table and f"{summary['mean']:.4f} ± {summary['std']:.4f}" in table
    # `modwire eval` scores a few-shot seed on its own classes, renumbered as in training
    best = json.loads((out / "seed-1" / "result.json").read_text())["best"]
    assert cli.main(["eval", str(out / "seed-1")]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["samples"] == 40 and scored["top1"] == pytest.approx(best["top1"])


# Every classifier-like micro preset; a GAN (NFM §4.1) has no labels to fine-tune on: its generator is trained
# by `modwire train` as GANs, not by `modwire finetune`, and its presets have no num_classes.
MICRO = [n for n in modwire.list_models() if n.endswith("_micro") and "gan_" not in n]


@pytest.mark.parametrize("name", MICRO)
def test_every_micro_preset_keeps_the_fine_tuning_protocol(tmp_path, name):
    """parameter_sets: "all" is every parameter and each set names at least one; new_task(3)
    round-trips through save_pretrained / from_pretrained."""
    model = create_model(name)
    sets = model.parameter_sets()
    names = [n for n, _ in model.named_parameters()]
    assert sets["all"] == ("",)
    for set_name, prefixes in sets.items():
        assert any(n.startswith(prefixes) for n in names), f"{set_name} names no parameter"
    model.new_task(3)
    assert model.config.num_classes == 3
    loaded = from_pretrained(model.save_pretrained(tmp_path / "m"))
    assert loaded.config == model.config
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())


def test_labels_come_from_a_kept_label_attribute_also_under_max_samples():
    from modwire.tasks.base import FirstN
    from modwire.training.finetune_setup import dataset_labels

    class Kept(toy_fewshot.ToyClasses):
        def __init__(self):
            super().__init__("train")
            self.labels = torch.arange(60) % 6

        def __getitem__(self, i):
            raise AssertionError("labels are read from .labels, not item by item")

    assert torch.equal(dataset_labels(Kept(), "train"), torch.arange(60) % 6)
    assert torch.equal(dataset_labels(FirstN(Kept(), 9), "train"), torch.arange(9) % 6)
    assert torch.equal(dataset_labels(build_dataset("toy_classes", "train"), "train"), torch.arange(60) % 6)


def test_an_interrupted_fine_tuning_run_resumes_to_the_same_weights(pretrained, tmp_path, monkeypatch):
    from training_helpers import signal_after_step

    extra = ["finetune.train=[readout]", "epochs=3", "checkpoint_every=1", "data.few_shot.shots=4",
             "data.batch_size=8", "seed=3"]
    full = train(finetune_cfg(pretrained["nac_micro"], tmp_path / "a", *extra))["model"]
    signal_after_step(monkeypatch, 3, signal.SIGTERM)          # mid-epoch (2 steps each)
    stopped = train(finetune_cfg(pretrained["nac_micro"], tmp_path / "b", *extra))
    assert stopped["status"] == "interrupted" and stopped["step"] == 3
    monkeypatch.undo()
    resumed = train(finetune_cfg(pretrained["nac_micro"], tmp_path / "b", *extra), resume=True)
    assert resumed["step"] == full_steps(tmp_path / "a") and resumed["step"] == 6
    for k, v in full.state_dict().items():
        assert torch.equal(v, resumed["model"].state_dict()[k]), k


def full_steps(run):
    return torch.load(run / "checkpoints" / "last" / "state.pt", weights_only=True)["step"]
