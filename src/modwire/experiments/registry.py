"""What modwire reproduces of the five papers, and where each number comes from.

Two tables, read beside the papers:

* :data:`STUDIES`: every study ``modwire reproduce NAME`` runs. A study is one module of
  :mod:`modwire.experiments` (or the demo) with the arguments of its CPU-scale run and of its ``--quick``
  version; it writes ``OUT/study.json`` (:mod:`modwire.analysis.study`; ``OUT`` defaults to
  ``experiments/results/NAME``). ``rebuild`` is the study's ``--report`` (study.json from its run
  logs, no training): ``modwire results --rebuild`` runs it where the logs are committed.
  :data:`ARCHIVE` holds the committed results ``modwire reproduce`` does not write under their own
  name: runs of earlier code kept for the record (rebuilt from their logs, not reproducible),
  the Triangle AiTs' workspace analysis (``modwire reproduce ait_triangle`` writes it), and the NI
  Table 1 fine-tuning diagnosis (:mod:`modwire.experiments.ni_finetune_diagnosis` writes it).
* :data:`CLAIMS`: one row of the README's results table per paper claim: the paper's number as
  printed, and the measures that give modwire's number: which study, which of its records
  (``where``: the fields a record must have), which value in each (``path``, dotted, list indices
  allowed) and how they are aggregated (:class:`Seeds`: one value per training seed, mean ± sample
  std here; :class:`Reported`: a mean and std the study computed itself, e.g. over random draws).

:mod:`modwire.experiments.report` turns :data:`CLAIMS` and the ``study.json`` files into the table.
Times are wall times on 2 CPU cores. A CPU-scale time says where it was measured (the committed run
logs, a script's docstring); the quick times were measured with ``modwire reproduce NAME --quick`` on
this project's shared 2-core machine while other jobs ran (load average 2-6), so a quiet machine is
faster.
"""
from __future__ import annotations

from dataclasses import dataclass

# ----------------------------------------------------------------------------- the studies

OUT = "{out}"      # replaced by the study's output folder


@dataclass(frozen=True)
class Study:
    """A study ``modwire reproduce NAME`` runs: ``steps`` are the argv (after ``python``; a study is
    ``-m modwire.experiments.NAME``) of each command, run in order from the checkout's root;
    ``quick`` those of the ``--quick`` version."""

    name: str
    claim: str                                  # the paper claim it reproduces
    steps: tuple[tuple[str, ...], ...] = ()
    quick: tuple[tuple[str, ...], ...] = ()
    rebuild: tuple[str, ...] | None = None      # rebuilds experiments/results/NAME/study.json from the logs
    time: str = ""                              # the CPU-scale run's wall time, and where it was measured
    quick_time: str = ""
    folder: str = ""                            # results folder under experiments/results (default: name)

    @property
    def results(self) -> str:
        return self.folder or self.name


def _module(name: str) -> tuple[str, str]:
    """``-m modwire.experiments.NAME``: a study of this package, run with ``python``."""
    return ("-m", f"modwire.experiments.{name}")


def _script(name: str, *args: str) -> tuple[str, ...]:
    """``-m modwire.experiments.NAME ARGS --out {out}``."""
    return (*_module(name), *args, "--out", OUT)


QUICK_1 = ("--quick", "--seeds", "1")      # the quick version of a study over seeds: one seed (the last --seeds wins)


def _demo(*args: str) -> dict:
    """``python -m modwire.demo`` into OUT with ``args``, and its minutes-long version on digits."""
    run = ("-m", "modwire.demo", "--out-dir", OUT, "--no-progress")
    quick = ("--dataset", "digits", "--steps", "5", "--max-samples", "64", "--drop", "0,0.5,0.875", "--draws", "2",
             "--no-plots")
    return {"steps": ((*run, *args),), "quick": ((*run, *quick, *args),)}


def _one(name: str, *args: str, quick: tuple[str, ...] = ("--quick",)) -> dict:
    """A study of one script: its run, its quick run (``quick`` added), its rebuild (``--report``)."""
    return {"steps": (_script(name, *args),), "quick": (_script(name, *args, *quick),),
            "rebuild": _script(name, *args, "--report")}


