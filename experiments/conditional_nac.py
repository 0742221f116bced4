"""Conditional NAC at CPU scale: one modality designs the circuit, the other is executed
(NAC §2.2, §4.4, App. G, Fig. 6).

The paper trains a conditional NAC on NLVR2 (CLIP features; 64% validation accuracy against
CLIP zero-shot's 53%) and shows qualitatively that "different sentence types are assigned to
different graph structures" (Fig. 6). CLIP and NLVR2 cannot be had offline, so this runs the
same experiment on built-in Sort-of-CLEVR: the question (colour, question type, subtype as 3
token ids) is the generator's input, the image the executor's.

It trains ``configs/cpu/nac_conditional_sort_of_clevr.yaml`` (``--epochs``), then prints, next
to the paper's numbers:

* relational and non-relational test accuracy against two baselines computed from the data:
  the majority answer of each family, and a question-only model that answers each
  (type, subtype) with its most frequent training answer (what a model that ignores the
  image can reach);
* Fig. 6's claim as a number: the held-out nearest-centroid accuracy of the question type
  from PCA-64 of the per-sample ``P``, for the trained generator and, as a control, for the
  same generator at initialisation (distinct inputs give distinct ``P`` even untrained, so
  the control says how much of the separation training adds);
* the Fig. 6 plots (``link_prob_embedding.png``, ``sample_graphs.png``) in ``OUT/analysis``.

Run: ``python experiments/conditional_nac.py`` (about 6 minutes on 2 cores; ``--quick`` for a
smoke test). Single-threaded torch is used: on a shared 2-core machine it was 15× faster per
step than two threads competing with other work. The numbers go to ``OUT/experiment.json`` and
the study run's record to ``OUT/study.json`` (``experiments/common.py``).
"""
from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))     # experiments/common.py, also when loaded by path
import common  # noqa: E402

CONFIG = common.ROOT / "configs" / "cpu" / "nac_conditional_sort_of_clevr.yaml"
PAPER = {"NLVR2 val accuracy, conditional NAC": "~64%", "CLIP zero-shot": "53%",
         "Fig. 6": "different sentence types -> different graph structures (qualitative)"}


def question_baselines(train_set, test_set, limit: int = 20_000) -> dict[str, dict[str, float]]:
    """Majority-answer and question-only accuracy per family (relational / non-relational)."""
    from modwire.tasks.synthetic.sort_of_clevr import is_relational, question_type

    best: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for i in range(min(limit, len(train_set))):
        x, y = train_set[i]
        best[int(question_type(x["condition"][None])[0])][int(y)] += 1
    answer = {t: c.most_common(1)[0][0] for t, c in best.items()}
    hits, counts = collections.defaultdict(list), collections.defaultdict(collections.Counter)
    for i in range(len(test_set)):
        x, y = test_set[i]
        fam = "relational" if bool(is_relational(x["condition"][None])[0]) else "non_relational"
        hits[fam].append(answer.get(int(question_type(x["condition"][None])[0])) == int(y))
        counts[fam][int(y)] += 1
    return {fam: {"majority": counts[fam].most_common(1)[0][1] / len(hits[fam]),
                  "question_only": sum(hits[fam]) / len(hits[fam])} for fam in hits}


def separation(model, dataset, info, max_samples: int) -> dict:
    from modwire.analysis.circuits import collect_link_probs
    from modwire.analysis.conditional import embed_link_probs, separation_score

    p, labels, _ = collect_link_probs(model.eval(), dataset, info, max_samples=max_samples)
    emb, _ = embed_link_probs(p)
    return separation_score(emb, labels)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "runs/experiments/conditional_nac", "a few steps on a tiny split")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overwrite", action="store_true", help="replace an earlier run in --out (else refused)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)
    from modwire.analysis.circuits import analyze_circuits
    from modwire.tasks import build_dataset, get_task
    from modwire.training import build_model_for_task, evaluate, load_config, train
    from modwire.training.trainer import make_loader

    sets = [f"out_dir={args.out}", f"epochs={args.epochs}", f"seed={args.seed}", "progress=false"]
    if args.quick:
        sets += ["max_steps=4", "data.params.size={train: 20, val: 10, test: 10}", "data.batch_size=16"]
    cfg = load_config(str(CONFIG), sets)
    info = get_task(cfg.data.task)
    torch.manual_seed(cfg.seed)
    untrained = build_model_for_task(cfg)                       # the same init as train() draws
    result = train(cfg, overwrite=args.overwrite)
    from modwire.analysis.report import load_run

    _, model, _, test_set = load_run(args.out, split="test")
    metrics = evaluate(model, make_loader(test_set, 64, None, info, 0, drop_last=False), info, torch.device("cpu"))
    train_set = build_dataset(cfg.data.task, "train", **cfg.data.params)
    base = question_baselines(train_set, test_set)
    n = 60 if args.quick else 1200
    sep_init, sep_trained = separation(untrained, test_set, info, n), separation(model, test_set, info, n)
    report = analyze_circuits(args.out, split="test", max_samples=n, log=lambda s: None)
    rows = [(fam, metrics[f"top1_{fam}"], base[fam]["majority"], base[fam]["question_only"])
            for fam in ("non_relational", "relational")]
    print(f"\nconditional NAC on Sort-of-CLEVR ({cfg.epochs} epochs, {result['step']} steps), test split:")
    print(f"{'questions':<16}{'NAC':>8}{'majority':>10}{'question-only':>15}")
    for fam, acc, maj, q in rows:
        print(f"{fam:<16}{acc:>8.3f}{maj:>10.3f}{q:>15.3f}")
    print(f"\nquestion type from PCA-{sep_trained['embedding_dim']} of P (held-out nearest centroid, "
          f"{sep_trained['num_samples']} samples, 6 types): trained {sep_trained['accuracy']:.3f}, "
          f"at initialisation {sep_init['accuracy']:.3f}, chance {sep_trained['chance']:.3f}, "
          f"shuffled labels {sep_trained['permutation']['mean']:.3f}")
    print("paper (NAC §4.4, NLVR2 with CLIP features): " + "; ".join(f"{k}: {v}" for k, v in PAPER.items()))
    print(f"plots: {args.out / 'analysis'}")
    summary = {"test": metrics, "baselines": base, "separation_trained": sep_trained,
               "separation_init": sep_init, "paper": PAPER, "fig6": report["files"]}
    common.write_json_atomic(args.out / "experiment.json", summary)
    common.write_study(args.out, "conditional_nac", [summary], config=args, seeds=[args.seed], started=started)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except (ValueError, FileNotFoundError, KeyError) as e:   # e.g. --out holds an earlier run
        raise SystemExit(f"conditional_nac.py: error: {e} (this script: --overwrite)")
