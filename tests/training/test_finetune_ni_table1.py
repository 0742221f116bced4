"""NI Table 1's parameter sets (§4.1): the new CLS tokens feed the pre-trained shared regression
head, which ``new_task`` keeps; "Finetuning CLS Tokens" (``cls``) trains the tokens alone, and
``cls,heads`` (the option that departs from Table 1) trains the kept head as well."""
import pytest
import torch

from modwire import cli, create_model
from modwire.models import from_pretrained
from modwire.training.checkpoint import choose_checkpoint
from modwire.training.finetune_setup import select_trainable

SMALL = dict(d_model=16, d_code=16, type_hidden=16, ffn_hidden=16)


def _fuzzy(seed: int = 0):
    torch.manual_seed(seed)
    return create_model("ni_fuzzy_boolean", **SMALL)


def _step(model, names) -> dict[str, torch.Tensor]:
    """Freeze all but the sets ``names``, take one SGD step on a random regression; the state before."""
    select_trainable(model, names)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    x = torch.rand(8, 5, 1, generator=torch.Generator().manual_seed(1))
    model(x).sub(0.5).square().mean().backward()
    opt.step()
    return before


def _changed(model, before) -> set[str]:
    return {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}


def test_new_task_keeps_the_shared_head_and_cls_trains_the_cls_tokens_only():
    model = _fuzzy()
    head = {k: v.clone() for k, v in model.heads.state_dict().items()}
    model.new_task(1, heads=10)                                   # 10 new functions, one regression each
    assert model.config.num_cls_tokens == 10 and model.cls_tokens.shape == (10, 16)
    assert all(torch.equal(v, head[k]) for k, v in model.heads.state_dict().items())
    assert model.parameter_sets()["cls"] == ("cls_tokens",)
    before = _step(model, ["cls"])
    assert _changed(model, before) == {"cls_tokens"}
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["cls_tokens"]


def test_the_cls_heads_option_also_trains_the_kept_head():
    model = _fuzzy()
    model.new_task(1, heads=10)
    before = _step(model, ["cls", "heads"])
    assert _changed(model, before) == {"cls_tokens", "heads.weight", "heads.bias"}


@pytest.mark.parametrize("preset,classes", [("ni_fuzzy_boolean", 3), ("ni_micro", 4), ("vit_micro", 4)])
def test_new_heads_are_fresh_and_in_cls_when_the_head_cannot_be_kept(preset, classes):
    """A shared head of another width, or one head per CLS token: fresh heads, trained with ``cls``."""
    torch.manual_seed(0)
    model = create_model(preset, **(SMALL if preset == "ni_fuzzy_boolean" else {}))
    old = model.heads
    model.new_task(classes, heads=2)
    assert model.heads is not old and model.heads.weight.shape[-2] == classes and not model.config.head_pretrained
    assert model.parameter_sets()["cls"] == ("cls_tokens", "heads.")


def test_finetune_cls_leaves_the_pretrained_shared_head_bit_identical(tmp_path):
    """End to end through ``modwire train`` / ``modwire finetune --train cls`` (NI Table 1, row 2)."""
    run, out = tmp_path / "pre", tmp_path / "ft"
    size = "data.params.size={train: 64, val: 32}"
    small = "model.overrides={d_model: 16, d_code: 16, type_hidden: 16, ffn_hidden: 16}"
    assert cli.main(["train", "--set", "model.name=ni_fuzzy_boolean", "data.task=fuzzy_boolean", f"out_dir={run}",
                     "max_steps=2", "progress=false", "data.batch_size=32", size, small]) == 0
    assert cli.main(["finetune", str(run), "--task", "fuzzy_boolean_adapt", "--train", "cls", "--seeds", "0",
                     "--epochs", "1", "--batch-size", "32", "--out", str(out), "--set", size, "progress=false"]) == 0
    b = from_pretrained(choose_checkpoint(run)[0]).state_dict()
    a = from_pretrained(choose_checkpoint(out / "seed-0")[0]).state_dict()
    assert a["cls_tokens"].shape[0] == 10 and not torch.equal(a["cls_tokens"][:10], b["cls_tokens"][:10])
    assert all(torch.equal(a[k], b[k]) for k in a if k != "cls_tokens")
    reloaded = from_pretrained(choose_checkpoint(out / "seed-0")[0])    # the kept head is still known as kept
    assert reloaded.config.head_pretrained and reloaded.parameter_sets()["cls"] == ("cls_tokens",)


def test_head_pretrained_needs_a_shared_head():
    with pytest.raises(ValueError, match="'head_pretrained': only a shared head .* got shared_head=false"):
        create_model("vit_micro", head_pretrained=True)
