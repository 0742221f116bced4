"""Sequence targets in the trainer (``token_cross_entropy``, perplexity) on a WikiText-2 fixture."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from modwire import cli
from modwire.tasks import build_dataset, get_task
from modwire.tasks.metrics import IGNORE_INDEX, compute_metrics, token_sums
from modwire.training import evaluate, load_config, make_loader, train
from modwire.training.runtime import check_labels, compute_loss


def _corpus(root, lines=60):
    """A learnable corpus in the official layout: counting sentences 'w3 w4 w5 w6 .' and so on."""
    d = root / "wikitext-2"
    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for name, n in (("train", lines), ("valid", 12), ("test", 12)):
        starts = torch.randint(0, 12, (n,), generator=g).tolist()
        text = "".join(" " + " ".join(f"w{s + i}" for i in range(5)) + " . \n" for s in starts)
        (d / f"wiki.{name}.tokens").write_text(text)
    return root


def test_token_loss_and_metrics_match_their_definitions():
    logits, y = torch.randn(3, 4, 7), torch.randint(0, 7, (3, 4))
    y[0, 1] = IGNORE_INDEX
    info = get_task("wikitext2")
    keep = y != IGNORE_INDEX
    ce = F.cross_entropy(logits[keep], y[keep])
    torch.testing.assert_close(compute_loss(info, logits, y), ce)
    m = compute_metrics(("perplexity", "token_top1"), logits, y)
    assert m["perplexity"] == pytest.approx(math.exp(ce.item()), rel=1e-6)
    assert m["token_top1"] == pytest.approx((logits.argmax(-1) == y)[keep].float().mean().item())
    s = token_sums(logits[:2], y[:2]) + token_sums(logits[2:], y[2:])          # additive over batches
    torch.testing.assert_close(s, token_sums(logits, y))
    with pytest.raises(ValueError, match="expected logits \\[B, T, V\\] for targets \\[3, 4\\], got logits \\[3, 7\\]"):
        compute_loss(info, logits[:, 0], y)
    with pytest.raises(ValueError, match="gave label 7, but the model has 7 classes"):
        check_labels(torch.tensor([[0, 7]]), info, 7)
    check_labels(torch.tensor([[0, IGNORE_INDEX]]), info, 7)                    # unscored ids pass


def _cfg(tmp_path, root, *extra):
    return load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=nfm_transformer_lm_micro",
                              "data.task=wikitext2", f"data.params.root={root}", "data.params.seq_len=8",
                              "data.batch_size=8", "epochs=6", "optim.lr=3e-3", "optim.warmup_steps=0",
                              "progress=false", "log_every=1", *extra])


def test_lm_trains_streams_perplexity_and_keeps_the_lowest(tmp_path, capsys):
    root = _corpus(tmp_path / "data")
    result = train(_cfg(tmp_path, root))
    records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    vals = [r for r in records if "val_perplexity" in r]
    assert len(vals) == 6
    for r in vals:
        assert r["val_perplexity"] == pytest.approx(math.exp(r["val_loss"]))
    vocab = len(build_dataset("wikitext2", "train", root=root, seq_len=8).vocab)
    assert vals[0]["val_perplexity"] < vocab and vals[-1]["val_perplexity"] < 0.6 * vals[0]["val_perplexity"]
    best = min(vals, key=lambda r: r["val_perplexity"])
    assert result["best"] == {"perplexity": best["val_perplexity"], "step": best["step"]}   # lower is better
    # the streamed evaluation equals one pass over all logits at once
    model = result["model"].eval()
    info = get_task("wikitext2")
    val = build_dataset("wikitext2", "val", root=root, seq_len=8)
    streamed = evaluate(model, make_loader(val, 3, None, info, 0, drop_last=False), info, torch.device("cpu"))
    x = torch.stack([val[i][0] for i in range(len(val))])
    y = torch.stack([val[i][1] for i in range(len(val))])
    with torch.no_grad():
        whole = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    assert streamed["loss"] == pytest.approx(whole, rel=1e-5)
    assert streamed["perplexity"] == pytest.approx(math.exp(whole), rel=1e-5)
    # `modwire eval` reproduces it, and takes the random-attention option (NFM §4.4)
    assert cli.main(["eval", str(tmp_path / "run" / "checkpoints" / "last")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["perplexity"] == pytest.approx(result["val"]["perplexity"], rel=1e-6)
    assert cli.main(["eval", str(tmp_path / "run" / "checkpoints" / "last"), "--set",
                     "model.overrides.random_attention=true"]) == 0
    noisy = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert noisy["perplexity"] != pytest.approx(out["perplexity"], rel=1e-6)
