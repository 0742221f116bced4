"""GAN training (training/gan.py, gan_config.py, gan_metrics.py): exact resume, files, scores, errors.
Runs the micro preset on scikit-learn's digits at 16×16 (offline, a few seconds each)."""
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
from modwire.training.gan import image_grid, train_gan
from modwire.training.gan_config import load_gan_config
from modwire.training.gan_metrics import frechet_distance

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.name=gan_resnet_micro", "data.task=digits", "data.params={size: 16}", "data.max_samples=96",
        "data.batch_size=8", "n_dis=2", "steps=4", "checkpoint_every=2", "log_every=1", "eval.classifier_fid=false"]


def tiny(out: Path, *extra: str):
    return load_gan_config(None, [*TINY, f"out_dir={out}", *extra])


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
    def log(run):   # the logged losses, without the wall-clock seconds
        return [{k: v for k, v in json.loads(l).items() if k != "seconds"} for l in (run / "metrics.jsonl").open()]

    assert log(tmp_path / "b") == log(tmp_path / "a") and len(log(tmp_path / "a")) == 4


def test_a_run_writes_grids_classifier_fid_and_scores(tmp_path):
    run = tmp_path / "run"
    result = train_gan(tiny(run, "eval.classifier_fid=true", "eval.num_samples=64", "eval.real_samples=64",
                            "eval.batch_size=32", "eval.classifier_epochs=1", "steps=6", "grid_size=3"))
    scores = result["scores"]
    assert scores["classifier_fid"] > 0 and 0 <= scores["fid_classifier_accuracy"] <= 1
    # 96 images / batch 8 = 12 batches per epoch, 2 per step: an epoch ends at step 6 → one grid (+ the final one)
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step-00000006.png"]
    from PIL import Image

    grid = np.asarray(Image.open(run / "samples" / "step-00000006.png"))
    assert grid.shape == (3 * 18 + 2, 3 * 18 + 2)                   # 3×3 tiles of 16 px with 2-px borders
    summary = json.loads((run / "checkpoints" / "last" / "checkpoint.json").read_text())
    assert summary["step"] == 6 and summary["scores"]["classifier_fid"] == pytest.approx(scores["classifier_fid"])
    assert {"fid_classifier/model.safetensors", "fid_classifier/real_stats.safetensors"} <= \
        {p.relative_to(run).as_posix() for p in run.rglob("*.safetensors")}
    again = gan_training.score_run(run)                   # same classifier, real statistics and latents
    assert again["step"] == 6 and again["classifier_fid"] == pytest.approx(scores["classifier_fid"], rel=1e-6)
    with pytest.raises(ValueError, match="only eval.\\* and device overrides apply to a trained run, got 'steps=9'"):
        gan_training.score_run(run, ["steps=9"])
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
    train_gan(tiny(tmp_path, "steps=2"))
    with pytest.raises(ValueError, match=r"optim.lr_g: 0.0002 → 0.001"):
        train_gan(tiny(tmp_path, "steps=2", "optim.lr_g=1e-3"), resume=True)
    assert cli.main(["gan", "--set", *TINY, f"out_dir={tmp_path}"]) == 1
    assert "already holds a run: continue it with --resume" in capsys.readouterr().err
    assert cli.main(["gan", "--set", "n_dis=0"]) == 2
    assert "config key 'n_dis': got 0, expected an integer >= 1" in capsys.readouterr().err


def test_images_of_the_wrong_shape_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"the task's images are \[1, 32, 32\], but the model makes \[1, 16, 16\]"):
        train_gan(tiny(tmp_path / "r", "data.params={size: 32}"))
    assert not (tmp_path / "r" / "config.yaml").exists()


def test_inception_metrics_need_a_local_weights_file(tmp_path):
    from modwire.training.gan_metrics import inception_metrics

    with pytest.raises(FileNotFoundError, match="is not a file; expected a local copy of the FID Inception weights"):
        inception_metrics(str(tmp_path / "missing.pth"), [], [], "cpu")


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "gan").rglob("*.yaml")), ids=lambda p: p.name)
def test_gan_configs_load_and_build_their_model(path):
    cfg = load_gan_config(str(path))
    with torch.device("meta"):
        model = gan_training.create_model(cfg.model.name, **dict(cfg.model.overrides))
    assert model.config.model_type == "gan"


def test_cli_score_takes_the_runs_own_config(tmp_path, capsys):
    train_gan(tiny(tmp_path, "steps=1"))
    assert cli.main(["gan", "--score", str(tmp_path), "--set", "eval.num_samples=16", "eval.real_samples=16",
                     "eval.classifier_fid=true", "eval.classifier_epochs=1", "eval.classifier_split=''"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["step"] == 1 and out["classifier_fid"] > 0 and out["random_attention"] is False
    assert cli.main(["gan", "cfg.yaml", "--score", str(tmp_path)]) == 2
    assert "--score RUN_DIR takes the run's own config" in capsys.readouterr().err
