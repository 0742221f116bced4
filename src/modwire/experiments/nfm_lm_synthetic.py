"""The transformer LM with and without NFM on a generated corpus, offline and CPU-sized (NFM §4.6).

WikiText-2 is not shipped and nothing is downloaded, so this shows the language-modelling path
(the ``wikitext2`` loader, sequence targets, perplexity, the NFM reader that reuses each block's
attention projections) end to end on a corpus written in WikiText-2's layout
(``wikitext-2/wiki.{train,valid,test}.tokens``) by a small probabilistic grammar: headings
`` = topic = ``, sentences with subject-verb number agreement across an optional relative clause
(``the old dogs that the cat sees run .``), optional prepositional phrases and a few rare words
replaced by ``<unk>``. It is NOT Table 8: the paper's 31.12 / 30.78 perplexities are WikiText-2
numbers of a model we could not recover (its appendix is missing from our copy).

Models: 4 causal pre-LN layers of 64-d, 4 heads, FFN 128, contexts of 32 tokens, tied embeddings,
no dropout; ``nfm`` adds the Table 8 reader (one pass, top-5, one γ per layer: +4 parameters) and
``nfm_2pass`` two passes over the same blocks (+8 parameters, twice the compute). Each trains with
the library's trainer (AdamW 3e-3, 30 warm-up steps, cosine, batch 32) for ``--steps`` steps on
one thread, once per training seed (``--seeds N``: seeds 0 .. N-1, default 3; the trainer's
``seed=`` sets the initialisation and the batch order). The corpus is generated once, from seed 0,
for every seed, so the seeds vary only the training, not the data. Validation perplexity is
reported per variant as mean ± sample std over the seeds, with each seed's value, and, for the NFM
variants, what the readers read on 4 validation batches (:mod:`modwire.analysis.nfm`: mean
attention mass on the null slot, top-down share for the second pass; seed 0's heatmap
``OUT/read_map_<variant>.png``).

Run: ``OMP_NUM_THREADS=1 python -m modwire.experiments.nfm_lm_synthetic`` (about 3 minutes a seed on one
core); ``--quick`` for a smoke test (one seed unless ``--seeds`` says otherwise). Writes
``OUT/results.json`` (one record per variant and seed, with its ``seed`` and its wall time
``seconds``; rewritten after each run), ``OUT/table.md`` and the study run's record
``OUT/study.json`` (:mod:`modwire.experiments.common`); ``--report`` reprints the table and rebuilds
``OUT/study.json`` from ``OUT/results.json`` (no training; a record without ``seed`` is seed 0).
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from modwire.experiments import common
from modwire.files import atomic_write_text

MODEL = {"d_model": 64, "num_layers": 4, "num_heads": 4, "ffn_hidden": 128, "dropout": 0.0}
VARIANTS = {"base": ("transformer_lm_micro", {"nfm": {"enabled": False}}),
            "nfm": ("transformer_lm_micro", {"nfm": {"enabled": True, "passes": 1, "k": 5,
                                                     "score_scale": "sqrt_d_k"}}),
            "nfm_2pass": ("transformer_lm_micro", {"nfm": {"enabled": True, "passes": 2, "k": 5,
                                                           "share_blocks": True, "score_scale": "sqrt_d_k"}})}

NOUNS = ["dog", "cat", "bird", "king", "ship", "river", "city", "song", "child", "storm", "army", "engine"]
ADJS = ["old", "young", "red", "quiet", "great", "small", "dark", "famous"]
VERBS = ["run", "sing", "fall", "grow", "win", "sleep", "return", "burn"]
TVERBS = ["see", "follow", "fear", "love", "find", "build"]
PREPS = ["near", "under", "behind", "across", "with"]
TOPICS = ["history", "geography", "music", "war", "biology", "sport"]


def _noun_phrase(rng, plural: bool) -> list[str]:
    det = rng.choice(["the", "some", "many"] if plural else ["the", "a", "one"])
    words = [str(det)] + ([str(rng.choice(ADJS))] if rng.random() < 0.5 else [])
    noun = str(rng.choice(NOUNS))
    return words + [noun + "s" if plural else noun]


def _verb(rng, plural: bool, table=VERBS) -> str:
    v = str(rng.choice(table))
    return v if plural else v + ("es" if v.endswith(("h", "s")) else "s")


def sentence(rng) -> list[str]:
    """Subject (relative clause?) verb (object?) (prepositional phrase?) '.' with number agreement."""
    plural = bool(rng.random() < 0.5)
    words = _noun_phrase(rng, plural)
    if rng.random() < 0.4:                                   # the verb agrees across the clause
        inner = bool(rng.random() < 0.5)
        words += ["that"] + _noun_phrase(rng, inner) + [_verb(rng, inner, TVERBS)]
    if rng.random() < 0.5:
        words += [_verb(rng, plural, TVERBS)] + _noun_phrase(rng, bool(rng.random() < 0.5))
    else:
        words += [_verb(rng, plural)]
    if rng.random() < 0.3:
        words += [str(rng.choice(PREPS))] + _noun_phrase(rng, bool(rng.random() < 0.5))
    return [w if rng.random() > 0.01 else "<unk>" for w in words] + ["."]


def corpus(rng, paragraphs: int) -> str:
    """WikiText-style text: blank lines, `` = topic = `` headings, paragraphs of sentences."""
    lines = []
    for p in range(paragraphs):
        if p % 8 == 0:
            lines += [" ", f" = {rng.choice(TOPICS)} = ", " "]
        lines.append(" " + " ".join(w for _ in range(int(rng.integers(2, 6))) for w in sentence(rng)) + " ")
    return "\n".join(lines) + "\n"


def write_corpus(root: Path, paragraphs: int, seed: int = 0) -> Path:
    """``root/wikitext-2/wiki.{train,valid,test}.tokens`` (valid and test: a tenth of train each)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    d = root / "wikitext-2"
    d.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", paragraphs), ("valid", max(paragraphs // 10, 8)), ("test", max(paragraphs // 10, 8))):
        (d / f"wiki.{name}.tokens").write_text(corpus(rng, n), encoding="utf-8")
    return root


