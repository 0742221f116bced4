"""Issue 25, item 7: ``data.num_workers`` defaults to ``"auto"`` (loader processes sized to the machine),
``compile`` takes a ``torch.compile`` mode, and loader workers change no data: a run with workers
ends with the weights of one without, bit for bit, resumed or not.

The runs compared bit for bit compute on the CPU (``device=cpu``) on every machine: what they check is
the data, and on CUDA two runs of the same data are bit-identical only where every kernel is
deterministic, which torch does not promise by default (the documentation of
``torch.use_deterministic_algorithms`` lists CUDA convolutions among the ops that are not). The CUDA
data path (pinned memory, asynchronous copies) is checked batch by batch where CUDA is present, and a
CUDA machine's worker count (one CPU reserved, not two) is simulated on the CPU. (Issue 39: on a GPU
machine these runs took the CUDA device, and the header check expected a CPU run's worker count.)"""
import json

import pytest
import torch

import modwire.training.config as training_config
from modwire.tasks import build_dataset, get_task
from modwire.tasks.augment import AugmentedDataset
from modwire.training import load_config, make_loader, train
from modwire.training.config import resolve_num_workers
from modwire.training.precision import compile_mode
from modwire.training.runtime import PREFETCH_FACTOR, to_device

import toy_task  # noqa: F401  (registers "toy_sets")
from training_helpers import signal_after_step

assert toy_task.ToySets                                   # the task the runs below train on