AIT_ROWS = "ait,vit,without_bottleneck,ait_authors"      # modwire's AiT, the ViT, W/O bottleneck, the authors' AiT
# Rows that locate where the Triangle accuracy went (docs/ait.md): the embedding's positions, its patch
# LayerNorms, and the ViT row as it ran before issue 35.
AIT_ROWS_EMBEDDING = "ait_positions,vit_positions,vit_conv_embedding,ait_conv_embedding,vit_pre35"
AIT_ROWS_PRE35 = "ait,vit,without_bottleneck,ait_no_collapse,without_bottleneck_no_collapse"   # the archived runs' rows
CLEVR = ("--rows", "nfm,cnn", "--steps", "1600", "--batch", "32", "--train-images", "2500", "--val-images", "100",
         "--test-images", "200", "--stem", "2", "--lr", "2e-3", "--workers", "2")
READ_OUT_NORM_ROWS = "pio_read_out_norm,nac_scale_free_read_out_norm"   # table1_ladder: the former read-out LN
COLLAPSE_VARIANTS = ("--variants", "paper", "residual", "biased", "authors")
AIT_FASHION = "configs/cpu/ait_fashion_mnist.yaml"
NO_COLLAPSE = ("model.overrides.bottleneck_softmax=kept", "model.overrides.normalize_update=true")


def _ait_analysis(quick: bool) -> tuple[tuple[str, ...], ...]:
    """Train the CPU AiT on Fashion-MNIST with the defaults and with NO_COLLAPSE, analyse each, and
    collect both analyses into study.json (``ait_analysis --report``)."""
    small = ("max_steps=6", "data.max_samples=256", "keep_weights_every=3") if quick else ()
    samples = ("--samples", "16", "--no-plots") if quick else ()
    steps = []
    for name, sets in (("paper", ()), ("no_collapse", NO_COLLAPSE)):
        run = f"{OUT}/{name}/run"
        steps += [("-m", "modwire", "train", AIT_FASHION, "--overwrite", "--set", f"out_dir={run}", "progress=false",
                   *sets, *small),
                  (*_module("ait_analysis"), run, "--out", f"{OUT}/{name}", *samples)]
    return (*steps, (*_module("ait_analysis"), "--report", "--out", OUT))


def _ait_triangle(quick: bool) -> tuple[tuple[str, ...], ...]:
    """Train Table 2's rows (and the embedding rows; the quick run: Table 2's only), then analyse seed 0's
    AiT runs (their workspace: ``OUT/analysis``)."""
    flags = QUICK_1 if quick else ()
    analyse = [(*_module("ait_analysis"), f"{OUT}/{row}", "--no-plots", "--out", f"{OUT}/analysis/{row}",
                *(("--samples", "16") if quick else ())) for row in ("ait", "ait_authors")]
    rows = AIT_ROWS if quick else f"{AIT_ROWS},{AIT_ROWS_EMBEDDING}"
    return (_script("ait_triangle", "--rows", rows, "--seeds", "3", *flags), *analyse,
            (*_module("ait_analysis"), "--report", "--out", f"{OUT}/analysis"))


