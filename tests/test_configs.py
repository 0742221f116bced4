"""Every shipped config parses, names a real model and task, and builds its model."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from modwire import cli
from modwire.tasks import get_task
from modwire.training import build_model_for_task, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml")
                 if "gan" not in p.relative_to(ROOT / "configs").parts)   # GAN runs: tests/training/test_gan_training.py


def test_there_are_paper_and_cpu_configs():
    names = {p.relative_to(ROOT / "configs").as_posix() for p in CONFIGS}
    assert {"nac_tiny_imagenet.yaml", "perceiver_io_tiny_imagenet.yaml", "cpu/nac_tiny_imagenet.yaml",
            "cpu/nac_listops.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_config_builds_its_model(path):
    cfg = load_config(str(path))
    model = build_model_for_task(cfg)
    assert model.num_classes == get_task(cfg.data.task).num_classes


def test_table4_config_matches_the_table():
    cfg = load_config(str(ROOT / "configs" / "nac_tiny_imagenet.yaml"))
    assert cfg.model.name == "nac_tiny_imagenet" and cfg.data.batch_size == 1024 and cfg.epochs == 400
    assert cfg.optim.name == "adamw" and cfg.optim.weight_decay == 0.05
    assert cfg.optim.lr == pytest.approx(3e-4 * 1024 / 512) and cfg.optim.min_lr == pytest.approx(1e-5 * 2)
    assert cfg.optim.warmup_steps == 25 * (100_000 // 1024)


def test_train_a_cpu_config_then_eval_reproduces_its_metric(tmp_path, capsys):
    path = ROOT / "configs" / "cpu" / "nac_listops.yaml"
    assert cli.main(["train", str(path), "--set", f"out_dir={tmp_path}", "max_steps=3", "progress=false",
                     "data.params.size={train: 192, val: 32, test: 32}"]) == 0
    reported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert reported["status"] == "finished" and reported["step"] == 3
    assert cli.main(["eval", str(tmp_path)]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["top1"] == pytest.approx(reported["val"]["top1"]) and again["loss"] == pytest.approx(reported["val"]["loss"])


def test_cpu_listops_configs_use_each_models_learning_rate():
    """experiments/table1_ladder.py: at Perceiver IO's lr the NAC never leaves the label-prior
    plateau on short ListOps (its MLP-generated initial states take ~56x larger relative Adam
    steps than free latents, tests/models/test_nac.py); each config holds its model's best."""
    nac = load_config(str(ROOT / "configs" / "cpu" / "nac_listops.yaml"))
    pio = load_config(str(ROOT / "configs" / "cpu" / "perceiver_io_listops.yaml"))
    assert nac.model.name == "nac_small" and pio.model.name == "perceiver_io_small"
    assert (nac.optim.lr, nac.optim.warmup_steps) == (5e-4, 200) and (pio.optim.lr, pio.optim.warmup_steps) == (1e-3, 50)
    assert nac.data.params == pio.data.params and nac.max_steps == pio.max_steps


