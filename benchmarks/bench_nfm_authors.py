"""modwire's Sort-of-CLEVR NFM(CNN) against the authors' own code, side by side in one run (issue 39).

    git clone https://github.com/Slowika/NeuralFunctionModules /path/to/NeuralFunctionModules
    OMP_NUM_THREADS=1 python benchmarks/bench_nfm_authors.py --authors-repo /path/to/NeuralFunctionModules \\
        [--batch 64] [--repeats 5] [--out RESULT.json] [--device cpu|cuda] [--precision fp32|bf16] [--compile]

The authors' model is imported from their checkout (``models/model.py``, put on ``sys.path``; nothing of
theirs is copied into modwire, and no ``__pycache__`` is written into their tree): ``CNN_MLP_NFL(args)``,
their Sort-of-CLEVR NFM(CNN) (``ConvInputModel_NFL2``: two passes of 48 → 96 → 192 → 384 channels, the
attentive densenet reading after each block of the second pass), which builds its own Adam
(``args.lr``, 1e-4 as in their ``main.py``). Their code has **no base (no-NFM) model** for Sort-of-CLEVR
(``model.py`` defines only ``CNN_MLP_NFL`` and ``Preresnet_MLP``, both with the attentive densenet), so
their NFM / base ratio does not exist; the script prints their NFM over modwire's base CNN at their
widths instead, labelled as such.

Models (all on the same inputs: ``example_inputs(batch)`` of modwire's base, images ``[B, 3, 75, 75]`` in
[0, 1], one-hot questions ``[B, 11]``; random answer labels in 0..9):

- ``authors nfm``: ``CNN_MLP_NFL`` (6.89 M parameters, 2.23 M of them never used);
- ``modwire nfm (authors' arch)``: ``create_model("nfm_cnn_mlp_sort_of_clevr", **AUTHORS_NFM_CNN)``, the
  authors' network as modwire options (same function: ``tests/models/test_relational_cnn.py``);
- ``modwire base (authors' widths)``: ``cnn_mlp_sort_of_clevr`` with the non-NFM fields of
  ``AUTHORS_NFM_CNN`` (their widths and head);
- ``modwire nfm (paper)`` / ``modwire base (paper)``: the presets ``nfm_cnn_mlp_sort_of_clevr`` /
  ``cnn_mlp_sort_of_clevr`` (NFM §4.3: 24 channels, k = 5, reads before every block of both passes).

Each model runs the same train step (train mode; zero_grad, forward, NLL loss of the log-softmax, which
is ``F.nll_loss`` on their log-probabilities and ``F.cross_entropy`` on modwire's logits, backward, Adam
step with lr 1e-4) and an eval forward (eval mode, ``no_grad``); every function is called in turn in each
round (``modwire.analysis.time_interleaved``, CUDA synchronised around each call), medians printed.
Their ``FCOutputModel`` calls ``F.dropout(x)``, which stays on in eval mode: their eval forward pays for
one dropout of ``[B, 256]`` (negligible), as their ``test_`` does.

Goal (issue 39: "keep the Sort-of-CLEVR step >= 2x as fast as the authors' code"): authors / modwire
train step >= 2.0, checked on both comparisons and printed PASS / FAIL (not with ``--quick``: batch 2,
1 round, a smoke test): against the paper preset (``modwire nfm (paper)``, the comparison of the issue's
"2.1x") and against the same network (``modwire nfm (authors' arch)``, the stricter one). ``--out``: rows,
ratios, goal, and the machine (torch, threads, CPU, core affinity, load averages at start and end, date,
modwire's path, git commit and dirty flag, the authors' checkout: git commit or path, and the SHA-256 of
their two model files) as JSON, written atomically.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import modwire
from modwire.analysis import time_interleaved
from modwire.models.relational_cnn import AUTHORS_NFM_CNN

from bench_nfm import machine, write_json
from runflags import Run, add_run_flags

AUTHORS_URL = "https://github.com/Slowika/NeuralFunctionModules"
AUTHORS_FILES = ("models/model.py", "models/attentive_densenet.py")
GOAL = 2.0                       # issue 39: authors / modwire NFM train step ("keep ... >= 2x")
LR = 1e-4                        # their main.py's --lr default
BASE_FIELDS = {k: v for k, v in AUTHORS_NFM_CNN.items() if k != "nfm"}   # their widths and head, no NFM


def authors_model_class(repo: str | None, ap: argparse.ArgumentParser) -> type:
    """``CNN_MLP_NFL`` from ``repo/models/model.py``; a usage error naming what is expected otherwise."""
    want = (f"--authors-repo: expected a checkout of {AUTHORS_URL} (git clone {AUTHORS_URL}), a directory "
            f"with {' and '.join(AUTHORS_FILES)} defining CNN_MLP_NFL")
    if repo is None:
        ap.error(f"{want}; got none")
    root = Path(repo).resolve()
    missing = [f for f in AUTHORS_FILES if not (root / f).is_file()]
    if missing:
        ap.error(f"{want}; {repo} has no {', '.join(missing)}")
    sys.path.insert(0, str(root))
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True                      # leave their tree as it is
    try:
        from models import model as theirs             # their package is called "models"
    except ImportError as e:
        ap.error(f"{want}; importing models.model from {repo} failed: {e}")
    finally:
        sys.dont_write_bytecode = dont_write
    if not Path(theirs.__file__).resolve().is_relative_to(root):
        ap.error(f"{want}; 'models.model' resolved to {theirs.__file__}, outside {repo} (an installed 'models'?)")
    if not hasattr(theirs, "CNN_MLP_NFL"):
        ap.error(f"{want}; {theirs.__file__} defines no CNN_MLP_NFL")
    return theirs.CNN_MLP_NFL


def build_authors(cls: type) -> torch.nn.Module:
    """Their model with its own Adam (``args.lr``); their constructor's prints are kept out of the table."""
    with contextlib.redirect_stdout(io.StringIO()):
        return cls(types.SimpleNamespace(lr=LR))