STUDIES: list[Study] = [
    Study("table1_ladder", "NAC Table 1: Perceiver IO → + ModFC → + sparse graph → NAC, IID and OOD",
          steps=(_script("table1_ladder"), _script("table1_ladder", "--rows", READ_OUT_NORM_ROWS)),
          quick=(_script("table1_ladder", *QUICK_1), _script("table1_ladder", "--rows", READ_OUT_NORM_ROWS, *QUICK_1)),
          rebuild=_script("table1_ladder", "--report"),
          time="~40 min (24 runs, 84 run-minutes on 2 workers before issue 35, on quiet cores); measured 56 min for "
               "the 24 (107 run-minutes) and 37 min for the 12 runs with the read-out LayerNorm (70 run-minutes), "
               "with other studies running (the committed results.jsonl)",
          quick_time="102 s"),
    Study("demo", "NAC Fig. 5a / 15: accuracy as modules (NAC) / latents (Perceiver IO) are dropped",
          **_demo(), time="≤ 5 min (docs/demo.md)", quick_time="156 s"),
    Study("demo_read_out_norm", "the demo with a LayerNorm before the read-out (read_out_norm=true), as both models "
          "had before issue 35", **_demo("--set", "model.overrides.read_out_norm=true"),
          time="≤ 5 min on quiet cores, as the demo (1045 s measured with other studies on the 2 cores: its "
               "study.json)", quick_time="not measured; the demo's is 156 s"),
    Study("nac_fewshot", "NAC Fig. 4: few-shot adaptation, NAC vs Perceiver IO (8-way, 1-16 shots)",
          **_one("nac_fewshot", "--lr-check", quick=QUICK_1),
          time="~10 min on 2 lightly loaded cores (584 s before issue 35); 16.5 min measured with other studies "
               "running, then 210.5 s for Perceiver IO's fine-tuning at its new lr (its study.json)", quick_time="60 s"),
    Study("conditional_nac", "NAC Fig. 6: a conditional NAC's circuits (P) separate question types",
          steps=(_script("conditional_nac", "--overwrite"),),
          quick=(_script("conditional_nac", "--overwrite", "--quick"),),
          time="~11 min (3 seeds, ~3.5 min each on a free core; 41.5 min measured with other studies on the 2 cores: its study.json)",
          quick_time="72 s"),
    Study("graph_align", "NAC App. A, Eq. 6-9: the graph regularizer with and without degree alignment",
          steps=(_script("graph_align"),), quick=(_script("graph_align", "--quick"),),
          time="~7 min (414 s measured with other jobs on the 2 cores: its study.json)", quick_time="9 s"),
    Study("ni_fuzzy_boolean", "NI Table 1: re-wiring learned functions for new fuzzy Boolean functions",
          **_one("ni_fuzzy_boolean"),
          time="~25 min on 2 quiet cores (the ni_fuzzy_boolean module's docstring); the committed run ~106 min with other jobs "
               "(its run folders' times; its study.json's 1720.2 s is its resumed last part)", quick_time="47 s"),
    Study("ni_fuzzy_boolean_residual_update", "NI Table 1 with interpreter_residual=\"update\" (modwire's Eq. 11 "
          "reading that keeps the scale)", **_one("ni_fuzzy_boolean", "--residual", "update"),
          time="~102 min (6134.6 s: its study.json; the shared 2 cores, other jobs running)", quick_time="47 s"),
    Study("ni_fuzzy_boolean_residual_none", "NI Table 1 with interpreter_residual=\"none\" (the authors' released "
          "digits preset)", **_one("ni_fuzzy_boolean", "--residual", "none"),
          time="~2 h with other jobs on the 2 cores (its study.json's 6458.4 s is its resumed last part; the "
               "pre-training ran before it)", quick_time="47 s"),
    Study("ni_fewshot", "NI Fig. 5a: few-shot adaptation, Neural Interpreter vs ViT",
          **_one("ni_fewshot", quick=QUICK_1),
          time="~11 min on 2 quiet cores (10.6 min measured, an earlier run); the committed run 24.1 min with other "
               "jobs (1445.3 s: its study.json)", quick_time="58 s"),
    Study("ait_triangle", "AiT Tables 1-2: AiT vs ViT and W/O bottleneck on Triangle; seed 0's workspace",
          steps=_ait_triangle(False), quick=_ait_triangle(True),
          rebuild=_script("ait_triangle", "--rows", f"{AIT_ROWS},{AIT_ROWS_EMBEDDING}", "--seeds", "3", "--report"),
          time="~5 h: 27 runs of 10-39 min measured with other studies on the 2 cores, 2 at a time (the committed results.jsonl)", quick_time="52 s"),
    Study("ait_memory_collapse_digits", "AiT Eq. 3-4: which part of the write keeps memory slots apart (digits)",
          **_one("ait_memory_collapse", "--task", "digits", "--steps", "150", *COLLAPSE_VARIANTS),
          time="~35 min on a quiet core (3 seeds × ~11 min; 59 min measured with other studies running: its results)", quick_time="53 s"),
    Study("ait_memory_collapse_triangle", "AiT Eq. 3-4: the memory slots on Triangle",
          **_one("ait_memory_collapse", "--task", "triangle", "--steps", "120", *COLLAPSE_VARIANTS),
          time="~6 min (361 s measured with a test run beside it: its study.json)", quick_time="75 s"),
    Study("ait_analysis", "AiT Fig. 2, 10, 11: slot maps, patch diversity, Hopfield energy (Fashion-MNIST)",
          steps=_ait_analysis(False), quick=_ait_analysis(True),
          rebuild=(*_module("ait_analysis"), "--report", "--out", OUT),
          time="~21 min measured with another study on the 2 cores (two 600-step runs and their analyses)",
          quick_time="41 s"),
    Study("nfm_sort_of_clevr", "NFM Table 6: NFM(CNN) vs CNN_MLP on Sort-of-CLEVR",
          **_one("nfm_sort_of_clevr", *CLEVR, "--seeds", "3", quick=QUICK_1),
          time="~12 min (6 runs, 23 run-minutes on 2 workers: the committed results.jsonl)", quick_time="13 s"),
    Study("nfm_multi_digit", "NFM Table 5: multi-digit images, trained on 1 and 5 digits",
          **_one("nfm_multi_digit", "--regimes", "1_5", "--seeds", "3", quick=QUICK_1),
          time="~7 min (seeds 1-2, 4 runs, took 4.7 min with the test suite beside it)",
          quick_time="19 s"),
    Study("nfm_lm_synthetic", "NFM Table 8: a transformer LM with and without NFM (generated corpus)",
          **_one("nfm_lm_synthetic"),
          time="~10 min on a quiet core (3 seeds × ~3 min; 29 min measured on 2 cores with other studies running, load average ~9: its results)", quick_time="88 s"),
    Study("gan_fashion_mnist", "NFM Table 4: NFM in a GAN's generator (classifier-FID, Fashion-MNIST 16x16)",
          **_one("gan_fashion_mnist", quick=QUICK_1),
          time="~7 min (7.1 min measured with the test suite running beside it: its study.json)",
          quick_time="18 s"),
    Study("nfm_preact_resnet", "NFM Table 2 / §4.4: PreActResNet with and without NFM, clean and one 16×16 box "
          "(Fashion-MNIST)",
          **_one("nfm_preact_resnet", "--seeds", "3", quick=QUICK_1),
          time="12 min on 2 cores with other work running (NFM runs about 6 min, base runs 0.3, 2 at a time: its study.json)",
          quick_time="78 s"),
]
STUDY = {s.name: s for s in STUDIES}

