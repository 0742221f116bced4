"""Issue 38 items 4-5: a researcher's own augmentation (``data.augment`` by import path), modwire's
transforms as one-argument ``transform=``, ``dataset.classes``, and the loggers (``loggers``)."""
import csv
import json
import random
import signal
import time

import numpy as np
import pytest
import torch

import toy_plugins
import toy_task  # noqa: F401  (registers "toy_sets")
from training_helpers import signal_after_step
from modwire.errors import UserError
from modwire.tasks import TaskInfo, InputSpec, build_dataset, describe_task
from modwire.tasks import augment as A
from modwire.training import apply_augmentation, load_config, train

TRIANGLE = ["model.name=preact_resnet_micro", "data.task=triangle", "data.params={size: {train: 32, val: 16}}",
            "data.batch_size=16", "progress=false", "log_every=1"]


# ----------------------------------------------------------------------------- data.augment by import path

@pytest.mark.parametrize("value, match", [
    ("no_such_package.transforms:make", r"config key 'data.augment': got 'no_such_package.transforms:make', but "
                                        r"module 'no_such_package.transforms' does not import \(ModuleNotFoundError"),
    ("toy_plugins:no_such_factory", r"config key 'data.augment': .* has no attribute 'no_such_factory'"),
    ("toy_plugins:NOT_CALLABLE", r"config key 'data.augment': got 'toy_plugins:NOT_CALLABLE', which names a int, "
                                 r"expected an import path 'package.module:attribute' naming a callable"),
    ("toy_plugins:a:b", r"config key 'data.augment': got 'toy_plugins:a:b', expected one of \[False, True, 'deit', "
                        r"'randaugment', 'crop_flip', 'resized_crop_flip'\] or an import path"),
])
def test_an_import_path_is_checked_when_the_config_is_read_naming_the_key(value, match):
    with pytest.raises(UserError, match=match):
        load_config(None, [f"data.augment={value}"])


def test_reading_the_config_imports_the_factory_but_never_calls_it():
    toy_plugins.CALLS.clear()
    cfg = load_config(None, ["data.augment=toy_plugins:shift_and_noise"])
    assert cfg.data.augment == "toy_plugins:shift_and_noise" and toy_plugins.CALLS == []


def test_a_factory_is_called_once_with_the_tasks_image_size_and_channels_and_draws_by_seed_epoch_index():
    toy_plugins.CALLS.clear()
    cfg = load_config(None, [*TRIANGLE, "data.augment=toy_plugins:shift_and_noise", "seed=3"])
    raw = build_dataset("triangle", "train", size={"train": 8})
    train_set, val_set, _ = apply_augmentation(cfg, describe_task("triangle"), raw, raw)
    assert toy_plugins.CALLS == [((64, 64), 1)] and val_set is raw          # evaluation untouched
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    first = [train_set[i][0] for i in range(4)]
    torch.manual_seed(123), random.seed(5), np.random.seed(7)                 # whatever the process drew before
    assert all(torch.equal(train_set[i][0], first[i]) for i in range(4))     # a function of (seed, epoch, index)
    torch.set_rng_state(states[0]), random.setstate(states[1])
    train_set[0]
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]   # restored after
    assert not torch.equal(first[0], raw[0][0])                               # it did augment
    assert not torch.equal(first[0], first[2]) or not torch.equal(first[1], first[3])
    train_set.set_epoch(1)
    assert not all(torch.equal(train_set[i][0], first[i]) for i in range(4))  # another epoch, other draws


def test_a_factory_may_return_train_and_eval_transforms_and_an_object_is_used_as_it_is():
    raw = build_dataset("triangle", "train", size={"train": 4})
    cfg = load_config(None, [*TRIANGLE, "data.augment=toy_plugins:train_and_eval"])
    train_set, val_set, _ = apply_augmentation(cfg, describe_task("triangle"), raw, raw)
    assert torch.equal(train_set[0][0], raw[0][0] + 1) and torch.equal(val_set[0][0], raw[0][0] + 1)
    cfg = load_config(None, [*TRIANGLE, "data.augment=toy_plugins:FLIP"])
    train_set, val_set, _ = apply_augmentation(cfg, describe_task("triangle"), raw, raw)
    assert isinstance(train_set.transform, A.SeededGlobalRNG) and train_set.transform.fn is toy_plugins.FLIP
    assert val_set is raw


