"""Bad training configs: every numeric field out of range, and every way a config file can be
unusable, gives one clear error (ValueError / FileNotFoundError, so the CLI exits 2) naming the
key path or the file (and line), the value, and what is expected."""
import math
import re

import pytest

from modwire import cli
from modwire.fields import declared_rules
from modwire.training.config import ConfigError, TrainConfig, load_config

NUMERIC_RULES = declared_rules(TrainConfig)   # every bound the training config's sections declare

# key -> values it must refuse (NaN, inf, zero, negative where they make no sense)
BAD_VALUES = {
    "optim.lr": ["nan", "inf", "0", "-1e-3"],
    "optim.warmup_lr": ["nan", "inf", "-1e-6"],
    "optim.min_lr": ["nan", "inf", "-1e-5"],
    "optim.weight_decay": ["nan", "inf", "-0.1"],
    "optim.grad_clip": ["nan", "inf", "-1"],
    "optim.warmup_steps": ["-1"],
    "optim.decay_steps": ["-1"],
    "optim.gamma": ["0", "1.5", "nan"],
    "optim.label_smoothing": ["nan", "1.0", "-0.1"],
    "data.batch_size": ["0", "-8"],
    "data.mixup_alpha": ["0", "-1", "nan"],
    "data.num_workers": ["-1"],
    "data.max_samples": ["-1"],
    "data.few_shot.shots": ["-1"],
    "data.few_shot.ways": ["-2"],
    "finetune.add_functions": ["-1"],
    "epochs": ["0", "-1"],
    "grad_accum": ["0", "-2"],
    "log_every": ["0", "-1"],
    "max_steps": ["-1"],
    "checkpoint_every": ["-1"],
    "keep_weights_every": ["-1"],
    "seed": ["-1"],
    "ema_decay": ["nan", "1.0", "-0.5", "inf"],
    "gan.n_dis": ["0"], "gan.lr_d": ["0", "-1", "nan"], "gan.loss.infomax_d": ["-1"], "gan.loss.infomax_g": ["-1"],
    "gan.eval.every": ["-1"], "gan.eval.num_samples": ["0"], "gan.eval.real_samples": ["0"],
    "gan.eval.batch_size": ["0"], "gan.eval.classifier_epochs": ["0"], "gan.sample_every": ["-1"],
    "gan.grid_size": ["0"],
}
CASES = [(k, v) for k, vs in BAD_VALUES.items() for v in vs]


def test_every_numeric_rule_has_bad_value_cases():
    # (aux_loss_weights.*: tests/training/test_aux_losses.py)
    assert set(BAD_VALUES) | {"optim.betas.*", "aux_loss_weights.*", "optim.milestones.*"} == set(NUMERIC_RULES)


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_bad_numeric_value_names_key_value_and_expectation(key, value):
    with pytest.raises(ValueError) as info:
        load_config(None, [f"{key}={value}"])
    msg = str(info.value)
    assert f"config key {key!r}" in msg and "expected" in msg and "\n" not in msg
    shown = msg.split("got ")[1].split(",")[0]
    assert float(shown) == float(value) or (math.isnan(float(value)) and shown == "nan")


@pytest.mark.parametrize("betas,key", [("[0.9, 1.0]", "optim.betas[1]"), ("[-0.1, 0.99]", "optim.betas[0]"),
                                       ("[.nan, 0.99]", "optim.betas[0]")])
def test_bad_betas_name_the_element(betas, key):
    with pytest.raises(ValueError, match=re.escape(key) + r"'.*expected a finite number in \[0, 1\)"):
        load_config(None, [f"optim.betas={betas}"])
    with pytest.raises(ValueError, match="expected two numbers"):
        load_config(None, ["optim.betas=[0.9]"])


def test_boundary_values_are_accepted():
    c = load_config(None, ["optim.warmup_lr=0", "optim.min_lr=0", "optim.weight_decay=0", "optim.grad_clip=0",
                           "checkpoint_every=0", "max_steps=0", "data.num_workers=0", "seed=0", "ema_decay=0.999",
                           "optim.label_smoothing=0", "optim.betas=[0, 0.999]",
                           "data.max_samples=5"])
    assert c.optim.grad_clip == 0 and c.ema_decay == 0.999 and c.data.max_samples == 5


