"""Labels the model cannot score: at evaluation (``modwire eval --task`` / ``--set
data.params.root=`` of a dataset with more classes than the run was trained on) and float
labels on a classification task give one clear error, not torch's IndexError / dtype
traceback."""
import pytest
import torch

import toy_task  # noqa: F401  (registers "toy_sets")
from modwire.tasks import get_task
from modwire.training import evaluate, load_config, train
from modwire.training.runtime import check_labels


class Linear2(torch.nn.Module):
    """[B, 6, 8] -> [B, 2] logits: a model with 2 classes."""
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x.mean(1))


def _loader(labels):
    return [(torch.randn(len(labels), 6, 8), torch.tensor(labels))]


def test_eval_on_labels_beyond_the_models_classes_names_label_and_count():
    info = get_task("toy_sets")
    with pytest.raises(ValueError, match=r"task 'toy_sets' gave label 4, but the model has 2 classes"):
        evaluate(Linear2(), _loader([0, 1, 4]), info, torch.device("cpu"))


def test_eval_within_the_classes_still_scores():
    info = get_task("toy_sets")
    model = Linear2()
    x = torch.randn(4, 6, 8)
    y = model(x).argmax(-1)                              # labels the model gets all right
    metrics = evaluate(model, [(x, y)], info, torch.device("cpu"))
    assert metrics["top1"] == pytest.approx(1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_float_or_bool_labels_on_classification_are_refused(dtype):
    info = get_task("toy_sets")
    with pytest.raises(ValueError, match=rf"gave {dtype} labels, but classification expects integer class"):
        check_labels(torch.tensor([0, 1, 1]).to(dtype), info, 2)


def test_soft_targets_pass_the_label_check():
    check_labels(torch.full((3, 2), 0.5), get_task("toy_sets"), 2)   # mixup / cutmix targets [B, C]


class FloatLabels(torch.utils.data.Dataset):
    def __init__(self, split):
        pass

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.randn(6, 8), torch.tensor(float(i % 2))


def test_training_on_float_labels_says_so(tmp_path, monkeypatch):
    from modwire.tasks import InputSpec, TaskInfo, base, register_task

    monkeypatch.setattr(base, "_TASKS", dict(base._TASKS))
    register_task(TaskInfo("toy_float_labels", "generator", "test task with float labels", 2,
                           InputSpec.vectors(6, 8), params={}), FloatLabels)
    with pytest.raises(ValueError, match=r"task 'toy_float_labels' gave torch.float32 labels"):
        train(load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=nac_micro", "data.batch_size=8",
                                 "data.task=toy_float_labels", "max_steps=1", "progress=false"]))