def test_a_factory_that_does_not_take_the_keywords_is_refused_saying_how_it_is_called():
    cfg = load_config(None, [*TRIANGLE, "data.augment=toy_plugins:needs_other_arguments"])
    with pytest.raises(UserError, match=r"config key 'data.augment': 'toy_plugins:needs_other_arguments' names a "
                                        r"function, which is called as a factory, needs_other_arguments\("
                                        r"image_size=\(64, 64\), channels=1\), and it raised TypeError"):
        apply_augmentation(cfg, describe_task("triangle"), [], [])


def test_an_import_path_augmentation_resumes_exactly(tmp_path, monkeypatch):
    common = [*TRIANGLE, "epochs=2", "checkpoint_every=2", "data.augment=toy_plugins:shift_and_noise"]
    full = train(load_config(None, [f"out_dir={tmp_path / 'a'}", *common]))["model"]
    signal_after_step(monkeypatch, 3, signal.SIGTERM)                         # mid-way through epoch 2
    stopped = train(load_config(None, [f"out_dir={tmp_path / 'b'}", *common]))
    assert stopped["status"] == "interrupted" and stopped["step"] == 3
    monkeypatch.undo()
    torch.manual_seed(99), random.seed(99), np.random.seed(99)               # the resuming process's own state
    resumed = train(load_config(None, [f"out_dir={tmp_path / 'b'}", *common]), resume=True)
    assert resumed["step"] == 4
    for (name, a), b in zip(full.state_dict().items(), resumed["model"].state_dict().values()):
        assert torch.equal(a, b), name


# ----------------------------------------------------------------------------- modwire's transforms, one argument

def test_modwire_pipelines_are_a_loaders_one_argument_transform():
    ds = build_dataset("digits", "train", transform=A.crop_flip_transform(32, mean=(0.5,), std=(0.5,)))
    torch.manual_seed(0)
    x = [ds[i][0] for i in range(4)]
    torch.manual_seed(0)
    assert all(torch.equal(ds[i][0], x[i]) for i in range(4))               # torch.manual_seed replays it
    assert x[0].shape == (1, 32, 32) and x[0].min() < 0                     # normalised
    g = torch.Generator().manual_seed(0)
    plain = build_dataset("digits", "train")
    assert torch.equal(A.crop_flip_transform(32, mean=(0.5,), std=(0.5,))(plain[0][0], g), x[0])


# ----------------------------------------------------------------------------- dataset.classes

@pytest.mark.parametrize("task, params, names", [
    ("triangle", {"size": {"train": 4}}, ["equilateral", "random"]),
    ("sort_of_clevr", {"size": {"train": 4}}, ["yes", "no", "rectangle", "circle", "1", "2", "3", "4", "5", "6"]),
    ("digits", {}, [str(d) for d in range(10)]),
    ("digits_multitask_offline", {"size": {"train": 4}}, [str(d) for d in range(10)]),
    ("toy_sets", {}, ["0", "1"]),                                              # names unknown: the labels
])
def test_every_classification_dataset_has_classes_through_every_wrapper(task, params, names):
    ds = build_dataset(task, "train", **params)
    assert ds.classes == names
    assert build_dataset(task, "train", max_samples=2, **params).classes == names    # data.max_samples' subset
    assert A.AugmentedDataset(ds, lambda x, g: x).classes == names


