"""Conditional NAC at CPU scale: one modality designs the circuit, the other is executed
(NAC §2.2, §4.4, App. G, Fig. 6).

The paper trains a conditional NAC on NLVR2 (CLIP features; 64% validation accuracy against
CLIP zero-shot's 53%) and shows qualitatively that "different sentence types are assigned to
different graph structures" (Fig. 6). CLIP and NLVR2 cannot be had offline, so this runs the
same experiment on built-in Sort-of-CLEVR: the question (colour, question type, subtype as 3
token ids) is the generator's input, the image the executor's.

For each seed (``--seeds``) it trains ``configs/cpu/nac_conditional_sort_of_clevr.yaml``
(``--epochs``) into ``OUT/seed_S``, then measures, next to the paper's numbers:

* relational and non-relational test accuracy against two baselines computed from the data:
  the majority answer of each family, and a question-only model that answers each
  (type, subtype) with its most frequent training answer (what a model that ignores the
  image can reach); and the same accuracy with the image replaced by the next image of the
  split (same question) or by a blank (white) image: does the executor read the image?
* Fig. 6's claim as a number: the held-out nearest-centroid accuracy of the question type
  (``question_type``, the 6 subtype ids) from PCA-64 of the per-sample ``P``, for the trained
  generator and, as a control, for the same generator at initialisation; the same score for
  every other label of the question (colour, relational or not, the whole question) and for the
  answer, with chance and shuffled labels, and for a one-hot code of the question (what the
  same classifier reads from a representation that holds the question and nothing else);
  the question type again with colour's mean removed from ``P``;
* what ``P`` is a function of: an ANOVA of ``P`` over colour, relational and question type
  (fractions of its variance; ``variance_decomposition``);
* the graphs of the 36 distinct questions: density of ``P > 0.5``, mean ``P``, entropy of the
  rows of ``K̂``, greedy modularity (weighted, shuffled-weights control, thresholded), by
  question type, for the trained and the untrained generator (``graph_statistics``);
* the Fig. 6 plots (``link_prob_embedding.png``, ``sample_graphs.png``) in ``OUT/seed_S/analysis``.

Run: ``python -m modwire.experiments.conditional_nac`` (about 3.5 minutes per seed on a free core;
``--quick`` for a smoke test). Single-threaded torch is used: on a shared 2-core machine it was
15× faster per step than two threads competing with other work. The numbers go to
``OUT/experiment.json`` and the study run's record, one result per seed, to ``OUT/study.json``
(:mod:`modwire.experiments.common`).
"""
from __future__ import annotations

import collections
import math
import time

import numpy as np
import torch

from modwire.experiments import common

CONFIG = common.CONFIGS / "cpu" / "nac_conditional_sort_of_clevr.yaml"
PAPER = {"NLVR2 val accuracy, conditional NAC": "~64%", "CLIP zero-shot": "53%",
         "Fig. 6": "different sentence types -> different graph structures (qualitative)"}
LABELS = ("question_type", "relational", "colour", "question", "answer")   # what P is scored on
GENERATORS = ("trained", "untrained")
GRAPH_STATS = ("density", "mean_p", "row_entropy", "modularity", "modularity_shuffled", "communities",
               "modularity_edges", "communities_edges")


def question_baselines(train_set, test_set, limit: int = 20_000) -> tuple[dict, dict]:
    """Per family (relational / non-relational): the majority answer's accuracy, and two
    question-only models, each answering with the most frequent training answer of its
    question type (``question_only``) or of its whole question, type and colour
    (``question_only_36``); and ``question_only`` per question type."""
    from modwire.tasks.synthetic.sort_of_clevr import QUESTION_TYPE_NAMES, is_relational, question_type

    def keys(x) -> tuple[int, tuple[int, int]]:
        t = int(question_type(x["condition"][None])[0])
        return t, (t, int(x["condition"][0]))
    best: dict = collections.defaultdict(collections.Counter)
    for i in range(min(limit, len(train_set))):
        x, y = train_set[i]
        for k in keys(x):
            best[k][int(y)] += 1
    answer = {k: c.most_common(1)[0][0] for k, c in best.items()}
    hits, counts, by_type = (collections.defaultdict(list), collections.defaultdict(collections.Counter),
                             collections.defaultdict(list))
    for i in range(len(test_set)):
        x, y = test_set[i]
        fam = "relational" if bool(is_relational(x["condition"][None])[0]) else "non_relational"
        t, q = keys(x)
        hits[fam].append((answer.get(t) == int(y), answer.get(q) == int(y)))
        by_type[QUESTION_TYPE_NAMES[t]].append(answer.get(t) == int(y))
        counts[fam][int(y)] += 1
    return ({fam: {"majority": counts[fam].most_common(1)[0][1] / len(h),
                   "question_only": float(np.mean([a for a, _ in h])),
                   "question_only_36": float(np.mean([b for _, b in h]))} for fam, h in hits.items()},
            {t: float(np.mean(h)) for t, h in sorted(by_type.items())})


