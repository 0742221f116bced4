"""sort_of_clevr_image: the sort_of_clevr items as an image plus a question vector, for a set model
with a question token (AiT §5.8); relational / non-relational accuracy reported separately."""
import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from modwire import cli
from modwire.tasks import InputSpec, build_dataset, get_task
from modwire.tasks.synthetic import sort_of_clevr as soc
from modwire.training import build_model_for_task, load_config

NAME = "sort_of_clevr_image"


def test_task_info():
    info = get_task(NAME)
    assert info.kind == "generator" and info.num_classes == 10 and info.loss == "cross_entropy"
    assert info.inputs == {"x": InputSpec.image(3, 75, 75), "question": InputSpec.vectors(1, 11)}
    assert info.params == {"seed": 0, "size": soc.DEFAULT_SIZE, "holdout": 0}   # no patch_size: the model cuts patches
    assert set(info.subsets) == {"relational", "non_relational"}
    assert info.categories[1] == soc.QUESTION_TYPE_NAMES


def test_items_are_the_sort_of_clevr_items_split_into_image_and_question():
    tokens, split = build_dataset("sort_of_clevr", "val", size=2), build_dataset(NAME, "val", size=2)
    assert len(split) == len(tokens) == 40
    for i in (0, 7, 13, 39):
        (t, y), (item, y2) = tokens[i], split[i]
        x, q = item["x"], item["question"]
        assert x.dtype == q.dtype == torch.float32 and x.shape == (3, 75, 75) and q.shape == (1, 11)
        assert int(y) == int(y2)
        np.testing.assert_array_equal(soc.patchify(x.permute(1, 2, 0).numpy(), 5), t[:, :75].numpy())
        assert torch.equal(q[0], t[0, 75:86])
        assert soc.question_kind(item) == ("relational" if i % 20 >= 10 else "non_relational")


def test_relational_subsets_read_the_batched_question():
    ds = build_dataset(NAME, "train", size=2)
    x, y = next(iter(DataLoader(ds, batch_size=40)))               # the default collate: a dict of batches
    rel = get_task(NAME).subsets["relational"](x)
    assert rel.tolist() == [i % 20 >= 10 for i in range(40)]
    assert torch.equal(get_task(NAME).subsets["non_relational"](x), ~rel)
    logits = torch.nn.functional.one_hot(y, 10).float()
    logits[rel] = -logits[rel]                                      # wrong on every relational question
    logits[~rel & (torch.arange(40) % 20 < 5)] *= -1                 # and on half the non-relational ones
    assert soc.accuracy_by_kind(logits, y, x) == {"top1": 0.25, "top1_relational": 0.0, "top1_non_relational": 0.5}
    types = get_task(NAME).categories[0](x)
    assert types.tolist() == [3 * (i % 20 >= 10) + int(x["question"][i, 0, 8:].argmax()) for i in range(40)]
    with pytest.raises(ValueError, match=r"question vectors must be \[..., 11\]"):
        soc.is_relational({"x": x["x"], "question": torch.zeros(40, 1, 12)})


def test_a_vit_with_a_question_token_trains_and_reports_each_kind(tmp_path, capsys):
    overrides = ["model.name=vit_micro", "model.overrides.tokenizer.patch_size=15", "model.overrides.tokenizer.positions=absolute",
                 "data.task=sort_of_clevr_image", "data.params.size={train: 4, val: 2, test: 2}",
                 "data.batch_size=16", "max_steps=2", "progress=false", f"out_dir={tmp_path}"]
    cfg = load_config(None, overrides)
    model = build_model_for_task(cfg)
    assert model.config.question_dim == 11 and model.config.input_names() == ("x", "question")
    assert cli.main(["train", "--set", *overrides]) == 0
    val = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["val"]
    assert {"top1", "top1_relational", "top1_non_relational"} <= set(val)
    # 20 questions per image, half of each kind: overall accuracy is the mean of the two
    assert val["top1"] == pytest.approx((val["top1_relational"] + val["top1_non_relational"]) / 2)