def test_tasks_that_name_their_classes_give_one_name_per_class():
    from modwire.tasks import get_task, list_tasks
    named = [get_task(n) for n in list_tasks() if get_task(n).class_names is not None]
    assert {i.name for i in named} >= {"cifar10", "fashion_mnist", "kmnist", "mnist", "svhn", "imdb_bytes"}
    assert all(len(i.class_names) == i.num_classes for i in named)
    assert get_task("fashion_mnist").class_names[9] == "Ankle boot" and get_task("cifar10").class_names[0] == "airplane"
    with pytest.raises(UserError, match="class_names has 1 names for 2 classes"):
        TaskInfo("bad", "generator", "", 2, InputSpec.vectors(2, 2), class_names=("a",))
    assert not hasattr(build_dataset("fuzzy_boolean", "train", size={"train": 2}), "classes")   # regression


# ----------------------------------------------------------------------------- loggers

def _toy(out, *extra):
    return load_config(None, [f"out_dir={out}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                              "epochs=2", "progress=false", "log_every=1", *extra])


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("value, match", [
    ("[jsonl]", r"config key 'loggers\[0\]': got 'jsonl', expected one of \['csv', 'tensorboard', 'mlflow', "
                r"'wandb'\] or an import path .*metrics.jsonl is always written"),
    ("[csv, csv]", r"config key 'loggers': \['csv'\] named more than once"),
    ("[toy_plugins:Missing]", r"config key 'loggers\[0\]': .* has no attribute 'Missing'"),
])
def test_loggers_are_checked_when_the_config_is_read(value, match):
    with pytest.raises(UserError, match=match):
        load_config(None, [f"loggers={value}"])


def test_csv_and_a_users_logger_get_every_jsonl_record_and_resume_drops_the_later_ones(tmp_path, monkeypatch):
    extra = ("loggers=[csv, toy_plugins:ListLogger]", "checkpoint_every=3")
    full = tmp_path / "a" / "run"
    train(_toy(full, *extra))
    records = [json.loads(l) for l in (full / "metrics.jsonl").read_text().splitlines()]
    assert toy_plugins.ListLogger.RECORDS[str(full)] == records and str(full) in toy_plugins.ListLogger.CLOSED
    rows = _csv(full / "metrics.csv")
    assert list(rows[0])[:2] == ["step", "epoch"] and len(rows) == len(records) == 4 * 2 + 2
    for row, record in zip(rows, records):
        assert {k: v for k, v in row.items() if v != ""} == {k: str(v) for k, v in record.items()}
    assert float(rows[-1]["val_top1"]) == records[-1]["val_top1"]
    # interrupted at step 5, resumed: the same CSV as the uninterrupted run (the rows after step 5 that a
    # checkpoint at step 3 would replay are dropped), and the user's logger is told where it resumes
    part = tmp_path / "b" / "run"
    signal_after_step(monkeypatch, 5)
    train(_toy(part, *extra))
    monkeypatch.undo()
    (part / "metrics.csv").write_text((part / "metrics.csv").read_text() + "6,2\n")   # a stray later row
    train(_toy(part, *extra), resume=True)
    assert [{k: r[k] for k in ("step", "epoch")} for r in _csv(part / "metrics.csv")] == \
        [{k: r[k] for k in ("step", "epoch")} for r in rows]


def test_a_resume_may_add_a_logger_when_allowed_and_tensorboard_is_written_only_when_asked_for(tmp_path):
    run = tmp_path / "run"
    train(_toy(run, "epochs=1"))
    assert not (run / "tensorboard").exists() and not (run / "metrics.csv").exists()   # only metrics.jsonl
    with pytest.raises(UserError, match=r"loggers"):
        train(_toy(run, "epochs=2", "loggers=[csv]"), resume=True, allow_change=["epochs"])
    train(_toy(run, "epochs=2", "loggers=[csv]"), resume=True, allow_change=["epochs", "loggers"])
    assert [r["step"] for r in _csv(run / "metrics.csv")] == ["5", "6", "7", "8", "8"]   # from the resume on


def test_a_user_logger_factory_must_make_a_logger(tmp_path):
    with pytest.raises(UserError, match=r"'toy_plugins:not_a_logger' made a object, expected a logger with methods "
                                        r"log\(record\) and close\(\)"):
        train(_toy(tmp_path / "run", "loggers=[toy_plugins:not_a_logger]"))


def test_a_logger_whose_package_is_missing_is_refused_before_the_run_naming_the_extra(tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UserError, match=r"'wandb' needs the wandb package, which is not installed: "
                                        r"pip install 'modwire\[wandb\]'"):
        train(_toy(tmp_path / "run", "loggers=[wandb]"))
    assert not (tmp_path / "run").exists()


def test_a_gan_run_logs_to_the_same_loggers(tmp_path):
    from modwire.training.gan_config import GAN_READS
    assert "loggers" in GAN_READS
    cfg = load_config(None, [f"out_dir={tmp_path / 'gan'}", "model.name=gan_resnet_micro", "data.task=digits",
                             "data.params:={size: 16}", "data.max_samples=32", "data.batch_size=8", "max_steps=2",
                             "gan.n_dis=1", "gan.eval.classifier_fid=false", "progress=false", "log_every=1",
                             "loggers=[csv, toy_plugins:ListLogger]"])
    train(cfg)
    records = [json.loads(l) for l in (tmp_path / "gan" / "metrics.jsonl").read_text().splitlines()]
    assert toy_plugins.ListLogger.RECORDS[str(tmp_path / "gan")] == records and len(records) >= 2
    assert [r["step"] for r in _csv(tmp_path / "gan" / "metrics.csv")] == [str(r["step"]) for r in records]


@pytest.mark.slow                                              # 5-11 s each (the trackers start up)
@pytest.mark.parametrize("name", ["tensorboard", "mlflow", "wandb"])
def test_an_installed_tracker_gets_the_runs_numbers_and_a_resume_continues_its_run(tmp_path, monkeypatch, name):
    pytest.importorskip(name)
    run = tmp_path / "run"
    signal_after_step(monkeypatch, 5)
    train(_toy(run, f"loggers=[{name}]", "checkpoint_every=3"))
    monkeypatch.undo()
    train(_toy(run, f"loggers=[{name}]", "checkpoint_every=3"), resume=True)
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(losses) == list(range(1, 9))
    logged = TRACKERS[name](run)
    assert {s: v for s, v in logged.items()} == pytest.approx(losses, rel=1e-6)


def _tensorboard_losses(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("loss")}


def _mlflow_losses(run):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    run_id = (run / "mlflow_run_id").read_text().strip()
    assert client.get_run(run_id).data.params["model.name"] == "nac_micro"
    assert client.get_run(run_id).info.status == "FINISHED"
    return {m.step: m.value for m in client.get_metric_history(run_id, "loss")}   # a resumed step: its last value


def _wandb_records(path):
    """The records of a W&B ``.wandb`` file: a ":W&B" header, then LevelDB log blocks of 32 KiB whose
    records (a 7-byte header: crc32, length, type 1 full / 2 first / 3 middle / 4 last) hold protobufs."""
    import struct
    data, i, block, out, parts = path.read_bytes(), 7, 32768, [], b""
    assert data[:4] == b":W&B"
    while i + 7 <= len(data):
        left = block - i % block
        _, length, kind = struct.unpack("<IHB", data[i:i + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:                                        # a block's padding
            i += left
            continue
        chunk, i = data[i + 7:i + 7 + length], i + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            out.append(parts)
    return out


def _wandb_losses(run):
    from wandb.proto import wandb_internal_pb2
    run_id = (run / "wandb_run_id").read_text().strip()
    files = sorted(run.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 2                                   # the run and its resume, one id
    out = {}
    for f in files:
        for _ in range(300):         # W&B's service may still be writing the file when finish() returns
            records = [wandb_internal_pb2.Record.FromString(data) for data in _wandb_records(f)]
            if any(rec.WhichOneof("record_type") == "exit" for rec in records):
                break
            time.sleep(0.1)
        for rec in records:
            if rec.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                if "loss" in items:
                    out[items["_step"]] = items["loss"]
    return out


TRACKERS = {"tensorboard": _tensorboard_losses, "mlflow": _mlflow_losses, "wandb": _wandb_losses}