def test_ni_cpu_config_trains_evaluates_and_finetunes(tmp_path, capsys):
    """NI Table 1's protocol end to end at toy size: train on the 20 functions, eval, then new CLS
    tokens for the 10 held-out ones trained alone (`--train cls`): the other weights stay put."""
    run = tmp_path / "ni"
    size = "data.params.size={train: 64, val: 32}"
    assert cli.main(["train", str(ROOT / "configs" / "cpu" / "ni_fuzzy_boolean.yaml"), "--set", f"out_dir={run}",
                     "max_steps=2", "progress=false", "data.batch_size=32", size]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli.main(["eval", str(run)]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["r2"] == pytest.approx(trained["val"]["r2"]) and "r2_std" in again
    out = tmp_path / "ft"
    assert cli.main(["finetune", str(run), "--task", "fuzzy_boolean_adapt", "--train", "cls", "--seeds", "0",
                     "--epochs", "1", "--batch-size", "32", "--out", str(out), "--set", size, "progress=false"]) == 0
    import modwire
    from modwire.training.checkpoint import choose_checkpoint

    before = modwire.from_pretrained(choose_checkpoint(run)[0])
    after = modwire.from_pretrained(choose_checkpoint(out / "seed-0")[0])
    assert after.config.num_cls_tokens == 10 and before.config.num_cls_tokens == 20
    b, a = before.state_dict(), after.state_dict()
    assert set(a) == set(b) and a["cls_tokens"].shape == (10, b["cls_tokens"].shape[1])
    assert all(torch.equal(a[k], b[k]) for k in a if not k.startswith(("cls_tokens", "heads.")))


# ----------------------------------------------------------------------------- Associative Transformer (AiT)

AIT_TASKS = ("cifar10", "cifar100", "triangle", "pet", "sort_of_clevr")
# task -> (data.task, batch, epochs, warm-up epochs, training samples, data.augment): AiT §5.1, App. A.1, Table 6
AIT_RUNS = {"cifar10": ("cifar10", 512, 100, 5, 50_000, "crop_flip"),
            "cifar100": ("cifar100", 512, 100, 5, 50_000, "crop_flip"),
            "triangle": ("triangle", 512, 100, 5, None, False),
            "pet": ("oxford_pet", 128, 300, 15, 3_680, "resized_crop_flip"),
            "sort_of_clevr": ("sort_of_clevr_image", 64, 100, 5, None, False)}


def _train_size(task: str) -> int:
    from modwire.tasks import build_dataset
    return len(build_dataset(task, "train"))          # generators: the default split (triangle 50k, 9,800 x 20)


@pytest.mark.parametrize("task", AIT_TASKS)
def test_ait_paper_configs_follow_table_6_and_differ_from_the_vit_only_by_the_workspace(task):
    from modwire.training.config import to_yaml
    data_task, batch, epochs, warm, n, augment = AIT_RUNS[task]
    vit = load_config(str(ROOT / "configs" / f"vit_small_{task}.yaml"))
    ait = load_config(str(ROOT / "configs" / f"ait_small_{task}.yaml"))
    assert (vit.model.name, ait.model.name) == (f"vit_small_{task}", f"ait_small_{task}")
    assert (vit.data.task, vit.data.batch_size, vit.epochs, vit.data.augment) == (data_task, batch, epochs, augment)
    o = vit.optim
    assert (o.name, o.betas, o.weight_decay, o.lr, o.min_lr) == ("adamw", [0.9, 0.999], 0.01, 1e-4, 1e-6)
    steps_per_epoch = (n or _train_size(data_task)) // batch
    assert o.warmup_steps == warm * steps_per_epoch and o.decay_steps == 0          # cosine over the whole run
    assert vit.data.val_split == "test" and vit.aux_loss_weights == {}
    assert ait.aux_loss_weights == {"balance": 0.01}
    same = lambda c: to_yaml(dataclasses.replace(c, model=dataclasses.replace(c.model, name="-"), out_dir="-",  # noqa: E731
                                                  aux_loss_weights={}))
    assert same(ait) == same(vit)


CPU_AIT = ("triangle", "sort_of_clevr", "cifar10", "pet")


@pytest.mark.parametrize("task", CPU_AIT)
def test_cpu_ait_configs_are_their_vit_config_plus_the_workspace(task):
    from modwire.training.config import to_yaml
    vit = load_config(str(ROOT / "configs" / "cpu" / f"vit_{task}.yaml"))
    ait = load_config(str(ROOT / "configs" / "cpu" / f"ait_{task}.yaml"))
    assert ait.model.name == vit.model.name.replace("vit_", "ait_") and ait.aux_loss_weights == {"balance": 0.01}
    extra = {k: v for k, v in ait.model.overrides.items() if k not in vit.model.overrides}
    assert {k: ait.model.overrides[k] for k in vit.model.overrides} == dict(vit.model.overrides)
    assert set(extra) <= {"bottleneck_size"}
    strip = lambda c: to_yaml(dataclasses.replace(c, model=dataclasses.replace(c.model, name="-", overrides={}),  # noqa: E731
                                                   out_dir="-", aux_loss_weights={}))
    assert strip(ait) == strip(vit)
    assert vit.optim.weight_decay == 0.01 and vit.data.val_split == "test"


def test_ait_configs_build_the_app_a1_augmentation():
    """CIFAR: padded random crop + flip + normalise; Pet: random resized crop + flip + normalise; evaluation
    normalised alike (AiT App. A.1)."""
    from modwire.tasks import augment as A
    from modwire.tasks import describe_task
    from modwire.training import apply_augmentation

    for name, crop in (("vit_small_cifar10", A.RandomCrop), ("vit_small_pet", A.RandomResizedCrop)):
        cfg = load_config(str(ROOT / "configs" / f"{name}.yaml"))
        size = describe_task(cfg.data.task, cfg.data.params).inputs.height
        items = [(torch.rand(3, size, size), torch.tensor(0))]
        train_set, val_set, mixer = apply_augmentation(cfg, get_task(cfg.data.task), items, items)
        steps = train_set.transform.transforms
        assert [type(t) for t in steps] == [A.ToFloat, crop, A.RandomHorizontalFlip, A.Normalize] and mixer is None
        assert steps[1].size == (size, size) and (crop is A.RandomResizedCrop or steps[1].padding == 4)
        x = items[0][0]
        torch.testing.assert_close(val_set[0][0], A.Normalize()(x))           # evaluation: normalisation only


@pytest.mark.parametrize("name", ["vit_sort_of_clevr", "ait_sort_of_clevr", "vit_triangle", "ait_triangle"])
def test_cpu_ait_and_vit_configs_train_and_log_what_the_paper_reports(name, tmp_path, capsys):
    size = "{train: 8, val: 2, test: 2}" if "clevr" in name else "{train: 64, val: 16, test: 16}"
    assert cli.main(["train", str(ROOT / "configs" / "cpu" / f"{name}.yaml"), "--set", f"out_dir={tmp_path}",
                     "max_steps=2", "progress=false", "log_every=1", "data.batch_size=16",
                     f"data.params.size={size}"]) == 0
    val = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["val"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = set().union(*records)
    assert ("aux/balance" in logged) == name.startswith("ait_")                # AiT Eq. 5-6, logged by name
    if "clevr" in name:                                                         # AiT Table 4's two columns
        assert val["top1"] == pytest.approx((val["top1_relational"] + val["top1_non_relational"]) / 2)
