"""modwire.experiments.ait_triangle: its rows are the Table 2 ablations on one CPU-sized preset, and
an in-process smoke run writes, scores and tabulates a row."""
import json

import pytest

from modwire.experiments import ait_triangle as tri
from modwire.models.ait import ABLATIONS, AUTHORS_AIT, NO_COLLAPSE
from modwire.training import load_config


def sets(row, tmp_path):
    return load_config(values=tri.row_overrides(row, 100, tmp_path))


def test_rows_are_table2_ablations_of_one_preset_with_the_papers_workspace(tmp_path):
    full = sets("ait", tmp_path)
    assert full.model.name == "ait_small_triangle" and full.data.batch_size == 128
    assert full.model.overrides["tokenizer"]["patch_size"] == 16      # 16 tokens x 128 = the paper's 2048-patch pool
    assert full.aux_loss_weights == {"balance": 0.01} and full.optim.weight_decay == 0.01
    vit = sets("vit", tmp_path)
    assert vit.model.overrides["workspace"] is False and not vit.aux_loss_weights
    assert sets("without_bottleneck", tmp_path).model.overrides["bottleneck_size"] == 0
    former = sets("vit_pre35", tmp_path)
    assert former.optim.filter_bias_and_norm is True and former.model.overrides["qv_bias"] is True
    assert former.model.overrides["tokenizer"]["patch_norm"] is False and former.model.overrides["workspace"] is False
    assert sets("vit", tmp_path).optim.filter_bias_and_norm is False
    for row in set(tri.LABELS) - {"vit_pre35"}:
        cfg = sets(row, tmp_path)
        if row.endswith(("_positions", "_conv_embedding")):         # the embedding's departures, measured
            base = row.removesuffix("_positions").removesuffix("_conv_embedding")
            assert cfg.model.overrides["tokenizer"]["positions"] == "absolute"
            assert cfg.model.overrides["tokenizer"]["patch_size"] == 16
            assert cfg.model.overrides["tokenizer"].get("patch_norm", True) is not row.endswith("_conv_embedding")
            want = ABLATIONS[tri.ABLATION_OF.get(base, base)]
        else:
            base = row.removesuffix("_no_collapse")
            want = AUTHORS_AIT if row == "ait_authors" else {**ABLATIONS[tri.ABLATION_OF.get(base, base)],
                                                             **(NO_COLLAPSE if base != row else {})}
        for key, value in want.items():
            assert cfg.model.overrides[key] == value
    assert "positions" not in sets("ait", tmp_path).model.overrides["tokenizer"]      # the authors': none
    authors = sets("ait_authors", tmp_path)
    assert authors.aux_loss_weights == {"balance": 0.01} and authors.model.overrides["write_grad"] is False
    assert sets("ait_no_collapse", tmp_path).model.overrides["normalize_update"] is True
    assert tri.parse([]).rows == ["ait", "vit", "without_bottleneck", "ait_authors"]
    assert "ait_no_collapse" not in tri.parse(["--rows", "all"]).rows and "ait_authors" in tri.parse(["--rows", "all"]).rows
    assert "vit_positions" not in tri.parse(["--rows", "all"]).rows
    assert "vit_conv_embedding" not in tri.parse(["--rows", "all"]).rows
    with pytest.raises(SystemExit):
        tri.parse(["--rows", "ait,nope"])


@pytest.mark.slow      # ~5 s (make test stays under 10 minutes)
def test_quick_run_trains_scores_the_test_split_and_tabulates(tmp_path, capsys):
    assert tri.main(["--quick", "--workers", "0", "--rows", "ait", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])
    assert record["row"] == "ait" and record["test"]["split"] == "test" and record["test"]["samples"] == 128
    table = (tmp_path / "table.md").read_text()
    assert "| AiT (full) | 99.47 |" in table and f"{100 * record['test']['top1']:.2f}" in table
    assert tri.main(["--quick", "--workers", "0", "--rows", "ait", "--out", str(tmp_path)]) == 0   # skipped: done
    assert "1 runs, 1 already in" in capsys.readouterr().out
