"""GAN training (training/gan.py, gan_config.py, gan_metrics.py) inside the one trainer: exact resume,
files, scores, errors, and the run directory with eval / finetune / resume. Runs the micro preset on
scikit-learn's digits at 16×16 (offline, a few seconds each)."""
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch

from modwire import cli
from modwire.training import gan as gan_training
from modwire.training import load_config, train
from modwire.training.gan import image_grid
from modwire.training.gan_metrics import frechet_distance

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.name=gan_resnet_micro", "data.task=digits", "data.params:={size: 16}", "data.max_samples=96",
        "data.batch_size=8", "gan.n_dis=2", "max_steps=4", "checkpoint_every=2", "log_every=1",
        "gan.eval.classifier_fid=false", "progress=false"]
GAN_CONFIG = ROOT / "configs" / "gan" / "cpu" / "gan_fashion_mnist.yaml"   # Mimicry's optimiser settings


def tiny(out: Path, *extra: str):
    return load_config(str(GAN_CONFIG), [*TINY, "data.max_samples=96", "data.val_split=test", "gan.eval.every=0",
                                         "gan.sample_every=0", f"out_dir={out}", *extra])


def train_gan(cfg, resume=False):
    return train(cfg, resume=resume)


def weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / "last" / "model.safetensors"))


def test_a_run_stopped_by_sigint_and_resumed_ends_with_the_weights_of_an_uninterrupted_run(tmp_path, monkeypatch):
    straight = train_gan(tiny(tmp_path / "a"))
    assert straight["step"] == 4 and straight["exit_code"] == 0
    real_iteration = gan_training.iteration

    def interrupted(state, real, cfg):                      # SIGINT arrives during step 3
        out = real_iteration(state, real, cfg)
        if state.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(gan_training, "iteration", interrupted)
    stopped = train_gan(tiny(tmp_path / "b"))
    assert stopped["step"] == 3 and stopped["exit_code"] == 130
    monkeypatch.setattr(gan_training, "iteration", real_iteration)
    resumed = train_gan(tiny(tmp_path / "b"), resume=True)
    assert resumed["step"] == 4
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert a.keys() == b.keys() and any("parametrizations" in k for k in a)   # spectral-norm u, v included
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=0, rtol=0, msg=k)
    def log(run):   # the logged losses, without the wall-clock rate
        return [{k: v for k, v in json.loads(l).items() if k != "samples_per_s"} for l in (run / "metrics.jsonl").open()]

    assert log(tmp_path / "b") == log(tmp_path / "a") and len(log(tmp_path / "a")) == 4


def test_a_run_writes_grids_classifier_fid_and_scores(tmp_path):
    run = tmp_path / "run"
    result = train_gan(tiny(run, "gan.eval.classifier_fid=true", "gan.eval.num_samples=64",
                            "gan.eval.real_samples=64", "gan.eval.batch_size=32", "gan.eval.classifier_epochs=1",
                            "max_steps=6", "gan.grid_size=3", "gan.sample_every=0"))
    scores = result["val"]
    assert scores["classifier_fid"] > 0 and 0 <= scores["fid_classifier_accuracy"] <= 1
    # 96 images / batch 8 = 12 batches per epoch, 2 per step: an epoch ends at step 6 → one grid (+ the final one)
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step-00000006.png"]
    from PIL import Image

    grid = np.asarray(Image.open(run / "samples" / "step-00000006.png"))
    assert grid.shape == (3 * 18 + 2, 3 * 18 + 2)                   # 3×3 tiles of 16 px with 2-px borders
    summary = json.loads((run / "checkpoints" / "last" / "checkpoint.json").read_text())
    assert summary["step"] == 6 and summary["val"]["classifier_fid"] == pytest.approx(scores["classifier_fid"])
    assert result["best"] == {"classifier_fid": scores["classifier_fid"], "step": 6}    # lower is better
    assert {"fid_classifier/model.safetensors", "fid_classifier/real_stats.safetensors"} <= \
        {p.relative_to(run).as_posix() for p in run.rglob("*.safetensors")}
    again = gan_training.score_run(run)                   # same classifier, real statistics and latents
    assert again["step"] == 6 and again["classifier_fid"] == pytest.approx(scores["classifier_fid"], rel=1e-6)
    with pytest.raises(ValueError, match="only gan.eval.\\* and device overrides apply to a trained GAN run, "
                                         "got 'max_steps=9'"):
        gan_training.score_run(run, ["max_steps=9"])
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss_d" in r] == [1, 2, 3, 4, 5, 6]
    assert all(np.isfinite(r["loss_d"]) and np.isfinite(r["infomax_g"]) for r in records if "loss_d" in r)


def test_image_grid_places_each_tile():
    images = torch.stack([torch.full((1, 2, 2), v) for v in (-1.0, 0.0, 1.0)])
    grid = image_grid(images, rows=2)                                # 2 rows × 2 columns, last tile empty
    assert grid.shape == (2 * 4 + 2, 2 * 4 + 2, 1) and grid.dtype == torch.uint8
    assert grid[2:4, 2:4].eq(0).all() and grid[2:4, 6:8].eq(128).all() and grid[6:8, 2:4].eq(255).all()
    assert grid[6:8, 6:8].eq(0).all() and grid[0:2].eq(0).all()