def _git(path: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def checkout(path: Path) -> dict:
    """Where code came from: git commit and dirty flag (tracked files) of the checkout holding ``path``."""
    commit = _git(path, "rev-parse", "HEAD")
    dirty = None if commit is None else bool(_git(path, "status", "--porcelain", "--untracked-files=no"))
    return {"path": str(path), "git_commit": commit, "git_dirty": dirty}


def step_fns(model: torch.nn.Module, opt: torch.optim.Optimizer, args: tuple, kwargs: dict, labels: torch.Tensor,
             log_probs: bool, run: Run) -> tuple[Callable[[], None], Callable[[], None]]:
    """(train step, eval forward) of one model. ``log_probs``: the model returns log-probabilities (theirs)."""
    forward = run.compiled(model)
    loss_fn = F.nll_loss if log_probs else F.cross_entropy

    def train() -> None:
        model.train()
        opt.zero_grad(set_to_none=True)
        with run.cast():
            loss = loss_fn(forward(*args, **kwargs).float(), labels)
        loss.backward()
        opt.step()

    def evaluate() -> None:
        model.eval()
        with torch.no_grad(), run.cast():
            forward(*args, **kwargs)
    return train, evaluate


def models(cls: type) -> dict[str, tuple[torch.nn.Module, bool]]:
    """name → (model, returns log-probabilities); the authors' model first."""
    torch.manual_seed(0)
    out = {"authors nfm": (build_authors(cls), True)}
    out["modwire nfm (authors' arch)"] = (modwire.create_model("nfm_cnn_mlp_sort_of_clevr", **AUTHORS_NFM_CNN), False)
    out["modwire base (authors' widths)"] = (modwire.create_model("cnn_mlp_sort_of_clevr", **BASE_FIELDS), False)
    out["modwire nfm (paper)"] = (modwire.create_model("nfm_cnn_mlp_sort_of_clevr"), False)
    out["modwire base (paper)"] = (modwire.create_model("cnn_mlp_sort_of_clevr"), False)
    return out


RATIOS = [  # (label, numerator, denominator): time ratios, > 1 = the denominator is faster
    ("authors / modwire, same network", "authors nfm", "modwire nfm (authors' arch)"),
    ("authors / modwire paper preset", "authors nfm", "modwire nfm (paper)"),
    ("modwire nfm / base, authors' arch", "modwire nfm (authors' arch)", "modwire base (authors' widths)"),
    ("modwire nfm / base, paper presets", "modwire nfm (paper)", "modwire base (paper)"),
    ("authors nfm / modwire base at their widths (their code has no base)", "authors nfm",
     "modwire base (authors' widths)"),
]


def measure(cls: type, batch: int, repeats: int, run: Run) -> list[dict]:
    built = models(cls)
    base = built["modwire base (paper)"][0]
    (x,), kw = base.example_inputs(batch)
    q = kw["question"][:, 0]                                        # [B, 11]
    labels = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(1))
    x, q, labels = x.to(run.device), q.to(run.device), labels.to(run.device)
    fns, rows = {}, []
    for name, (model, log_probs) in built.items():
        model.to(run.device)      # their Adam was built before: .to() moves the parameters' data in place
        opt = model.optimizer if log_probs else torch.optim.Adam(model.parameters(), lr=LR)
        args, kwargs = ((x, q), {}) if log_probs else ((x,), {"question": q})
        fns[f"train {name}"], fns[f"eval {name}"] = step_fns(model, opt, args, kwargs, labels, log_probs, run)
        rows.append({"model": name, "params": sum(p.numel() for p in model.parameters())})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Implicit dimension choice")   # their F.log_softmax(x)
        t = time_interleaved(fns, iters=repeats, warmup=run.warmup)
    for row in rows:
        row.update(train_s=t[f"train {row['model']}"], eval_s=t[f"eval {row['model']}"])
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    by = {r["model"]: r for r in rows}
    return [{"ratio": label, "numerator": a, "denominator": b, "train": by[a]["train_s"] / by[b]["train_s"],
             "eval": by[a]["eval_s"] / by[b]["eval_s"]} for label, a, b in RATIOS if a in by and b in by]