# Committed results not written under their own name by `modwire reproduce`: runs of earlier code
# (rebuilt from their logs with --report, not reproduced by the current code), the Triangle
# AiTs' workspace analysis (`modwire reproduce ait_triangle` writes it, into OUT/analysis), and the
# instrumented NI Table 1 fine-tuning (python -m modwire.experiments.ni_finetune_diagnosis --study
# experiments/results/ni_fuzzy_boolean_residual_update writes it; its runs' checkpoints are not
# committed, so it is not rebuilt).
ARCHIVE: list[Study] = [
    Study("ni_fuzzy_boolean_eq11_printed", "NI Table 1 with Eq. 11 as printed (before issue 23)",
          rebuild=_script("ni_fuzzy_boolean", "--report")),
    Study("ni_fewshot_eq11_printed", "NI Fig. 5a with Eq. 11 as printed (before issue 23)",
          rebuild=_script("ni_fewshot", "--report")),
    Study("ait_triangle_pre23", "AiT Tables 1-2 with the former workspace (before issue 23)",
          rebuild=_script("ait_triangle", "--rows", AIT_ROWS_PRE35, "--report")),
    Study("ait_triangle_6000", "AiT on Triangle, 6000 steps, former workspace",
          rebuild=_script("ait_triangle", "--rows", "ait", "--steps", "6000", "--report")),
    Study("ait_triangle_12000", "AiT on Triangle, 12000 steps, former workspace",
          rebuild=_script("ait_triangle", "--rows", "ait", "--steps", "12000", "--report")),
    Study("ni_fuzzy_boolean_residual_update_diagnosis", "NI Table 1's \"+ all\" fine-tuning of the "
          "interpreter_residual=\"update\" study instrumented: lr 0.01 / 0.02 / 0.05, gradient clipping",
          folder="ni_fuzzy_boolean_residual_update/diagnosis"),
    Study("ait_triangle_analysis", "the trained Triangle AiTs' workspace (seed 0)", folder="ait_triangle/analysis",
          rebuild=(*_module("ait_analysis"), "--report", "--out", OUT)),
    Study("ait_triangle_pre35", "AiT Tables 1-2 with the former block (before issue 35)",
          rebuild=_script("ait_triangle", "--rows", AIT_ROWS_PRE35, "--seeds", "3", "--report")),
    Study("ait_triangle_pre35_analysis", "the former block's Triangle AiTs' workspace (seed 0)",
          folder="ait_triangle_pre35/analysis", rebuild=(*_module("ait_analysis"), "--report", "--out", OUT)),
    Study("ait_memory_collapse_pre23", "the memory collapse of the former workspace (Fashion-MNIST)",
          rebuild=_script("ait_memory_collapse", "--report")),
    Study("ait_analysis_pre35", "AiT Fig. 2, 10, 11 on Fashion-MNIST with the former block (before issue 35), and the "
          "former Triangle ViT's attention sparsity", rebuild=(*_module("ait_analysis"), "--report", "--out", OUT)),
    Study("nac_fewshot_pre35", "NAC Fig. 4 at CPU scale with the NAC and Perceiver IO of before issue 35 (at c728a49)"),
    Study("demo_pre35", "the demo with the NAC and Perceiver IO of before issue 35 (run at 56df71a)"),
    Study("table1_ladder_pre35", "NAC Table 1 at CPU scale with the NAC and Perceiver IO of before issue 35 (and "
          "the learning-rate sweep and in-between rows)", rebuild=_script("table1_ladder", "--report")),
    Study("ait_memory_collapse_digits_pre35", "the memory collapse on digits with the former block (before issue 35)",
          rebuild=_script("ait_memory_collapse", "--task", "digits", "--steps", "150", *COLLAPSE_VARIANTS, "--report")),
    Study("ait_memory_collapse_digits_patch4", "the memory collapse on digits in 4×4 patches of the upsampled "
          "image (one constant pixel each, which the patch LayerNorm maps to one token)",
          rebuild=_script("ait_memory_collapse", "--task", "digits", "--steps", "150", "--patch-size", "4",
                          *COLLAPSE_VARIANTS, "--report")),
    Study("nfm_sort_of_clevr_long", "NFM Table 6, 4000 steps, one seed, the first NFM core",
          rebuild=_script("nfm_sort_of_clevr", "--rows", "cnn,nfm", "--seeds", "1", "--steps", "4000", "--batch", "32",
                          "--train-images", "5000", "--val-images", "100", "--test-images", "200", "--stem", "2",
                          "--lr", "2e-3", "--block-order", "conv_bn_relu", "--report")),
]


