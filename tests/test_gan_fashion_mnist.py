"""modwire.experiments.gan_fashion_mnist (NFM Table 4 at CPU scale): the records it reads from each run's
metrics, its table, --report on the committed layout, and a quick run of both generators."""
import json

import pytest

from modwire.experiments import gan_fashion_mnist as gan


def _log(path, key: str, fids: dict[int, float]) -> None:
    path.mkdir(parents=True)
    lines = [{"step": s, key: v} for s, v in fids.items()] + [{"step": max(fids), "loss_g": 1.0}]
    path.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_report_reads_both_metric_names_and_tabulates_mean_and_std_over_seeds(tmp_path, capsys):
    _log(tmp_path / "gan", "classifier_fid", {0: 47.5, 400: 13.0})              # the former `modwire gan` loop
    _log(tmp_path / "gan-seed1", "val_classifier_fid", {0: 47.0, 400: 15.0})    # the trainer's GAN program
    _log(tmp_path / "nfm_gan", "val_classifier_fid", {0: 47.5, 400: 14.0})
    (tmp_path / "table.md").write_text("notes no log records\n")
    assert gan.main(["--report", "--seeds", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| ResNet GAN (InfoMax) | 15.12 ± 0.10 | 2 | 47.25 ± 0.35 | 14.00 ± 1.41 |" in out
    assert "| NFM ResNet GAN (InfoMax) | 13.15 ± 0.06 | 1 | 47.50 | 14.00 |" in out
    assert (tmp_path / "table.md").read_text() == "notes no log records\n"     # --report keeps it
    study = json.loads((tmp_path / "study.json").read_text())
    assert [(r["key"], r["seed"], r["steps"], r["final_classifier_fid"]) for r in study["results"]] == [
        ("gan", 0, 400, 13.0), ("gan-seed1", 1, 400, 15.0), ("nfm_gan", 0, 400, 14.0)]
    assert study["seeds"] == [0, 1] and len(study["source"]["logs"]) == 3


def test_unknown_model_is_a_usage_error():
    with pytest.raises(SystemExit) as e:
        gan.parse(["--models", "gan,vae"])
    assert e.value.code == 2


def test_quick_run_trains_both_generators_and_scores_them(tmp_path):      # ~10 s
    assert gan.main(["--quick", "--seeds", "1", "--workers", "0", "--out", str(tmp_path)]) == 0
    study = json.loads((tmp_path / "study.json").read_text())
    assert [r["model"] for r in study["results"]] == ["gan", "nfm_gan"]
    for r in study["results"]:
        assert r["steps"] == 4 and sorted(map(int, r["classifier_fid"])) == [0, 2, 4]
        assert r["final_classifier_fid"] == r["classifier_fid"]["4"] > 0
    # at step 0 both generators are the same function (every γ = 0, same seed): the same score
    assert study["results"][0]["classifier_fid"]["0"] == pytest.approx(study["results"][1]["classifier_fid"]["0"])
    assert study["source"] is None and study["wall_time_s"] > 0
    assert gan.main(["--quick", "--seeds", "1", "--workers", "0", "--out", str(tmp_path)]) == 0   # nothing to train