def authors_source(repo: str) -> dict:
    root = Path(repo).resolve()
    return {**checkout(root), "sha256": {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in AUTHORS_FILES}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--authors-repo", metavar="DIR", help=f"a checkout of {AUTHORS_URL} (required)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64, their main.py's)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--quick", action="store_true", help="batch 2, 1 round: a smoke test (ratios meaningless)")
    ap.add_argument("--out", metavar="PATH", help="write rows, ratios, goal and machine as JSON (atomically)")
    add_run_flags(ap)
    args = ap.parse_args()
    if args.batch < 1 or args.repeats < 1:
        ap.error(f"--batch and --repeats: expected integers >= 1, got {args.batch} and {args.repeats}")
    cls = authors_model_class(args.authors_repo, ap)
    run = Run.from_args(ap, args)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    batch, repeats = (2, 1) if args.quick else (args.batch, args.repeats)
    load = {"start": os.getloadavg()}                               # other work on a shared machine skews timings
    print(f"threads {torch.get_num_threads()}, cores {sorted(os.sched_getaffinity(0))}, {run.describe()}, "
          f"batch {batch}, median of {repeats} interleaved rounds; train step (forward, NLL, backward, Adam) "
          f"and eval forward")
    rows = measure(cls, batch, repeats, run)
    load["end"] = os.getloadavg()
    print(f"load average (1, 5, 15 min) at start {load['start']}, at end {load['end']}")
    print(f"{'model':<32} {'params':>11} {'train ms':>10} {'eval ms':>10}")
    for r in rows:
        print(f"{r['model']:<32} {r['params']:>11,} {r['train_s'] * 1e3:>10.1f} {r['eval_s'] * 1e3:>10.1f}")
    found = ratios(rows)
    for r in found:
        print(f"{r['ratio']}: train {r['train']:.2f}x, eval {r['eval']:.2f}x")
    goals = [{"goal": f"{r['ratio']}: train step", "limit": GOAL, "value": r["train"],
              "pass": None if args.quick else r["train"] >= GOAL} for r in found[:2]]
    for g in goals:
        verdict = "not checked (--quick)" if args.quick else ("PASS" if g["pass"] else "FAIL")
        print(f"goal {g['goal']} >= {GOAL:.1f}: {g['value']:.2f} {verdict}")
    if args.out:
        mach = {**machine(torch.device(run.device)), "affinity": sorted(os.sched_getaffinity(0)), "loadavg": load,
                "modwire": checkout(Path(modwire.__file__).resolve().parent),
                "authors": authors_source(args.authors_repo)}
        mach["git_commit"], mach["git_dirty"] = mach["modwire"]["git_commit"], mach["modwire"]["git_dirty"]
        write_json(args.out, {"benchmark": "bench_nfm_authors.py", "argv": sys.argv[1:], "machine": mach,
                              "run": run.describe(), "batch": batch, "repeats": repeats, "rows": rows,
                              "ratios": found, "goals": goals})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