# ----------------------------------------------------------------------------- the claims

@dataclass(frozen=True)
class Seeds:
    """One value per training seed: ``path`` in each record that has the fields ``where`` (one
    record per seed), or, with ``per_seed``, a dict / list of per-seed values at ``path`` in the one
    matching record. Aggregated as mean ± sample std (n - 1) over the seeds."""

    label: str
    where: dict
    path: str
    per_seed: bool = False
    scale: float = 100.0
    digits: int | None = None        # None: the claim's


@dataclass(frozen=True)
class Reported:
    """A mean and std the study computed itself (``mean`` / ``std`` paths in the one record with
    ``where``), over ``n_path``'s count of ``n_what`` (e.g. random drop subsets)."""

    label: str
    where: dict
    mean: str
    std: str
    n_path: str
    n_what: str
    scale: float = 100.0
    digits: int | None = None


@dataclass(frozen=True)
class Claim:
    """One row of the results table: the paper's claim and number, modwire's measures of it."""

    paper: str                       # "NAC Table 1"
    claim: str                       # what is compared
    paper_value: str                 # the paper's number(s), as printed
    study: str                       # the STUDIES / ARCHIVE entry whose study.json holds the records
    measures: tuple = ()
    setting: str = ""                # modwire's data and scale (what differs from the paper's)
    digits: int = 1
    compare: bool = True             # a comparison between models: ≥ 3 seeds asked for
    reproduce: str = ""              # the study that reproduces it, where not ``study`` itself


