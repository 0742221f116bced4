"""WikiText-2 loader on a fixture written in the official layout (wikitext-2/wiki.*.tokens)."""
import pytest
import torch

from modwire.tasks import build_dataset, describe_task, get_task
from modwire.tasks.loaders import wikitext

TRAIN = " \n = Valkyria = \n the cat sat on the mat . \n a <unk> sat \n"
VALID = " the dog sat . \n"          # "dog" is not in train: <unk>
TEST = " a cat . \n"


def write_corpus(root, variant="tokens", train=TRAIN, valid=VALID, test=TEST):
    folder, suffix = wikitext.VARIANTS[variant]
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        (d / f"wiki.{name}.{suffix}").write_text(text, encoding="utf-8")
    return root


def test_vocabulary_is_first_appearance_order_of_train_with_eos_per_line(tmp_path):
    root = write_corpus(tmp_path)
    vocab = wikitext.vocabulary(root)
    assert vocab == ("<eos>", "=", "Valkyria", "the", "cat", "sat", "on", "mat", ".", "a", "<unk>")
    ds = build_dataset("wikitext2", "train", root=root, seq_len=4)
    # stream: <eos> | = Valkyria = <eos> | the cat sat on the mat . <eos> | a <unk> sat <eos>  (17 tokens)
    ids = [vocab.index(w) for w in "<eos> = Valkyria = <eos> the cat sat on the mat . <eos> a <unk> sat <eos>".split()]
    assert ds.ids.tolist() == ids
    assert len(ids) == 17 and len(ds) == (17 - 1) // 4 == 4          # the last partial chunk is dropped
    x, y = ds[1]
    assert x.dtype == y.dtype == torch.long
    assert x.tolist() == ids[4:8] and y.tolist() == ids[5:9]   # y is x shifted by one token
    x, y = ds[-1]
    assert x.tolist() == ids[12:16] and y.tolist() == ids[13:17]
    with pytest.raises(IndexError, match="out of range for 4 chunks"):
        ds[4]


def test_val_words_outside_train_become_unk_and_describe_counts_the_vocabulary(tmp_path):
    root = write_corpus(tmp_path)
    vocab = wikitext.vocabulary(root)
    ds = build_dataset("wikitext2", "val", root=root, seq_len=2)
    assert [vocab[i] for i in ds.ids.tolist()] == ["the", "<unk>", "sat", ".", "<eos>"]
    info = describe_task("wikitext2", {"root": str(root), "seq_len": 2})
    assert info.num_classes == len(vocab) == 11
    assert info.inputs.kind == "tokens" and info.inputs.length == 2 and info.inputs.vocab_size == 11
    assert info.loss == "token_cross_entropy" and info.metrics[0] == "perplexity"


def test_raw_variant_min_count_and_unk_appended(tmp_path):
    root = write_corpus(tmp_path, "raw", train="b a b\nc b a\n", valid="a z\n", test="c\n")
    assert wikitext.vocabulary(root, "raw") == ("b", "a", "<eos>", "c", "<unk>")
    assert wikitext.vocabulary(root, "raw", min_count=2) == ("b", "a", "<eos>", "<unk>")  # c seen once
    ds = build_dataset("wikitext2", "val", root=root, variant="raw", seq_len=1, min_count=2)
    assert ds.ids.tolist() == [1, 3, 2]      # a <unk> <eos>
    # the raw files sit in wikitext-2-raw/: the tokens variant finds nothing there
    with pytest.raises(FileNotFoundError, match="wiki.train.tokens"):
        build_dataset("wikitext2", "train", root=root)


def test_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="root=... is required"):
        build_dataset("wikitext2", "train")
    root = write_corpus(tmp_path)
    with pytest.raises(ValueError, match=r"parameter 'variant': got 'bpe', expected one of \['tokens', 'raw'\]"):
        build_dataset("wikitext2", "train", root=root, variant="bpe")
    with pytest.raises(ValueError, match=r"parameter 'seq_len': got 0, expected an integer >= 1"):
        build_dataset("wikitext2", "train", root=root, seq_len=0)
    with pytest.raises(ValueError, match="fewer than one chunk"):
        build_dataset("wikitext2", "test", root=root, seq_len=8)   # test has 4 tokens
    assert get_task("wikitext2").splits == ("train", "val", "test")


def test_without_files_the_official_vocabulary_is_described(tmp_path):
    assert describe_task("wikitext2").num_classes == wikitext.OFFICIAL_VOCAB == 33278
    assert describe_task("wikitext2", {"root": str(tmp_path / "nowhere")}).inputs.vocab_size == 33278
    with pytest.raises(ValueError, match="root=... is required"):
        describe_task("wikitext2", {"variant": "raw"})      # the raw release has no fixed size


def test_files_directly_under_root_are_found(tmp_path):
    root = write_corpus(tmp_path) / "wikitext-2"        # the folder itself as root
    assert len(build_dataset("wikitext2", "train", root=root, seq_len=2)) == (17 - 1) // 2
