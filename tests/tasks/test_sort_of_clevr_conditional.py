"""sort_of_clevr_conditional: the sort_of_clevr items split into image tokens (executor) and
question ids (circuit generator), NAC §4.4 / App. G."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from modwire.tasks import InputSpec, build_dataset, get_task
from modwire.tasks.synthetic import sort_of_clevr as soc

NAME = "sort_of_clevr_conditional"


def both(size=3, **kw):
    return build_dataset("sort_of_clevr", "train", size=size, **kw), build_dataset(NAME, "train", size=size, **kw)


def test_task_info():
    info = get_task(NAME)
    assert info.kind == "generator" and info.num_classes == 10 and info.loss == "cross_entropy"
    assert info.params == get_task("sort_of_clevr").params
    assert info.inputs == {"x": InputSpec.vectors(225, 77), "condition": InputSpec.tokens(3, 14)}
    assert info.resolve({"patch_size": 15}).inputs["x"] == InputSpec.vectors(25, 3 * 15 * 15 + 2)
    assert set(info.subsets) == {"relational", "non_relational"}
    # the old task is unchanged
    assert get_task("sort_of_clevr").inputs == InputSpec.vectors(225, 88)


def test_vocabulary():
    assert soc.CONDITION_VOCAB == ("red", "green", "blue", "orange", "gray", "yellow", "non_relational",
                                   "relational", "shape", "left", "top", "nearest_shape", "farthest_shape",
                                   "count_same_shape")
    assert soc.CONDITION_VOCAB_SIZE == 14 and soc.CONDITION_LEN == 3
    assert soc.QUESTION_TYPE_NAMES == ("non_relational/shape", "non_relational/left", "non_relational/top",
                                       "relational/nearest_shape", "relational/farthest_shape",
                                       "relational/count_same_shape")
    # every (colour, type, subtype) has its own ids; a subtype id alone gives the type
    for color in range(6):
        for rel in (0, 1):
            for sub in range(3):
                ids = soc.condition_ids(color, rel, sub)
                assert ids.dtype == np.int64 and ids.tolist() == [color, 6 + rel, 8 + 3 * rel + sub]
                names = [soc.CONDITION_VOCAB[i] for i in ids]
                sub_names = soc.RELATIONAL_SUBTYPES if rel else soc.NON_RELATIONAL_SUBTYPES
                assert names == [soc.COLORS[color], ("relational" if rel else "non_relational"), sub_names[sub]]
                assert soc.QUESTION_TYPE_NAMES[int(soc.question_type(torch.from_numpy(ids)))] == \
                    f"{names[1]}/{names[2]}"


def test_items_equal_sort_of_clevr_split_by_modality():
    old, new = both()
    assert len(new) == len(old) == 60
    for i in range(len(new)):
        (xo, yo), (inp, y) = old[i], new[i]
        assert set(inp) == {"x", "condition"}
        x, c = inp["x"], inp["condition"]
        assert x.dtype == torch.float32 and x.shape == (225, 77)
        assert c.dtype == torch.long and c.shape == (3,)
        # image tokens: the old tokens with the 11 question columns (75:86) removed
        assert torch.equal(x, torch.cat([xo[:, :75], xo[:, 86:]], 1))
        # condition ids decode back to the old one-hot question vector
        q = xo[0, 75:86]
        color, rel, sub = int(q[:6].argmax()), int(q[7]), int(q[8:].argmax())
        assert c.tolist() == [color, 6 + rel, 8 + 3 * rel + sub]
        assert torch.equal(soc.question_ids(xo), c)
        assert int(soc.question_type(c)) == 3 * rel + sub
        assert torch.equal(y, yo)
        assert soc.question_kind(inp) == soc.question_kind(xo) == soc.question_kind(c)


def test_answers_follow_the_scene():
    _, new = both(size=2)
    for i in range(len(new)):
        inp, y = new[i]
        sc = new.scene(i // 20)
        color, typ, sub = inp["condition"].tolist()
        rel = typ - 6
        assert sc.questions[i % 20].tolist() == [color, rel, sub - 8 - 3 * rel]
        assert int(y) == soc.answer(sc.centers, sc.shapes, color, rel, sub - 8 - 3 * rel)


def test_patch_size_and_determinism():
    old, new = both(size=1, patch_size=15)
    inp, y = new[12]
    assert inp["x"].shape == (25, 3 * 15 * 15 + 2)
    assert torch.equal(inp["x"], torch.cat([old[12][0][:, :675], old[12][0][:, 686:]], 1))
    a, b = build_dataset(NAME, "val", size=2), build_dataset(NAME, "val", size=2)
    for i in reversed(range(40)):
        assert torch.equal(a[i][0]["x"], b[i][0]["x"]) and torch.equal(a[i][0]["condition"], b[i][0]["condition"])
    other = build_dataset(NAME, "val", size=2, seed=1)
    assert not all(torch.equal(a[i][0]["x"], other[i][0]["x"]) for i in range(0, 40, 20))


def test_batched_dict_subsets_question_type_and_accuracy():
    old, new = both()
    info = get_task(NAME)
    batch, y = next(iter(DataLoader(new, batch_size=40, collate_fn=info.collate)))
    assert set(batch) == {"x", "condition"}
    assert batch["x"].shape == (40, 225, 77) and batch["condition"].shape == (40, 3)
    rel = info.subsets["relational"](batch)
    assert rel.tolist() == [i % 20 >= 10 for i in range(40)]
    assert torch.equal(info.subsets["non_relational"](batch), ~rel)
    types = soc.question_type(batch["condition"])
    assert torch.equal(soc.question_type(batch), types)
    assert types.dtype == torch.long and types.shape == (40,)
    assert torch.equal(types >= 3, rel)  # classes 3-5 are the relational subtypes
    assert torch.equal(types, batch["condition"][:, 2] - 8)
    # the old task: same masks from its token input
    xo = torch.stack([old[i][0] for i in range(40)])
    assert torch.equal(soc.is_relational(xo), rel) and torch.equal(soc.question_type(xo), types)
    assert torch.equal(get_task("sort_of_clevr").subsets["non_relational"](xo), ~rel)
    logits = torch.nn.functional.one_hot(y, 10).float()
    logits[rel] = -logits[rel]
    assert soc.accuracy_by_kind(logits, y, batch) == {"top1": 0.5, "top1_relational": 0.0, "top1_non_relational": 1.0}


def test_invalid_condition_ids_are_refused():
    with pytest.raises(ValueError, match="CONDITION_VOCAB"):
        soc.question_type(torch.tensor([0, 6, 11]))  # relational subtype with the non-relational type
    with pytest.raises(ValueError, match="CONDITION_VOCAB"):
        soc.question_type(torch.tensor([[6, 6, 8]]))  # colour id out of range
    assert soc.question_type(torch.tensor([[2.0, 7.0, 13.0]])).tolist() == [5]  # ids cast to float still read
    with pytest.raises(ValueError, match=r"\[\.\.\., 3\]"):
        soc.question_type(torch.tensor([0, 6]))
    with pytest.raises(ValueError, match="one input"):
        soc.question_kind(torch.tensor([[0, 6, 8], [1, 7, 11]]))