def _ladder(task: str, row: str, lr: float, warmup: int, steps: int) -> dict:
    return {"task": task, "row": row, "lr": lr, "warmup": warmup, "steps": steps}


LISTOPS = {"NAC": _ladder("listops", "nac_scale_free", 5e-4, 200, 600),
           "Perceiver IO": _ladder("listops", "pio", 1e-3, 50, 600)}
FASHION = {"NAC": _ladder("fashion_mnist", "nac_scale_free", 1e-3, 100, 200),
           "Perceiver IO": _ladder("fashion_mnist", "pio", 1e-3, 100, 200)}


def _pair(models: dict, path: str) -> tuple[Seeds, ...]:
    return tuple(Seeds(label, where, path) for label, where in models.items())


NI_SETTINGS = {"CLS only": "cls", "+ type inference": "cls,type_inference", "+ all": "all"}


def _fewshot(k: int) -> Claim:
    return Claim("NI Fig. 5a", f"few-shot top-1 %, k = {k} per class: NI vs ViT", "NI ahead at low k (no numbers)",
                 "ni_fewshot", (Seeds("NI", {"model": "ni", "shots": k, "lr": 0.05, "check": False}, "values", True),
                                Seeds("ViT", {"model": "vit", "shots": k, "lr": 0.03, "check": False}, "values", True)),
                 "Fashion-MNIST 32×32 for K-MNIST, 86 k / 149 k parameters")


def _nac_fewshot(k: int) -> Claim:
    return Claim("NAC Fig. 4", f"few-shot top-1 %, 8-way, k = {k} per class: NAC vs Perceiver IO",
                 "NAC ahead (~10 at 1-4 shots, abstract)" if k <= 4 else "Fig. 4 only (no numbers)", "nac_fewshot",
                 (Seeds("NAC", {"model": "nac", "shots": k, "lr": 0.03, "check": False}, "values", True),
                  Seeds("Perceiver IO", {"model": "pio", "shots": k, "lr": 0.03, "check": False}, "values", True)),
                 "Fashion-MNIST pre-training (400 steps), sklearn digits")


MULTI_DIGIT_PAPER = {1: "99.22 vs 99.16", 2: "74.69 vs 84.01", 3: "57.11 vs 66.58", 4: "75.90 vs 79.04",
                     5: "68.87 vs 71.76"}


def _digits(n: int) -> Claim:
    trained = " (trained)" if n in (1, 5) else ""
    return Claim("NFM Table 5", f"exact match %, {n}-digit images{trained}: baseline vs NFM", MULTI_DIGIT_PAPER[n],
                 "nfm_multi_digit", tuple(Seeds(label, {"regime": "1_5", "model": model}, f"test.{n}.exact_match")
                                          for label, model in (("baseline", "baseline"), ("NFM", "nfm"))),
                 "sklearn digits in 32×32, 400 steps")