def run_variant(name: str, data: Path, out: Path, steps: int, plots: Path | None = None, seed: int = 0) -> dict:
    """One variant trained with training seed ``seed`` on the corpus at ``data``: its record (validation
    metrics, parameters, the readers' γ and reads, the run's wall time ``seconds``)."""
    from modwire.training import load_config, train

    preset, extra = VARIANTS[name]
    values = {"out_dir": out / f"{name}-seed{seed}", "model.name": preset, "data.task": "wikitext2",
              "data.params.root": data, "data.params.seq_len": 32, "data.batch_size": 32, "epochs": 1000,
              "max_steps": steps, "optim.lr": 3e-3, "optim.warmup_steps": 30, "optim.weight_decay": 0.01,
              "progress": False, "log_every": max(steps // 10, 1), "checkpoint_every": 0, "seed": seed,
              "model.overrides": {**MODEL, "nfm": extra["nfm"]}}
    start = time.perf_counter()
    result = train(load_config(values=values), overwrite=True)
    model = result["model"]
    seconds = round(time.perf_counter() - start, 1)
    gammas = [round(float(g.detach()), 4) for g in model.body.gammas]
    reads = _reads(model, data, name, plots) if gammas else {}
    return {"variant": name, "seed": seed, "steps": result["step"], "val": result["val"],
            "parameters": model.num_parameters(), "gammas": gammas, "reads": reads, "seconds": seconds}


def _reads(model, data: Path, name: str, plots: Path | None) -> dict:
    """What the readers read on 4 validation batches (null mass; top-down share with two passes)."""
    from torch.utils.data import DataLoader

    from modwire.analysis.nfm import plot_read_map, read_map
    from modwire.tasks import build_dataset

    val = build_dataset("wikitext2", "val", root=data, seq_len=32)
    rm = read_map(model, DataLoader(val, batch_size=32), max_batches=4)
    if plots is not None:
        plot_read_map(rm, plots / f"read_map_{name}.png")
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in rm.summary().items()}


