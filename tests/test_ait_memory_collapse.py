"""experiments/ait_memory_collapse.py: a smoke run writes its table, and the four variants are the
paper's workspace and the two options of modwire.nn.workspace ("Memory collapse")."""
import json

import experiment_script
import pytest
from task_fixtures import write_mnist

from modwire.models.ait import NO_COLLAPSE

collapse = experiment_script.load("ait_memory_collapse")
from modwire.analysis.workspace import slot_similarity  # noqa: E402


def test_variants_are_the_paper_and_each_option_with_the_residual_write_stated():
    paper = {"write_residual": False}                                   # Eq. 3-4 as printed
    v = collapse.VARIANTS
    assert v["paper"] == paper and v["residual"] == {"write_residual": True}
    assert v["both"] == {**paper, **NO_COLLAPSE} and {**v["kept"], **v["unit"]} == {**paper, **NO_COLLAPSE}
    assert v["biased"] == {**paper, "bottleneck_bias": True, "bottleneck_head_split": True}
    assert v["authors"] == {"write_residual": True, "bottleneck_softmax": "kept"}
    assert all("write_residual" in o for o in v.values())              # the table does not move with the default


def test_slot_similarity_is_the_mean_off_diagonal_cosine():
    import torch

    assert slot_similarity(torch.ones(4, 3)) == pytest.approx(1.0)
    assert slot_similarity(torch.eye(4)) == pytest.approx(0.0)
    assert slot_similarity(torch.tensor([[1.0, 0], [-1.0, 0]])) == pytest.approx(-1.0)


def test_quick_run_writes_results_and_table(tmp_path):
    data = tmp_path / "fashion-mnist"     # Fashion-MNIST's idx files as Debian installs them, 64 + 32 images
    write_mnist(data, n=64, n_test=32, balanced=True)
    assert collapse.main(["--quick", "--out", str(tmp_path), "--data-root", str(data)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["variant"] for r in results] == list(collapse.VARIANTS)
    assert all(len(r["curve"][-1]["slot_cos"]) == 2 and 0 <= r["test_top1"] <= 1 for r in results)
    table = (tmp_path / "table.md").read_text()
    assert table.count("\n") == 2 + len(collapse.VARIANTS)
    for r in results:                     # each row carries its run's numbers
        row = next(line for line in table.splitlines() if line.startswith(f"| {r['variant']} |"))
        assert row.endswith(f"| {100 * r['test_top1']:.1f} |") and f"{r['curve'][-1]['balance']:.0f}" in row
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


def test_quick_run_on_the_generated_triangle_task(tmp_path):
    assert collapse.main(["--quick", "--task", "triangle", "--variants", "paper", "residual",
                          "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["variant"], r["task"]) for r in results] == [("paper", "triangle"), ("residual", "triangle")]