DEMO_LEVEL = {"record": "headline"}
CLAIMS: list[Claim] = [
    Claim("NAC Table 1", "IID top-1 %: NAC (scale-free prior) vs Perceiver IO", "60.76 vs 58.89", "table1_ladder",
          _pair(LISTOPS, "iid"), "ListOps (depth ≤ 3), 600 steps"),
    Claim("NAC Table 1", "OOD top-1 %: NAC vs Perceiver IO", "19.52 vs 17.57 (Tiny-ImageNet-R)", "table1_ladder",
          _pair(LISTOPS, "ood"), "ListOps nested 3-5 deep"),
    Claim("NAC Table 1", "IID top-1 %: NAC vs Perceiver IO", "60.76 vs 58.89", "table1_ladder", _pair(FASHION, "iid"),
          "Fashion-MNIST, 200 steps"),
    Claim("NAC Table 1", "OOD top-1 %: NAC vs Perceiver IO", "19.52 vs 17.57 (Tiny-ImageNet-R)", "table1_ladder",
          _pair(FASHION, "ood"), "Fashion-MNIST rotated 30°"),
    Claim("NAC Fig. 5a / 15", "points lost with 87.5% of modules / latents dropped: NAC vs Perceiver IO",
          "NAC < 3; Perceiver IO much more", "demo",
          (Reported("NAC", DEMO_LEVEL, "models.nac_small.lost", "models.nac_small.lost_std", "draws",
                    "random drop subsets"),
           Reported("Perceiver IO", DEMO_LEVEL, "models.perceiver_io_small.lost", "models.perceiver_io_small.lost_std",
                    "draws", "random drop subsets")),
          "`make demo`, one training seed", compare=False),
    *(_nac_fewshot(k) for k in (1, 2, 4, 8, 16)),
    Claim("NAC Fig. 6", "question type from P (held-out accuracy %): trained vs at initialisation",
          "types cluster (t-SNE, NLVR2)", "conditional_nac",
          (Seeds("trained", {}, "separation_trained.accuracy"), Seeds("untrained", {}, "separation_init.accuracy")),
          "Sort-of-CLEVR, 936 steps", compare=False),
    Claim("NAC §4.4", "conditional NAC test top-1 %; the same with each question's image swapped for another's",
          "64 (NLVR2; CLIP zero-shot 53); no swap", "conditional_nac",
          (Seeds("own image", {}, "image_ablation.own_image.top1"),
           Seeds("other image", {}, "image_ablation.other_image.top1")),
          "Sort-of-CLEVR, 936 steps", compare=False),
    Claim("NI Table 1", "pre-training R² (20 functions)", "0.9983", "ni_fuzzy_boolean",
          (Seeds("R²", {"setting": "pretrain"}, "r2_per_seed", True, 1.0),), "64-d, 14 epochs", 4, compare=False),
    Claim("NI Table 1", "R² on 10 new functions: " + " / ".join(NI_SETTINGS), "0.9202 / 0.9857 / 0.9953",
          "ni_fuzzy_boolean", tuple(Seeds(label, {"setting": key}, "r2_per_seed", True, 1.0)
                                    for label, key in NI_SETTINGS.items()), "¼ of the adaptation data", 4),
    *(_fewshot(k) for k in (1, 2, 5, 10, 20)),
    Claim("AiT Table 1", "test top-1 %: AiT vs ViT", "99.47 vs 99.47", "ait_triangle",
          (Seeds("AiT", {"row": "ait"}, "test.top1"), Seeds("ViT", {"row": "vit"}, "test.top1")),
          "Triangle, 128-d, 3000 steps", 2),
    Claim("AiT Table 2", "test top-1 %: AiT vs W/O bottleneck", "99.47 vs 93.33", "ait_triangle",
          (Seeds("AiT", {"row": "ait"}, "test.top1"),
           Seeds("W/O bottleneck", {"row": "without_bottleneck"}, "test.top1")), "Triangle, 128-d, 3000 steps", 2),
    Claim("AiT Fig. 2", "mean cosine between memory slots, layer 1 / 2 (1: collapsed)", "slots specialise",
          "ait_triangle_analysis", (Seeds("layer 1", {"name": "ait"}, "slot_cosine.0", scale=1.0),
                                    Seeds("layer 2", {"name": "ait"}, "slot_cosine.1", scale=1.0)),
          "Triangle, seed 0 of AiT Table 1", 3, compare=False, reproduce="ait_triangle"),
    Claim("AiT Fig. 2", "mean cosine between memory slots, layer 1 / 2; test top-1 %", "slots specialise",
          "ait_analysis", (Seeds("layer 1", {"name": "paper"}, "slot_cosine.0", scale=1.0),
                           Seeds("layer 2", {"name": "paper"}, "slot_cosine.1", scale=1.0),
                           Seeds("top-1", {"name": "paper"}, "final_val.top1", digits=1)),
          "Fashion-MNIST, 600 steps", 3, compare=False),
    Claim("AiT Eq. 3-4", "slot cosine at the end, layer 1: as printed vs residual write", "(no collapse reported)",
          "ait_memory_collapse_digits", (Seeds("as printed", {"variant": "paper"}, "curve.-1.slot_cos.0", scale=1.0),
                                         Seeds("residual", {"variant": "residual"}, "curve.-1.slot_cos.0", scale=1.0)),
          "sklearn digits, 150 steps", 2),
    Claim("NFM Table 6", "relational test %: CNN vs NFM(CNN)", "68.26 vs 74.95", "nfm_sort_of_clevr",
          (Seeds("CNN", {"row": "cnn"}, "test.top1_relational"), Seeds("NFM", {"row": "nfm"}, "test.top1_relational")),
          "2,500 images, 1600 steps", 2),
    Claim("NFM Table 6", "non-relational test %: CNN vs NFM(CNN)", "71.78 vs 79.37", "nfm_sort_of_clevr",
          (Seeds("CNN", {"row": "cnn"}, "test.top1_non_relational"),
           Seeds("NFM", {"row": "nfm"}, "test.top1_non_relational")), "2,500 images, 1600 steps", 2),
    *(_digits(n) for n in (1, 2, 3, 4, 5)),
    Claim("NFM Table 8", "validation perplexity: no NFM vs NFM", "31.12 vs 30.78 (WikiText-2)", "nfm_lm_synthetic",
          (Seeds("base", {"variant": "base"}, "val.perplexity", scale=1.0),
           Seeds("NFM", {"variant": "nfm"}, "val.perplexity", scale=1.0)), "generated corpus, 400 steps", 3),
    Claim("NFM Table 4", "FID: InfoMax-GAN vs NFM(InfoMax-GAN)", "15.12 vs 13.15 (CIFAR-10)", "gan_fashion_mnist",
          (Seeds("base", {"model": "gan"}, "final_classifier_fid", scale=1.0),
           Seeds("NFM", {"model": "nfm_gan"}, "final_classifier_fid", scale=1.0)),
          "classifier-FID, Fashion-MNIST 16×16, 400 steps", 2),
    Claim("NFM Table 2", "test top-1 %: PreActResNet vs NFM(PreActResNet)", "96.27 vs 96.56 (CIFAR-10, PreActResNet-18)",
          "nfm_preact_resnet", (Seeds("base", {"model": "base"}, "test.top1"), Seeds("NFM", {"model": "nfm"}, "test.top1")),
          "Fashion-MNIST 32×32, 8/16/32 channels, 200 steps", 2),
    Claim("NFM §4.4", "test top-1 % with one 16×16 occluding box: PreActResNet vs NFM", "82.46 vs 84.11 (CIFAR-10)",
          "nfm_preact_resnet", (Seeds("base", {"model": "base"}, "occluded.top1"),
                                Seeds("NFM", {"model": "nfm"}, "occluded.top1")),
          "Fashion-MNIST 32×32, 200 steps, box seed 0", 2),
]


def every_study() -> dict[str, Study]:
    """The studies and the archived runs, by name."""
    return {s.name: s for s in (*STUDIES, *ARCHIVE)}