def _spread(rows: list[dict], value, digits: int = 3) -> str:
    """``value(record)``'s mean ± sample std over ``rows`` (``-`` where no record has a number; NaN,
    e.g. one pass's top-down share, is left out)."""
    got = [v for v in map(value, rows) if isinstance(v, (int, float)) and v == v]
    return common.format_mean_std(got, digits, empty="-")


def format_table(rows: list[dict]) -> str:
    """Per variant, mean ± sample std over the seeds: validation perplexity (and each seed's), token
    top-1, what the readers read, each seed's wall time; then one line per run with the learned γ
    (NFM §4.6's reader; not Table 8's data)."""
    variants = {r["variant"]: [s for s in rows if s["variant"] == r["variant"]] for r in rows}
    summary = common.markdown_table(
        ["variant", "parameters", "seeds", "val perplexity", "per seed", "val token top-1", "null mass",
         "top-down share", "seconds per seed"],
        [[name, f"{runs[0]['parameters']:,}", len(runs), _spread(runs, lambda r: r["val"]["perplexity"]),
          ", ".join(f"{r['val']['perplexity']:.3f}" for r in _by_seed(runs)),
          _spread(runs, lambda r: r["val"]["token_top1"]), _spread(runs, lambda r: r["reads"].get("null_mass")),
          _spread(runs, lambda r: r["reads"].get("top_down_share")),
          ", ".join(str(r["seconds"]) for r in _by_seed(runs))] for name, runs in variants.items()])
    per_run = common.markdown_table(
        ["variant", "seed", "val perplexity", "val token top-1", "γ after training", "null mass", "top-down share",
         "seconds"],
        [[r["variant"], r.get("seed", 0), f"{r['val']['perplexity']:.3f}", f"{r['val']['token_top1']:.3f}",
          ", ".join(map(str, r["gammas"])) or "-", r["reads"].get("null_mass", "-"),
          r["reads"].get("top_down_share", "-"), r["seconds"]] for r in rows])
    return summary + "\n\n" + per_run


def _by_seed(runs: list[dict]) -> list[dict]:
    """``runs`` in seed order (a record without ``seed`` is seed 0)."""
    return sorted(runs, key=lambda r: r.get("seed", 0))


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, None, "4 steps, 60 paragraphs, one seed unless --seeds",
                       report="reprint the table from OUT/results.json and rebuild OUT/study.json (no training)",
                       results="nfm_lm_synthetic")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--paragraphs", type=int, default=2000)
    ap.add_argument("--seeds", type=common.positive, default=None,
                    help="training seeds 0 .. N-1 (default 3; 1 with --quick); the corpus stays seed 0's")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    if args.quick:
        args.steps, args.paragraphs = 4, 60
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = common.read_log(args.out / "results.json", __file__) if args.report else train_variants(args)
    table = format_table(rows)
    atomic_write_text(args.out / "table.md", table + "\n")
    common.finish_study(args.out, "nfm_lm_synthetic", rows, args=args, started=started, seeds=common.seeds_of(rows),
                        logs=[args.out / "results.json"], script=__file__, argv=argv)
    print(table)
    return 0


def train_variants(args) -> list[dict]:
    """Every variant for each of ``args.seeds`` training seeds (seed-major) on one corpus written from
    seed 0; the records go to ``OUT/results.json`` after each run, so a killed study keeps its runs."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = write_corpus(Path(tmp) / "data", args.paragraphs, seed=0)
        for seed in range(args.seeds):
            for name in VARIANTS:
                rows.append(run_variant(name, data, Path(tmp) / "runs", args.steps,
                                        args.out if seed == 0 else None, seed=seed))
                print(json.dumps(rows[-1]), flush=True)
                common.write_json_atomic(args.out / "results.json", rows)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
