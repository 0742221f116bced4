"""Config files as deltas (``base:``) and ``--set`` merge (``key=``) vs replace (``key:=``)."""
import dataclasses
from pathlib import Path

import pytest

from modwire.models import get_config
from modwire.training.config import config_layers, load_config, to_yaml

ROOT = Path(__file__).resolve().parents[2]
ORIGINALS = ROOT / "tests" / "fixtures" / "table1_original"   # configs/table1/* as of commit cd0d714
TABLE1 = sorted((ROOT / "configs" / "table1").glob("[0-9]_*.yaml"))


def test_table1_has_the_seven_rows_and_the_originals_are_kept():
    assert [p.name for p in TABLE1] == sorted(p.name for p in ORIGINALS.glob("*.yaml")) and len(TABLE1) == 7


@pytest.mark.parametrize("path", TABLE1, ids=lambda p: p.name)
def test_table1_delta_loads_to_the_same_config_as_the_original_file(path):
    original = ORIGINALS / path.name
    assert "base:" not in original.read_text() and "base: _base.yaml" in path.read_text()
    assert len(path.read_text().splitlines()) < len(original.read_text().splitlines()) / 2
    # the same training config and the same model config once both are resolved
    new, old = _resolved(path), _resolved(original)
    assert new == old


def _resolved(path: Path):
    cfg = load_config(str(path))
    model = get_config(cfg.model.name, **dict(cfg.model.overrides))
    return to_yaml(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, overrides={}))), model


def _write(folder: Path, **files: str) -> None:
    for name, text in files.items():
        (folder / f"{name}.yaml").write_text(text)


def test_the_old_top_level_graph_prior_section_says_where_it_moved(tmp_path):
    _write(tmp_path, base="graph_prior: {name: null}\n", run="base: base.yaml\nepochs: 2\n")
    with pytest.raises(ValueError, match=r"base.yaml: key 'graph_prior': .*model.overrides.graph_prior.*"
                                         r"aux_loss_weights.graph"):
        load_config(str(tmp_path / "run.yaml"))
    with pytest.raises(ValueError, match=r"override 'graph_prior.weight=0': key 'graph_prior.weight': "
                                         r".*model.overrides.graph_prior"):
        load_config(None, ["graph_prior.weight=0"])


def test_base_deep_merges_and_the_file_wins(tmp_path):
    _write(tmp_path, base="data: {task: triangle, params: {size: 64, seed: 3}, batch_size: 8}\nepochs: 5\n",
           run="base: base.yaml\ndata: {params: {size: 32}}\nepochs: 2\n")
    c = load_config(str(tmp_path / "run.yaml"))
    assert c.data.params == {"size": 32, "seed": 3} and c.data.batch_size == 8 and c.epochs == 2
    assert load_config(str(tmp_path / "base.yaml")).epochs == 5      # the base itself is untouched


def test_base_list_applies_in_order_recursively_relative_to_each_file(tmp_path):
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub", root="seed: 1\nepochs: 1\nlog_every: 1\n",
           mid="base: root.yaml\nepochs: 2\n")                         # sub/mid names sub/root
    _write(tmp_path, other="epochs: 3\nlog_every: 3\n",
           run="base: [sub/mid.yaml, other.yaml]\nlog_every: 4\n")
    c = load_config(str(tmp_path / "run.yaml"))
    assert (c.seed, c.epochs, c.log_every) == (1, 3, 4)
    names = [f.name for f, _ in config_layers(tmp_path / "run.yaml")]
    assert names == ["root.yaml", "mid.yaml", "other.yaml", "run.yaml"]


def test_a_base_reached_twice_applies_once_at_its_first_place(tmp_path):
    _write(tmp_path, common="epochs: 1\nseed: 1\n", a="base: common.yaml\nepochs: 2\n",
           b="base: common.yaml\nseed: 5\n", run="base: [a.yaml, b.yaml]\n")
    c = load_config(str(tmp_path / "run.yaml"))
    assert (c.epochs, c.seed) == (2, 5)      # common.yaml does not come back to undo a.yaml's epochs


def test_base_errors_name_the_file_that_has_the_bad_key(tmp_path):
    _write(tmp_path, base="optim: {lrr: 1}\n", run="base: base.yaml\n")
    with pytest.raises(ValueError, match=r"base.yaml: key 'optim.lrr'"):
        load_config(str(tmp_path / "run.yaml"))


def test_set_merges_with_equals_and_replaces_with_colon_equals(tmp_path):
    _write(tmp_path, run="data: {task: triangle, params: {size: 64, seed: 3}}\n"
                         "model: {overrides: {kernel: {enabled: false, topk: 2}}}\n")
    path = str(tmp_path / "run.yaml")
    assert load_config(path, ["data.params={size: 8}"]).data.params == {"size": 8, "seed": 3}
    assert load_config(path, ["data.params:={size: 8}"]).data.params == {"size": 8}
    assert load_config(path, ["data.params:={}"]).data.params == {}
    c = load_config(path, ["model.overrides.kernel:={enabled: true}"])
    assert c.model.overrides == {"kernel": {"enabled": True}}
    # a typed section restarts from its defaults; later items apply after earlier ones
    c = load_config(None, ["optim.weight_decay=0.5", "optim:={lr: 1e-2}", "optim.name=sgd"])
    assert (c.optim.lr, c.optim.weight_decay, c.optim.name) == (1e-2, 0.05, "sgd")
    c = load_config(None, ["data.params={a: {b: 1, c: 2}}", "data.params.a:={c: 3}", "data.params.d=4"])
    assert c.data.params == {"a": {"c": 3}, "d": 4}
    assert load_config(None, ["out_dir:=runs/x=y"]).out_dir == "runs/x=y"   # '=' inside a value is kept


def test_an_unknown_key_names_the_valid_ones_and_a_close_match():
    from modwire.training import load_config
    from modwire.training.config import ConfigError

    with pytest.raises(ConfigError, match=r"key 'optim.lrr': Key 'lrr' not in 'OptimSection'. Did you mean: 'lr'\? "
                                          r"Valid keys: \['name', 'lr', "):
        load_config(None, ["optim.lrr=1"])