@pytest.fixture
def machine_auto_workers(monkeypatch):
    """``"auto"`` as on a 3-CPU machine (1 worker for a CPU run): tests/conftest.py resolves it to 0."""
    monkeypatch.setattr(training_config, "MAX_AUTO_WORKERS", 4)
    monkeypatch.setattr(training_config.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_num_workers_defaults_to_auto_and_takes_integers():
    assert load_config().data.num_workers == "auto"
    assert load_config(None, ["data.num_workers=3"]).data.num_workers == 3
    assert load_config(None, ["data.num_workers=0"]).data.num_workers == 0


@pytest.mark.parametrize("value,shown", [("-1", "-1"), ("many", "'many'"), ("1.5", "1.5"), ("true", "True"),
                                         ("Auto", "'Auto'")])
def test_bad_num_workers_names_the_key_what_is_expected_and_what_was_given(value, shown):
    with pytest.raises(ValueError) as info:
        load_config(None, [f"data.num_workers={value}"])
    msg = str(info.value)
    assert msg.startswith(f"config key 'data.num_workers': got {shown}, expected 'auto' or an integer >= 0"), msg


def test_auto_workers_follow_the_cpus_the_processes_sharing_them_and_the_device(monkeypatch):
    monkeypatch.setattr(training_config, "MAX_AUTO_WORKERS", 4)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cuda = torch.device("cuda")
    # (CPUs, processes on the machine, device, workers): a CPU run keeps 2 CPUs for its own threads
    for cpus, local, device, expected in [(1, 1, None, 0), (2, 1, None, 0), (2, 1, "cpu", 0), (3, 1, None, 1),
                                          (2, 1, cuda, 1), (4, 1, cuda, 3), (16, 1, None, 4), (16, 1, cuda, 4),
                                          (16, 4, cuda, 3), (16, 4, None, 2), (16, 8, cuda, 1), (2, 2, cuda, 0)]:
        monkeypatch.setattr(training_config.os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)),
                            raising=False)
        assert resolve_num_workers("auto", local, device) == expected, (cpus, local, device)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")                   # torchrun's processes on this machine
    assert resolve_num_workers("auto", device=cuda) == 0          # 2 CPUs (the last affinity above)
    monkeypatch.setattr(training_config.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert resolve_num_workers("auto", device=cuda) == 3
    assert resolve_num_workers(2) == 2 and resolve_num_workers(0) == 0


def test_loader_workers_persist_prefetch_and_pin_for_cuda(machine_auto_workers):
    info = get_task("triangle")
    ds = build_dataset("triangle", "train", size=8)
    plain = make_loader(ds, 4, None, info, 0, drop_last=False)
    assert plain.num_workers == 0 and not plain.persistent_workers and not plain.pin_memory
    auto = make_loader(ds, 4, None, info, "auto", drop_last=False, device=torch.device("cpu"))
    assert auto.num_workers == 1 and auto.persistent_workers and auto.prefetch_factor == PREFETCH_FACTOR
    assert not auto.pin_memory
    assert make_loader(ds, 4, None, info, 2, drop_last=False, device=torch.device("cuda")).pin_memory
    # a dataset that draws by epoch: workers restart each epoch (they copy the epoch set before they start)
    augmented = AugmentedDataset(ds, lambda x, g: x, seed=0)
    assert not make_loader(augmented, 4, None, info, 2, drop_last=False).persistent_workers


def test_to_device_keeps_a_cpu_batch():
    x, y = torch.ones(2, 3), {"x": torch.zeros(2), "task": torch.ones(2, dtype=torch.long)}
    assert to_device(x, torch.device("cpu")) is x
    assert all(a is b for a, b in zip(to_device(y, torch.device("cpu")).values(), y.values()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory and asynchronous copies need CUDA")
def test_cuda_batches_through_pinned_workers_and_asynchronous_copies_equal_the_main_process():
    # what a CUDA run's loader gives: batches pinned in 2 workers, each copied without waiting and
    # dropped at once (no synchronisation until the end), equal to the batches loaded in this process
    info, cuda = get_task("triangle"), torch.device("cuda")
    ds = build_dataset("triangle", "train", size=24)
    loader = make_loader(ds, 4, None, info, 2, drop_last=False, device=cuda)
    assert loader.pin_memory and loader.num_workers == 2
    copied = []
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        copied.append((to_device(x, cuda), to_device(y, cuda)))
    expected = list(make_loader(ds, 4, None, info, 0, drop_last=False))
    assert len(copied) == len(expected) == 6
    for (x, y), (x0, y0) in zip(copied, expected):
        assert x.device.type == "cuda" and torch.equal(x.cpu(), x0) and torch.equal(y.cpu(), y0)


def test_compile_takes_a_mode_and_refuses_others():
    assert compile_mode(False) is None and compile_mode(True) == "default"
    for mode in ("default", "reduce-overhead", "max-autotune"):
        assert load_config(None, [f"compile={mode}"]).compile == mode and compile_mode(mode) == mode
    assert load_config(None, ["compile=true"]).compile is True          # recorded as given
    for bad, shown in (("fast", "'fast'"), ("1", "1"), ("[default]", "['default']")):
        with pytest.raises(ValueError, match=rf"^config key 'compile': got {__import__('re').escape(shown)}, "
                                             rf"expected one of \[False, True, 'default', 'reduce-overhead'"):
            load_config(None, [f"compile={bad}"])


def _toy(out, workers, *extra):
    return load_config(None, [f"out_dir={out}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                              "progress=false", f"data.num_workers={workers}", "device=cpu", *extra])


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_run_with_auto_workers_equals_one_without_and_records_auto(tmp_path, machine_auto_workers, monkeypatch,
                                                                   capsys):
    plain = train(_toy(tmp_path / "w0", 0, "epochs=2"))["model"].state_dict()
    real = training_config.resolve_num_workers
    # "auto" on 3 CPUs: 1 worker for a CPU run; 2 on a CUDA machine, simulated: the loaders sized as for
    # a CUDA device (one CPU reserved), the model on the CPU (issue 39: the GPU machine's header said 2)
    for sized_for, shown in (("cpu", "1 data worker (auto)"), ("cuda", "2 data workers (auto)")):
        monkeypatch.setattr(training_config, "resolve_num_workers",
                            lambda value, local_world=None, device=None, d=torch.device(sized_for):
                            real(value, local_world, d))
        capsys.readouterr()
        auto = train(_toy(tmp_path / sized_for, "auto", "epochs=2"))
        assert shown in capsys.readouterr().err                    # the header shows the resolved count
        _same(plain, auto["model"].state_dict())
        assert "num_workers: auto" in (tmp_path / sized_for / "config.yaml").read_text()   # what was given
        losses = [[json.loads(line).get("loss") for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
                  for d in ("w0", sized_for)]
        assert losses[0] == losses[1]


def test_a_run_with_workers_resumed_mid_epoch_equals_one_uninterrupted_without(tmp_path, monkeypatch,
                                                                               machine_auto_workers):
    full = train(_toy(tmp_path / "a", 0, "epochs=2", "checkpoint_every=3"))["model"].state_dict()
    signal_after_step(monkeypatch, 5)
    stopped = train(_toy(tmp_path / "b", "auto", "epochs=2", "checkpoint_every=3"))
    assert stopped["status"] == "interrupted" and stopped["step"] == 5
    monkeypatch.undo()                                              # (the fixture's patches too)
    resumed = train(_toy(tmp_path / "b", 2, "epochs=2", "checkpoint_every=3"), resume=True,
                    allow_change=["data.num_workers"])
    assert resumed["status"] == "finished"
    _same(full, resumed["model"].state_dict())


def test_generated_images_and_augmentation_through_workers_equal_the_main_process(tmp_path, machine_auto_workers):
    # triangle (batched rendering in the workers) with crop-and-flip augmentation (drawn by epoch: the
    # workers restart each epoch), two epochs, 2 workers against none
    common = ["model.name=preact_resnet_micro", "data.task=triangle", "data.params={size: {train: 48, val: 16}}",
              "data.batch_size=16", "epochs=2", "data.augment=crop_flip", "progress=false", "device=cpu"]
    runs = [train(load_config(None, [f"out_dir={tmp_path / str(w)}", f"data.num_workers={w}", *common]))
            for w in (0, 2)]
    _same(runs[0]["model"].state_dict(), runs[1]["model"].state_dict())
    assert runs[0]["val"] == runs[1]["val"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_a_compiled_mode_trains_like_eager_on_the_cpu(tmp_path, mode):
    common = ["model.name=vit_micro", "data.task=toy_sets", "data.batch_size=16", "max_steps=3", "progress=false",
              "data.num_workers=0", "device=cpu"]
    eager = train(load_config(None, [f"out_dir={tmp_path / 'eager'}", *common]))
    compiled = train(load_config(None, [f"out_dir={tmp_path / 'compiled'}", f"compile={mode}", *common]))
    assert compiled["status"] == "finished"
    for a, b in zip(eager["model"].state_dict().values(), compiled["model"].state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert f"compile: {mode}" in (tmp_path / "compiled" / "config.yaml").read_text()


class _OpenLocks(torch.utils.data.Dataset):
    """Items: how many run-directory locks the process that loads them holds open."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        import os
        held = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                held += os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == ".lock"
            except OSError:
                pass
        return torch.tensor(held)


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/fd"), reason="Linux /proc")
def test_loader_workers_do_not_hold_the_run_lock(tmp_path):
    # a SIGKILLed run's workers outlive it for seconds: their inherited copy would keep the run locked
    from types import SimpleNamespace

    from modwire.training.lock import RunLock, RunLockedError

    with RunLock(tmp_path):
        loader = make_loader(_OpenLocks(), 2, None, SimpleNamespace(collate=None), 1, drop_last=False)
        assert next(iter(loader)).tolist() == [0, 0]
        assert _OpenLocks()[0].item() == 1                 # the training process keeps its lock
        with pytest.raises(RunLockedError):
            RunLock(tmp_path).acquire()