def test_frechet_distance_matches_scipy_sqrtm_and_vanishes_for_equal_statistics():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(50, 6)), rng.normal(size=(40, 6)) * 1.5 + 0.3
    mu1, s1, mu2, s2 = a.mean(0), np.cov(a, rowvar=False), b.mean(0), np.cov(b, rowvar=False)
    ref = ((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2 - 2 * scipy.linalg.sqrtm(s1 @ s2).real)
    assert frechet_distance(mu1, s1, mu2, s2) == pytest.approx(ref, rel=1e-8)
    assert frechet_distance(mu1, s1, mu1, s1) == pytest.approx(0, abs=1e-9)
    assert frechet_distance(mu1, s1, mu1 + 2, s1) == pytest.approx(4 * 6, abs=1e-9)


def test_resume_refuses_a_changed_optimiser_and_a_fresh_run_refuses_a_used_directory(tmp_path, capsys):
    train_gan(tiny(tmp_path, "max_steps=2"))
    with pytest.raises(ValueError, match=r"optim.lr: 0.0002 → 0.001"):
        train_gan(tiny(tmp_path, "max_steps=2", "optim.lr=1e-3"), resume=True)
    assert cli.main(["train", str(GAN_CONFIG), "--set", *TINY, f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and f"continue it with `modwire train --resume {tmp_path}`" in err
    assert cli.main(["train", "--set", "model.name=gan_resnet_micro", "max_steps=2", "gan.n_dis=0"]) == 2
    assert "config key 'gan.n_dis': got 0, expected an integer >= 1" in capsys.readouterr().err


def test_images_of_the_wrong_shape_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"the task's images are \[1, 32, 32\], but the model makes \[1, 16, 16\]"):
        train_gan(tiny(tmp_path / "r", "data.params={size: 32}"))
    assert not (tmp_path / "r").exists()
    assert not (tmp_path / "r" / "config.yaml").exists()


def test_inception_metrics_need_a_local_weights_file(tmp_path):
    from modwire.training.gan_metrics import inception_metrics

    with pytest.raises(FileNotFoundError, match="is not a file; expected a local copy of the FID Inception weights"):
        inception_metrics(str(tmp_path / "missing.pth"), [], [], "cpu")


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "gan").rglob("*.yaml")), ids=lambda p: p.name)
def test_gan_configs_load_and_build_their_model(path):
    cfg = load_config(str(path))
    with torch.device("meta"):
        model = gan_training.create_model(cfg.model.name, **dict(cfg.model.overrides))
    assert model.config.model_type == "gan"


def test_cli_eval_scores_a_gan_run_with_the_runs_own_config(tmp_path, capsys):
    train_gan(tiny(tmp_path, "max_steps=1"))
    assert cli.main(["eval", str(tmp_path), "--set", "gan.eval.num_samples=16", "gan.eval.real_samples=16",
                     "gan.eval.classifier_fid=true", "gan.eval.classifier_epochs=1",
                     "gan.eval.classifier_accuracy=false"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["step"] == 1 and out["classifier_fid"] > 0 and out["random_attention"] is False
    assert cli.main(["eval", str(tmp_path), "--task", "digits"]) == 2
    assert "is a GAN run: eval scores its samples" in capsys.readouterr().err


def test_a_gan_run_resumes_with_only_resume_and_prints_the_common_header(tmp_path, capsys):
    """Issue 24: the GAN run is an ordinary run: the same header, resume from the run directory alone
    (no --set repeated), and finetune refused with what applies."""
    run = tmp_path / "run"
    args = ["train", str(GAN_CONFIG), "--set", *TINY, "data.val_split=test", "gan.eval.every=0", f"out_dir={run}"]
    assert cli.main([*args, "max_steps=2"]) == 0
    err = capsys.readouterr().err
    assert "gan_resnet_micro on digits" in err and "2 generator steps, 2 discriminator steps each" in err
    assert "parameters:" in err and "run directory:" in err
    assert cli.main(["train", "--resume", str(run), "--set", "max_steps=3", "--allow-change", "max_steps"]) == 0
    captured = capsys.readouterr()
    assert "resumed at step 2" in captured.err and json.loads(captured.out.splitlines()[-1])["step"] == 3
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss_g" in r] == [1, 2, 3]
    assert cli.main(["finetune", str(run), "--task", "digits"]) == 2
    assert "is a GAN run: it has no task outputs to fine-tune" in capsys.readouterr().err
    assert cli.main(["analyze", str(run), "--no-plots"]) == 0          # what applies: no analysis but eval's scores
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    assert summary["analyses"] == [] and summary["metrics"] is None
    assert "a GAN has no task metrics: modwire eval" in capsys.readouterr().out
