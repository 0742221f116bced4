"""modwire.experiments.ait_memory_collapse: a smoke run writes its table, and the four variants are the
paper's workspace and the two options of modwire.nn.workspace ("Memory collapse")."""
import json

import pytest
from task_fixtures import write_mnist

from modwire.analysis.workspace import slot_similarity
from modwire.experiments import ait_memory_collapse as collapse
from modwire.models.ait import AUTHORS_AIT, NO_COLLAPSE


def test_variants_are_the_defaults_the_authors_and_each_option_with_the_write_stated():
    import modwire

    paper = {"write_residual": False, "bottleneck_softmax": "all", "write_grad": True}   # Eq. 3-4 as printed
    v = collapse.VARIANTS
    default = modwire.get_config("ait_small_cifar10")
    assert v["paper"] == paper and default.replace(**paper) == default          # "paper" is modwire's defaults
    assert v["residual"] == {**paper, "write_residual": True} and v["authors"] == AUTHORS_AIT
    assert v["both"] == {**paper, **NO_COLLAPSE} and {**v["unit"], **v["kept"]} == {**paper, **NO_COLLAPSE}
    assert v["biased"] == {**paper, "bottleneck_bias": True, "bottleneck_head_split": True}
    assert all({"write_residual", "bottleneck_softmax", "write_grad"} <= set(o) for o in v.values())   # not the defaults


def test_slot_similarity_is_the_mean_off_diagonal_cosine():
    import torch

    assert slot_similarity(torch.ones(4, 3)) == pytest.approx(1.0)
    assert slot_similarity(torch.eye(4)) == pytest.approx(0.0)
    assert slot_similarity(torch.tensor([[1.0, 0], [-1.0, 0]])) == pytest.approx(-1.0)


@pytest.mark.slow
def test_quick_run_writes_results_and_table(tmp_path):
    data = tmp_path / "fashion-mnist"     # Fashion-MNIST's idx files as Debian installs them, 64 + 32 images
    write_mnist(data, n=64, n_test=32, balanced=True)
    assert collapse.main(["--quick", "--out", str(tmp_path), "--data-root", str(data)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["variant"] for r in results] == list(collapse.VARIANTS)
    assert all(len(r["curve"][-1]["slot_cos"]) == 2 and 0 <= r["test_top1"] <= 1 for r in results)
    table = (tmp_path / "table.md").read_text()
    summary, per_run = table.split("\n\n")
    assert summary.count("\n") == 1 + len(collapse.VARIANTS) and per_run.count("\n") == 2 + len(results)
    for r in results:                     # each run's line carries its numbers; one seed: the summary the same
        row = next(line for line in per_run.splitlines() if line.startswith(f"| {r['variant']} | 0 |"))
        assert row.endswith(f"| {100 * r['test_top1']:.1f} | {r['seconds']} |")
        assert f"{r['curve'][-1]['balance']:.0f}" in row
        line = next(line for line in summary.splitlines() if line.startswith(f"| {r['variant']} | 1 |"))
        assert line.endswith(f"| {100 * r['test_top1']:.1f} | {r['seconds']} |")
    fresh = json.loads((tmp_path / "study.json").read_text())
    assert fresh["source"] is None and fresh["results"] == results
    (tmp_path / "table.md").unlink()
    assert collapse.main(["--report", "--out", str(tmp_path)]) == 0              # from results.json, no training
    rebuilt = json.loads((tmp_path / "study.json").read_text())
    assert rebuilt["results"] == results and (tmp_path / "table.md").read_text() == table
    assert rebuilt["source"]["logs"] == [str((tmp_path / "results.json").resolve())] and rebuilt["commit"] is None


def test_report_without_a_run_says_to_run_the_study_first(tmp_path):
    with pytest.raises(SystemExit, match=r"results.json does not exist; run the study first"):
        collapse.main(["--report", "--out", str(tmp_path)])


def test_unreadable_data_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match=r"(?s)fashion_mnist data is not readable.*nowhere does not exist.*--data-root DIR"):
        collapse.main(["--quick", "--out", str(tmp_path), "--data-root", str(tmp_path / "nowhere")])


@pytest.mark.slow      # ~5 s (make test stays under 10 minutes)
def test_seeds_give_one_record_per_variant_and_seed_and_report_rebuilds_them(tmp_path):
    """--seeds 2 on the generated Triangle task: a record per (variant, seed), seeds-major, each seed its
    own numbers; the table gives mean ± std over the two; --report rebuilds the same study.json results."""
    assert collapse.main(["--quick", "--seeds", "2", "--task", "triangle", "--variants", "paper", "residual",
                          "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["variant"], r["seed"], r["task"]) for r in results] == [
        ("paper", 0, "triangle"), ("residual", 0, "triangle"), ("paper", 1, "triangle"), ("residual", 1, "triangle")]
    for name in ("paper", "residual"):     # the seed changes the initialisation: different curves
        a, b = (r["curve"][-1]["slot_cos"] for r in results if r["variant"] == name)
        assert a != b
    fresh = json.loads((tmp_path / "study.json").read_text())
    assert fresh["seeds"] == [0, 1] and fresh["config"]["seeds"] == 2 and fresh["results"] == results
    paper = [r["curve"][-1]["slot_cos"][0] for r in results if r["variant"] == "paper"]
    table = (tmp_path / "table.md").read_text()
    assert f"| paper | 2 | {collapse.common.format_mean_std(paper)} / " in table
    assert collapse.main(["--report", "--out", str(tmp_path)]) == 0
    rebuilt = json.loads((tmp_path / "study.json").read_text())
    assert rebuilt["results"] == results and rebuilt["seeds"] == [0, 1] and (tmp_path / "table.md").read_text() == table


def test_report_reads_one_seed_records_without_a_seed_field(tmp_path):
    """The archived runs of earlier code have no ``seed``: seed 0, and the table is theirs unchanged."""
    record = {"variant": "paper", "steps": 2, "test_top1": 0.5, "patch_diversity": [0.1, 0.2], "seconds": 3.0,
              "curve": [{"step": 1, "loss": 2.0, "balance": 9.0, "slot_cos": [0.01, 0.02]},
                        {"step": 2, "loss": 1.0, "balance": 8.0, "slot_cos": [0.9, 0.8]}]}
    (tmp_path / "results.json").write_text(json.dumps([record]))
    assert collapse.main(["--report", "--out", str(tmp_path)]) == 0
    study = json.loads((tmp_path / "study.json").read_text())
    assert study["seeds"] == [0] and study["results"] == [record]
    table = (tmp_path / "table.md").read_text()
    assert "| paper | 1 | 0.90 / 0.80 | 0.90 | 8 | 0.100 / 0.200 | 50.0 | 3.0 |" in table