def test_min_lr_above_lr_is_refused():
    with pytest.raises(ValueError, match=r"'optim.min_lr': got 0.01, expected <= optim.lr \(0.001\)"):
        load_config(None, ["optim.lr=1e-3", "optim.min_lr=1e-2"])


def _one_line_error(path, exc_type=ValueError):
    with pytest.raises(exc_type) as info:
        load_config(str(path))
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  name: nac_micro\noptim: {lr: 1e-3\nepochs: 2\n")
    assert "line 4" in _one_line_error(p) and "YAML syntax error" in _one_line_error(p)
    p.write_text("epochs: 1\nseed: 0\nepochs: 2\n")  # a duplicate key is refused, not silently the last
    assert "line 3" in _one_line_error(p) and "duplicate key" in _one_line_error(p)
    p.write_text("epochs: 1\nseed: \x00\n")  # a control character, reported by the YAML reader
    assert "line 2" in _one_line_error(p)


def test_unusable_config_paths_are_one_line_errors(tmp_path):
    assert "is a directory" in _one_line_error(tmp_path)
    assert "not found" in _one_line_error(tmp_path / "nope.yaml", FileNotFoundError)
    p = tmp_path / "latin1.yaml"
    p.write_bytes("out_dir: runs/caf\xe9\n".encode("latin-1"))
    assert "not UTF-8" in _one_line_error(p) and "0xe9" in _one_line_error(p)
    p = tmp_path / "empty.yaml"
    p.write_text("")
    assert "is empty" in _one_line_error(p)
    p.write_text("# only a comment\n")
    assert "is empty" in _one_line_error(p)
    p = tmp_path / "list.yaml"
    p.write_text("- epochs: 1\n- seed: 2\n")
    assert "a list at the top level" in _one_line_error(p)
    p = tmp_path / "scalar.yaml"
    p.write_text("hello\n")
    assert "the scalar 'hello' at the top level" in _one_line_error(p)


def test_unknown_and_mistyped_keys_name_the_file_and_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("optim: {lrr: 1e-3}\n")
    assert "'optim.lrr'" in _one_line_error(p)
    p.write_text("epochs: many\n")
    assert "'epochs'" in _one_line_error(p)


@pytest.mark.parametrize("items,needle", [(["epochs"], "expected KEY=VALUE"), (["=3"], "expected KEY=VALUE"),
                                          (["data.params={a: "], "not valid YAML"),
                                          (["base=x.yaml"], "cannot be --set"),
                                          (["optim.lr:=abc"], "'optim.lr'")])
def test_bad_overrides_are_one_line_errors(items, needle):
    with pytest.raises(ValueError) as info:
        load_config(None, items)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_cli_exits_2_with_the_message(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text("optim: {lr: .nan}\n")
    assert cli.main(["train", str(p)]) == 2
    err = capsys.readouterr().err
    assert "config key 'optim.lr': got nan, expected a finite number > 0" in err and "Traceback" not in err
    assert cli.main(["train", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_base_cycle_is_named(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\nepochs: 2\n")
    (tmp_path / "b.yaml").write_text("base: [c.yaml]\n")
    (tmp_path / "c.yaml").write_text("base: a.yaml\n")
    msg = _one_line_error(tmp_path / "a.yaml")
    assert "cycle" in msg and msg.count("a.yaml") == 3 and "b.yaml -> " in msg
    (tmp_path / "self.yaml").write_text("base: self.yaml\n")
    assert "cycle" in _one_line_error(tmp_path / "self.yaml")


def test_bad_base_values_and_missing_base_files(tmp_path):
    p = tmp_path / "c.yaml"
    for value in ("3", "[]", "{a: b}", "[a.yaml, 2]"):
        p.write_text(f"base: {value}\n")
        assert "'base:' must be a file name or a list" in _one_line_error(p)
    p.write_text("base: gone.yaml\n")
    msg = _one_line_error(p, FileNotFoundError)
    assert "gone.yaml not found (named by 'base:' in" in msg
    (tmp_path / "broken.yaml").write_text("epochs: [\n")
    p.write_text("base: broken.yaml\n")
    with pytest.raises(ValueError, match=r"broken.yaml, line 2.*YAML syntax error"):
        load_config(str(p))