def test_labels(dataset, n: int) -> dict[str, np.ndarray]:
    """The labels of the first ``n`` items: each of the question's and the answer, ``[n]`` each."""
    ids, answers = zip(*((x["condition"], int(y)) for x, y in (dataset[i] for i in range(min(n, len(dataset))))))
    ids = torch.stack(ids).numpy()
    from modwire.tasks.synthetic.sort_of_clevr import SUBTYPE_ID, TYPE_ID

    qtype = ids[:, 2] - SUBTYPE_ID
    return {"question_type": qtype, "relational": ids[:, 1] - TYPE_ID, "colour": ids[:, 0],
            "question": ids[:, 0] * 6 + qtype, "answer": np.asarray(answers)}


def all_questions() -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The 36 distinct questions as condition ids ``[36, 3]``, their question types and colours."""
    from modwire.tasks.synthetic.sort_of_clevr import COLORS, condition_ids

    qs = [(c, r, s) for c in range(len(COLORS)) for r in (0, 1) for s in range(3)]
    ids = torch.from_numpy(np.stack([condition_ids(*q) for q in qs]))
    return ids, np.array([3 * r + s for _, r, s in qs]), np.array([c for c, _, _ in qs])


def link_prob_study(model, dataset, info, labels: dict[str, np.ndarray], seed: int) -> dict:
    """What one generator's ``P`` separates and depends on (module docstring)."""
    from modwire.analysis.circuits import collect_link_probs
    from modwire.analysis.conditional import (additive_fit, graph_statistics, pca_link_probs, remove_group_means,
                                              separation_by, summarize_by, variance_decomposition)
    from modwire.tasks.synthetic.sort_of_clevr import QUESTION_TYPE_NAMES

    n = len(labels["answer"])
    P, _, _ = collect_link_probs(model.eval(), dataset, info, max_samples=n)
    emb = pca_link_probs(P, seed=seed)
    factors = {k: labels[k] for k in ("colour", "relational", "question_type")}
    var = variance_decomposition(P, factors)
    f = var["factor"]
    var["subtype_within_type"] = f["question_type"] - f["relational"]
    ids, qtype, colour = all_questions()
    with torch.no_grad():
        P36 = model.link_probs(ids).float()
    stats = graph_statistics(P36, seed=seed)
    graphs = summarize_by(stats, qtype, QUESTION_TYPE_NAMES)
    graphs["by_relational"] = summarize_by(stats, qtype >= 3, {False: "non_relational", True: "relational"})["by_label"]
    graphs["anova"] = {}                    # each statistic over the 36 questions: type, colour, interaction
    for k in GRAPH_STATS:
        v = variance_decomposition(stats[k][:, None], {"question_type": qtype, "colour": colour})
        graphs["anova"][k] = {**v["factor"], "interaction": v["interaction"]}
    additive = additive_fit(P, {k: labels[k] for k in ("colour", "question_type")})
    return {"separation": separation_by(emb, labels, seed=seed),
            "answer_within_type": {QUESTION_TYPE_NAMES[t]: separation_by(
                emb[labels["question_type"] == t], {"answer": labels["answer"][labels["question_type"] == t]},
                seed=seed)["answer"] for t in range(6)},
            "question_type_from": {   # the question type from parts of P: which part mixes the types up?
                name: separation_by(pca_link_probs(part, seed=seed), {"question_type": labels["question_type"]},
                                    seed=seed)["question_type"]
                for name, part in (("colour_mean_removed", remove_group_means(P, labels["colour"])),
                                   ("additive_part", additive))},
            "variance": var, "graphs": graphs}


def image_ablation(model, dataset, info, labels: dict[str, np.ndarray]) -> dict:
    """Accuracy with the item's own image, the next image of the split (same question) and a
    blank white image, per family and per question type; and how far the prediction with the
    own image is a function of the question alone (``prediction_is_the_questions``: the
    fraction of items predicted as their question's most frequent prediction)."""
    from modwire.analysis.circuits import ReplacedInput, predict
    from modwire.tasks.synthetic.sort_of_clevr import IMAGE_SIZE, NUM_QUESTIONS, QUESTION_TYPE_NAMES, image_tokens

    n = len(dataset)
    blank = torch.from_numpy(image_tokens(np.ones((IMAGE_SIZE, IMAGE_SIZE, 3), np.float32), dataset.patch_size))
    variants = {"own_image": dataset,
                "other_image": ReplacedInput(dataset, "x", source=[(i + NUM_QUESTIONS) % n for i in range(n)]),
                "blank_image": ReplacedInput(dataset, "x", value=blank)}
    out, rel, qt = {}, labels["relational"].astype(bool), labels["question_type"]
    for name, ds in variants.items():
        pred, y = predict(model, ds, info)
        hit = (pred == y).numpy()
        out[name] = {"top1": float(hit.mean()), "top1_relational": float(hit[rel].mean()),
                     "top1_non_relational": float(hit[~rel].mean()),
                     "by_type": {QUESTION_TYPE_NAMES[t]: float(hit[qt == t].mean()) for t in range(6)}}
        if name == "own_image":
            pred, q = pred.numpy(), labels["question"]
            modal = {k: np.bincount(pred[q == k]).argmax() for k in np.unique(q)}
            out["prediction_is_the_questions"] = float(np.mean([p == modal[k] for p, k in zip(pred, q)]))
    return out


def image_share(model, dataset, images: int = 24) -> dict:
    """Each executor stage (``executor_stages``) on ``images`` images of the split × the 36
    questions: the fraction of its variance due to the image, to the question and to their
    interaction (``variance_decomposition``), and its total variance (summed over features)."""
    from modwire.analysis.circuits import executor_stages
    from modwire.analysis.conditional import variance_decomposition
    from modwire.tasks.synthetic.sort_of_clevr import NUM_QUESTIONS

    ids, _, _ = all_questions()
    imgs = torch.stack([dataset[NUM_QUESTIONS * i][0]["x"] for i in range(min(images, len(dataset) // NUM_QUESTIONS))])
    x, c = imgs.repeat_interleave(len(ids), 0), ids.repeat(len(imgs), 1)
    factors = {"image": np.repeat(np.arange(len(imgs)), len(ids)), "question": np.tile(np.arange(len(ids)), len(imgs))}
    out = {}
    for stage, F in executor_stages(model, x, c).items():
        v = variance_decomposition(F.double(), factors)
        out[stage] = {**v["factor"], "interaction": v["interaction"], "variance": float(F.double().var(0).sum())}
    return out


def one_seed(args, seed: int) -> dict:
    """Train seed ``seed`` into ``OUT/seed_S`` and measure it (module docstring)."""
    from modwire.analysis.circuits import analyze_circuits
    from modwire.analysis.conditional import separation_by
    from modwire.analysis.report import load_run
    from modwire.tasks import build_dataset, get_task
    from modwire.training import build_model_for_task, evaluate, load_config, train
    from modwire.training import make_loader

    out = args.out / f"seed_{seed}"
    sets = {"out_dir": out, "epochs": args.epochs, "seed": seed, "progress": False}
    if args.quick:
        sets.update({"max_steps": 4, "data.params.size": {"train": 20, "val": 10, "test": 10}, "data.batch_size": 16})
    cfg = load_config(CONFIG, values=sets)
    info = get_task(cfg.data.task)
    torch.manual_seed(cfg.seed)
    untrained = build_model_for_task(cfg)                       # the same init as train() draws
    # --overwrite: train afresh; else a finished run in OUT/seed_S is reused (an interrupted one resumed)
    result = train(cfg, overwrite=True) if args.overwrite else common.train_or_resume(cfg)
    _, model, _, test_set = load_run(out, split="test")
    metrics = evaluate(model, make_loader(test_set, 64, None, info, 0, drop_last=False), info, torch.device("cpu"))
    base, base_by_type = question_baselines(build_dataset(cfg.data.task, "train", **cfg.data.params), test_set)
    n = 60 if args.quick else 1200
    labels = test_labels(test_set, n)
    one_hot = np.eye(36)[labels["question"]]
    studies = {"trained": link_prob_study(model, test_set, info, labels, seed),
               "untrained": link_prob_study(untrained, test_set, info, labels, seed)}
    report = analyze_circuits(out, split="test", max_samples=n, log=lambda s: None)
    return {"seed": seed, "steps": result["step"], "test": metrics, "baselines": base,
            "question_only_by_type": base_by_type,
            "separation_trained": studies["trained"]["separation"]["question_type"],
            "separation_init": studies["untrained"]["separation"]["question_type"],
            "generators": studies, "separation_question_one_hot": separation_by(one_hot, labels, seed=seed),
            "image_ablation": image_ablation(model, test_set, info, test_labels(test_set, len(test_set))),
            "image_share": {"trained": image_share(model, test_set), "untrained": image_share(untrained, test_set)},
            "paper": PAPER, "fig6": [f"seed_{seed}/analysis/{f}" for f in report["files"]]}


def _ms(records: list[dict], get, digits: int = 3) -> str:
    """``get(record)`` over the seeds as ``m ± s``; ``-`` where a label had too few samples (``--quick``)."""
    def value(r):
        try:
            return get(r)
        except TypeError:                     # a score left out (None): too few samples of a class
            return None
    values = [v for v in map(value, records) if v is not None and math.isfinite(v)]   # NaN: nothing varied
    return common.format_mean_std(values, digits, empty="-")


def _row(name: str, cells: list[str], first: int = 22, width: int = 16) -> str:
    return f"{name:<{first}}" + "".join(f"{c:>{width}}" for c in cells)


def print_summary(records: list[dict]) -> None:
    """The study's tables, mean ± std over the seeds."""
    seeds = [r["seed"] for r in records]
    print(f"\nconditional NAC on Sort-of-CLEVR ({records[0]['steps']} steps), test split, seeds {seeds} (mean ± std):")
    print(_row("questions", ["NAC", "other image", "blank image", "majority", "q.-only (type)", "q.-only (36)"]))
    for fam in ("non_relational", "relational"):
        print(_row(fam, [_ms(records, lambda r: r["test"][f"top1_{fam}"])]
                   + [_ms(records, lambda r, v=v: r["image_ablation"][v][f"top1_{fam}"])
                      for v in ("other_image", "blank_image")]
                   + [_ms(records, lambda r, k=k: r["baselines"][fam][k])
                      for k in ("majority", "question_only", "question_only_36")]))
    print(f"prediction = its question's most frequent prediction: "
          f"{_ms(records, lambda r: r['image_ablation']['prediction_is_the_questions'])} of the test items")
    print("\nshare of each executor stage's variance due to the image (24 images x 36 questions):")
    print(_row("", list(GENERATORS)))
    for stage in records[0]["image_share"]["trained"]:
        print(_row(stage, [_ms(records, lambda r, g=g: r["image_share"][g][stage]["image"], 4) for g in GENERATORS]))
    print(f"\nheld-out nearest-centroid accuracy of each label from PCA-64 of P "
          f"({records[0]['separation_trained']['num_samples']} test samples):")
    print(_row("label", ["trained", "untrained", "one-hot question", "chance", "shuffled (trained)"], width=19))
    for lab in LABELS:
        sep = [lambda r, g=g: r["generators"][g]["separation"][lab]["accuracy"] for g in GENERATORS]
        sep += [lambda r: r["separation_question_one_hot"][lab]["accuracy"],
                lambda r: r["generators"]["trained"]["separation"][lab]["chance"],
                lambda r: r["generators"]["trained"]["separation"][lab]["shuffled_mean"]]
        print(_row(lab, [_ms(records, get) for get in sep], width=19))
    for part in ("colour_mean_removed", "additive_part"):
        print(_row(f"question_type, {part}", [_ms(records, lambda r, g=g: r["generators"][g]["question_type_from"]
                                                  [part]["accuracy"]) for g in GENERATORS], first=37, width=19))
    print("\nfraction of P's variance (ANOVA over the 36 questions' cells):")
    print(_row("", list(GENERATORS)))
    rows = (("colour", lambda v: v["factor"]["colour"]), ("relational", lambda v: v["factor"]["relational"]),
            ("subtype within type", lambda v: v["subtype_within_type"]),
            ("question type (6)", lambda v: v["factor"]["question_type"]),
            ("interaction", lambda v: v["interaction"]), ("within a question", lambda v: v["within_cell"]))
    for name, get in rows:
        print(_row(name, [_ms(records, lambda r, g=g: get(r["generators"][g]["variance"])) for g in GENERATORS]))
    print("\ngraphs of the 36 questions (mean over questions; type's share of the statistic's variance):")
    print(_row("", [f"{g}{w}" for g in GENERATORS for w in ("", " type")]))
    for k in GRAPH_STATS:
        print(_row(k, [_ms(records, get) for g in GENERATORS
                       for get in (lambda r, g=g: r["generators"][g]["graphs"]["all"][k]["mean"],
                                   lambda r, g=g: r["generators"][g]["graphs"]["anova"][k]["question_type"])]))
    print("paper (NAC §4.4, NLVR2 with CLIP features): " + "; ".join(f"{k}: {v}" for k, v in PAPER.items()))


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "runs/experiments/conditional_nac", "a few steps on a tiny split")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (one run each)")
    ap.add_argument("--overwrite", action="store_true",
                    help="train every seed afresh (else a finished run in OUT/seed_S is measured again, not retrained)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)
    from modwire.analysis.conditional import finite

    records = [finite(one_seed(args, s)) for s in args.seeds]    # NaN (a statistic that never varied): null
    common.write_json_atomic(args.out / "experiment.json", {"seeds": records})
    common.write_study(args.out, "conditional_nac", records, config=args, seeds=args.seeds, started=started)
    print_summary(records)
    print(f"plots: {args.out}/seed_*/analysis")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except (ValueError, FileNotFoundError, KeyError) as e:   # e.g. --out holds an earlier run
        raise SystemExit(f"conditional_nac.py: error: {e} (this script: --overwrite)")
