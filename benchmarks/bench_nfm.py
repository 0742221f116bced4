"""What Neural Function Modules cost: train step and eval forward of each NFM integration vs its base
network, interleaved (issues 13 and 25).

    OMP_NUM_THREADS=1 python benchmarks/bench_nfm.py [--repeats 5] [--quick] [--presets GLOB ...]
        [--width 16 64] [--batch 16] [--soc-batch 16] [--baseline-reader OLD_NFM_PY_OR_NN_DIR]
        [--out RESULT.json]
        [--device cpu|cuda] [--precision fp32|bf16] [--compile [model|readers] | --channels-last]
        [--markdown RESULT.md]

Pairs: every registered preset ``nfm_<base>`` whose ``<base>`` is also registered, matching the
globs (default ``*micro``: each integration's test-sized pair), plus (not with ``--quick``) the
classifier, PreActResNet-18 (CIFAR-10 layout) at each ``--width`` (initial channels; the paper's is
64), 32×32 images, ``--batch``, NFM before every stage (``nfm_modules="stage"``, the presets) and/or
every residual block (``--modules``), and the Sort-of-CLEVR CNN_MLP pair (``cnn_mlp_sort_of_clevr`` /
``nfm_cnn_mlp_sort_of_clevr``, 75×75 images, ``--soc-batch``).

Each model runs a train step (train mode; forward, then backward of the mean square of the output)
and an eval forward (eval mode, no gradients); the functions of one pair alternate
(``modwire.analysis.time_interleaved``, which synchronizes CUDA around each call), medians are
printed. Columns: ``nfm / base`` (train and eval), ``nfm / (base × 2)`` (train: the readers' cost
over running the base network twice, measured by a function that runs the base step twice), and
the minor page faults per train step (``getrusage`` ``ru_minflt`` around each timed call) of each
side. ``--baseline-reader PATH``: a former ``modwire/nn/nfm.py``, or a former ``modwire/nn`` folder
whose ``attention.py`` and ``nfm_read.py`` that ``nfm.py`` then imports (e.g. ``git archive HEAD~1
src/modwire/nn | tar -x -C /tmp/old`` and ``--baseline-reader /tmp/old/src/modwire/nn``; its other
imports resolve in the current package): its ``NFMLayer``'s methods replace those of a second
copy of each NFM model, timed in the same interleaved rounds: the ``old ms`` and ``old / new`` columns
(train step).

``--compile``: both models of each pair are ``torch.compile(fullgraph=True)``-ed, each with its own inductor
options (``model.compile_kwargs``: the NFM's layout optimization off; the first two calls of each
function are untimed: they compile), the ratios are then compiled NFM / compiled base, and the eager NFM is
timed in the same rounds: the NFM's compiled / eager speed (eager time over compiled time, as
``bench_compile.py`` reports it) per pair, train and eval, and the eager base likewise (the base's compiled
/ eager speed). ``--compile readers``: only the NFM's readers are compiled (each ``NFMLayer.read``,
``torch.compile(dynamic=False)``, graph breaks allowed: inductor's fused kernels, which need not write a
product that a reduction reads; which products it leaves unwritten is not checked here), the base and the
rest of the NFM stay eager: the ratios are then NFM (compiled readers) / eager base, and the speed column is
that NFM's over the eager one's; its recompile limits are raised (one entry per reader, shape and grad
mode). Either way dynamo's caches are reset before each pair.

``--channels-last``: both models of each pair whose input has an image ``[B, C, H, W]`` are copied to
``torch.channels_last`` (parameters and that input; issue 39: "use channels-last where it helps"), the ratios
are then channels-last NFM / channels-last base, and the channels-first NFM and base are timed in the same
rounds: each one's channels-last / channels-first speed (channels-first time over channels-last time), train and
eval. A pair with no image input is timed as it is (``—`` in those columns). Not with ``--compile`` or
``--baseline-reader``.

Goals (issue 25), printed PASS / FAIL (not with ``--quick``): NFM / base ≤ 2.4 (train) and ≤ 2.3
(eval) for the classifier at width 64, ≤ 3 at width 16; Sort-of-CLEVR CNN_MLP train ≤ 6; page
faults per train step no more than the base's. Issue 13's target ``nfm / (base × 2) <= 1.30`` for
the classifier is printed too. ``--out``: the rows and the machine (torch version, threads, CPU
model, date, git commit) as JSON, written atomically.

Inputs: ``model.example_inputs(batch)`` when a model defines it, else made from the config (image
CNNs: ``[B, in_channels, image_size, image_size]``; token models: ids ``[B, min(max_len, 64)]``;
generators: latents ``[B, latent_dim]``); a model none of these fits is skipped with a note.
"""
from __future__ import annotations

import argparse
import datetime
import fnmatch
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import types
from copy import deepcopy
from pathlib import Path
from typing import Any, Callable

import torch

import modwire
from modwire.analysis import time_interleaved
from modwire.nn.nfm import NFMLayer

TARGET = 1.30                                                    # issue 13: nfm / (base × 2), classifier
GOALS = {64: (2.4, 2.3), 16: (3.0, 3.0)}                          # issue 25: classifier nfm / base (train, eval)
SOC_GOAL = 6.0                                                   # issue 25: Sort-of-CLEVR CNN_MLP train nfm / base
BF16_GOAL = 2.5                                                  # issue 39 (GPU): nfm / base in bf16
ROOT = Path(__file__).resolve().parents[1]


def classifier(width: int, batch: int, modules: str) -> tuple[str, str, str, dict, int]:
    """A classifier row: PreActResNet-18 (CIFAR-10 layout) at ``width`` initial channels (paper: 64), NFM's
    modules = stages (``stage``, the presets) or residual blocks (``block``)."""
    return (f"classifier: PreActResNet-18 w{width}, {modules}s", "nfm_preact_resnet18_cifar10",
            "preact_resnet18_cifar10", {"initial_channels": width, "nfm_modules": modules}, batch)


def sort_of_clevr(batch: int) -> tuple[str, str, str, dict, int]:
    """The Sort-of-CLEVR CNN_MLP pair (NFM §4.3, Table 6): the presets as registered."""
    return ("sort_of_clevr: CNN_MLP", "nfm_cnn_mlp_sort_of_clevr", "cnn_mlp_sort_of_clevr", {}, batch)


def example_inputs(model: torch.nn.Module, batch: int) -> tuple[tuple, dict] | None:
    """``(args, kwargs)`` for one call of ``model``, or None when nothing here fits it."""
    if hasattr(model, "example_inputs"):
        return model.example_inputs(batch)
    c, g = model.config, torch.Generator().manual_seed(0)
    if hasattr(c, "latent_dim"):                                   # a generator (models/gan.py): z [B, latent_dim]
        return ((torch.randn(batch, c.latent_dim, generator=g),), {})
    if hasattr(c, "image_size") and hasattr(c, "in_channels"):
        x = torch.rand(batch, c.in_channels, c.image_size, c.image_size, generator=g)
        return ((x,), {})
    if hasattr(c, "vocab_size") and hasattr(c, "max_len"):
        return ((torch.randint(0, c.vocab_size, (batch, min(c.max_len, 64)), generator=g),), {})
    return None


def _to(inputs: tuple[tuple, dict], device: torch.device) -> tuple[tuple, dict]:
    move = (lambda v: v.to(device) if isinstance(v, torch.Tensor) else v)
    args, kwargs = inputs
    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def _channels_last(inputs: tuple[tuple, dict]) -> tuple[tuple, dict] | None:
    """``inputs`` with every image ``[B, C, H, W]`` in ``torch.channels_last``; None when there is none."""
    image = (lambda v: isinstance(v, torch.Tensor) and v.dim() == 4)
    args, kwargs = inputs
    if not any(image(v) for v in (*args, *kwargs.values())):
        return None
    move = (lambda v: v.contiguous(memory_format=torch.channels_last) if image(v) else v)
    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out
    return next(v for v in values if isinstance(v, torch.Tensor))


PRECISION = {"fp32": None, "bf16": torch.bfloat16}


def _cast(inputs: tuple[tuple, dict], precision: str) -> torch.autocast:
    """Autocast for ``precision`` on the inputs' device (disabled for fp32)."""
    args, kwargs = inputs
    device = next(v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)).device.type
    return torch.autocast(device, dtype=PRECISION[precision] or torch.bfloat16, enabled=precision != "fp32")


def train_step(model: torch.nn.Module, inputs: tuple[tuple, dict], precision: str = "fp32") -> Callable[[], None]:
    args, kwargs = inputs

    def step() -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        with _cast(inputs, precision):
            out = _first_tensor(model(*args, **kwargs))
        out.float().square().mean().backward()
    return step


def eval_forward(model: torch.nn.Module, inputs: tuple[tuple, dict], precision: str = "fp32") -> Callable[[], None]:
    args, kwargs = inputs

    def forward() -> None:
        model.eval()
        with torch.no_grad(), _cast(inputs, precision):
            model(*args, **kwargs)
    return forward


def counting_faults(fn: Callable[[], None], faults: list[int]) -> Callable[[], None]:
    """``fn`` that appends its minor page faults (this process, ``ru_minflt``) to ``faults`` at each call."""
    def call() -> None:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return call


READER_MODULES = ("attention", "nfm_read")   # what a former nfm.py imports from modwire.nn, taken from its folder


def load_reader(path: str) -> dict[str, Callable]:
    """The methods of ``NFMLayer`` of a former ``modwire/nn/nfm.py`` (``--baseline-reader``: the file, or a
    former ``modwire/nn`` folder), run with that module's own helpers: its memory entries are its own, so
    its reader and writer travel together.
    From a folder, the former ``attention.py`` and ``nfm_read.py`` there stand in for the current ones
    while the former ``nfm.py`` is imported (its ``sparse_softmax`` and read-order helpers)."""
    folder = Path(path) if Path(path).is_dir() else None
    saved = {name: sys.modules.get(f"modwire.nn.{name}") for name in READER_MODULES}
    try:
        for name in READER_MODULES:
            if folder is not None and (folder / f"{name}.py").exists():
                sys.modules[f"modwire.nn.{name}"] = _load_module(f"modwire.nn._bench_old_{name}", folder / f"{name}.py")
        module = _load_module("modwire.nn._bench_old_nfm", folder / "nfm.py" if folder else Path(path))
    finally:
        for name, current in saved.items():
            sys.modules[f"modwire.nn.{name}"] = current
    old = module.NFMLayer
    methods = {name: fn for name, fn in vars(old).items() if callable(fn) and not name.startswith("__")}
    if not hasattr(module, "MemoryEntry"):                        # before issue 39: entries (K̂, V̂) [B, *S, H, d]
        def write(self, h, cache=None):
            if not self.writes:
                raise RuntimeError("NFM: this module's output is never read")
            return self.project_memory(h)
        methods["write"] = write
    return methods


def _load_module(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module                               # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def with_reader(model: torch.nn.Module, methods: dict[str, Callable]) -> torch.nn.Module | None:
    """``model`` with ``methods`` on each of its NFM layers; None where a layer's class replaces one of them
    (the LM's shared projections: their hooks speak the current reader's layout, not the former's)."""
    layers = [m for m in model.modules() if isinstance(m, NFMLayer)]
    if any(getattr(type(m), name) is not getattr(NFMLayer, name) for m in layers for name in methods):
        return None
    for m in layers:
        for name, fn in methods.items():
            setattr(m, name, types.MethodType(fn, m))
    return model


def compiled_readers(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with each NFM layer's ``read`` compiled (``--compile readers``): one dynamo cache entry per
    reader, shape and grad mode, so the recompile limits are raised for this process."""
    layers = [m for m in model.modules() if isinstance(m, NFMLayer)]
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 8 * len(layers))
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           64 * len(layers))
    for m in layers:
        m.read = torch.compile(m.read, dynamic=False)
    return model


def timed_pair(base: torch.nn.Module, nfm: torch.nn.Module, compile: str | None,
               new_nfm: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The base and NFM as ``--compile`` times them: as they are, both compiled (``model``), or a copy of
    the NFM (``new_nfm()``, ``nfm``'s weights) with its readers compiled (``readers``)."""
    if not compile:
        return base, nfm
    torch._dynamo.reset()                   # each pair compiles afresh: the models of a pair share code objects
    if compile == "model":
        return tuple(torch.compile(m, **m.compile_kwargs(fullgraph=True)) for m in (base, nfm))
    copy = compiled_readers(new_nfm())
    copy.load_state_dict(nfm.state_dict())
    return base, copy


#: What ``--compile`` compiled, for labels (a former run's ``true`` is ``model``).
COMPILED = {"model": ("both compiled", "torch.compile(fullgraph=True) on both sides"),
            "readers": ("NFM readers compiled", "the NFM's readers compiled (each NFMLayer.read), the rest and "
                                                "the base eager")}


def _compiled(value: Any) -> str | None:
    return "model" if value is True else value or None


def pairs(globs: list[str]) -> list[tuple[str, str, str, dict, int]]:
    """``(label, nfm preset, base preset, overrides, batch)`` of every registered NFM pair matching ``globs``."""
    names = set(modwire.list_models())
    found = [n for n in sorted(names) if n.startswith("nfm_") and n[4:] in names
             and any(fnmatch.fnmatch(n, g) or fnmatch.fnmatch(n[4:], g) for g in globs)]
    return [(n[4:], n, n[4:], {}, 8) for n in found]


def _median(xs: list[int]) -> float:
    xs = sorted(xs)
    return float(xs[len(xs) // 2]) if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def measure(label: str, nfm_name: str, base_name: str, overrides: dict, batch: int, repeats: int,
            device: torch.device, old_read: dict[str, Callable] | None = None, precision: str = "fp32",
            compile: str | None = None, channels_last: bool = False) -> dict | None:
    torch.manual_seed(0)
    nfm = modwire.create_model(nfm_name, **overrides).to(device)
    base = modwire.create_model(base_name, **overrides).to(device)
    inputs = example_inputs(base, batch)
    if inputs is None:
        print(f"{label:<40} skipped: no example input for model_type {base.config.model_type!r}")
        return None
    inputs = _to(inputs, device)
    timed_base, timed_nfm = timed_pair(base, nfm, compile, lambda: modwire.create_model(nfm_name, **overrides).to(device))
    first_inputs, last_inputs = inputs, _channels_last(inputs) if channels_last else None
    if last_inputs is not None:                                   # the channels-last copies are the timed pair
        timed_base, timed_nfm = (deepcopy(m).to(memory_format=torch.channels_last) for m in (base, nfm))
        inputs = last_inputs
    b, n = train_step(timed_base, inputs, precision), train_step(timed_nfm, inputs, precision)
    faults: dict[str, list[int]] = {"base": [], "nfm": [], "old": []}
    fns = {"base": counting_faults(b, faults["base"]), "base x2": lambda: (b(), b()),
           "nfm": counting_faults(n, faults["nfm"]),
           "eval base": eval_forward(timed_base, inputs, precision), "eval nfm": eval_forward(timed_nfm, inputs, precision)}
    if compile:                                                   # the same NFM, eager, in the same rounds
        fns.update({"nfm eager": train_step(nfm, inputs, precision), "eval nfm eager": eval_forward(nfm, inputs, precision)})
    if compile == "model":                                        # and the base, eager: what compiling it alone gives
        fns.update({"base eager": train_step(base, inputs, precision),
                    "eval base eager": eval_forward(base, inputs, precision)})
    if last_inputs is not None:                                   # the channels-first pair in the same rounds
        fns.update({f"{name} channels-first": make(m, first_inputs, precision) for name, m, make in
                    (("nfm", nfm, train_step), ("eval nfm", nfm, eval_forward), ("base", base, train_step),
                     ("eval base", base, eval_forward))})
    old = with_reader(modwire.create_model(nfm_name, **overrides).to(device), old_read) if old_read else None
    if old is not None:
        old.load_state_dict(nfm.state_dict())
        fns["old"] = counting_faults(train_step(old, inputs, precision), faults["old"])
        fns["eval old"] = eval_forward(old, inputs, precision)
    t = time_interleaved(fns, iters=repeats, warmup=2 if compile else 1)    # compiled: the first calls compile
    timed = {k: v[1:] or v for k, v in faults.items()}            # the warm-up call left out
    row = {"label": label, "batch": batch, "base": t["base"], "base x2": t["base x2"], "nfm": t["nfm"],
           "eval base": t["eval base"], "eval nfm": t["eval nfm"],
           "train ratio": t["nfm"] / t["base"], "eval ratio": t["eval nfm"] / t["eval base"],
           "faults base": _median(timed["base"]), "faults nfm": _median(timed["nfm"]),
           "params": (base.num_parameters(), nfm.num_parameters())}
    old_cols = f" {'—':>9} {'—':>7} {'—':>7} {'—':>9}" if old_read and old is None else ""
    if old is not None:
        row.update({"old": t["old"], "eval old": t["eval old"], "faults old": _median(timed["old"])})
        old_cols = (f" {t['old'] * 1e3:>9.1f} {t['old'] / t['nfm']:>7.2f} {t['eval old'] / t['eval nfm']:>7.2f}"
                    f" {row['faults old']:>9.0f}")
    print(f"{label:<40} {batch:>5} {t['base'] * 1e3:>9.1f} {t['base x2'] * 1e3:>9.1f} {t['nfm'] * 1e3:>9.1f} "
          f"{row['train ratio']:>9.2f} {t['nfm'] / t['base x2']:>11.2f} {t['eval base'] * 1e3:>9.1f} "
          f"{t['eval nfm'] * 1e3:>9.1f} {row['eval ratio']:>7.2f} {row['faults base']:>9.0f} "
          f"{row['faults nfm']:>9.0f}{old_cols}   {row['params'][0]:,} → {row['params'][1]:,}")
    if compile:
        row.update({"nfm eager": t["nfm eager"], "eval nfm eager": t["eval nfm eager"]})
        print(f"{label:<40} NFM compiled / eager (speed: eager time over compiled time): train "
              f"{t['nfm eager'] / t['nfm']:.2f}, eval {t['eval nfm eager'] / t['eval nfm']:.2f}")
    if compile == "model":
        row.update({"base eager": t["base eager"], "eval base eager": t["eval base eager"],
                    "nfm compile options": nfm.compile_options()})
        print(f"{label:<40} base compiled / eager (speed): train {t['base eager'] / t['base']:.2f}, "
              f"eval {t['eval base eager'] / t['eval base']:.2f}")
    if last_inputs is not None:
        row.update({k: v for k, v in t.items() if k.endswith("channels-first")})
        print(f"{label:<40} channels-last / channels-first (speed: channels-first time over channels-last time): "
              f"NFM train {speed(row, 'nfm'):.2f}, eval {speed(row, 'eval nfm'):.2f}; base train "
              f"{speed(row, 'base'):.2f}, eval {speed(row, 'eval base'):.2f}")
    return row


def speed(row: dict, name: str) -> float:
    """``--channels-last``: the channels-first time of ``name`` over its channels-last time."""
    return row[f"{name} channels-first"] / row[name]


def goals(rows: list[dict], precision: str = "fp32", compile: str | None = None) -> list[dict]:
    """Issue 25's goals (issue 39 keeps them; and issue 13's target) over the measured rows, and with
    ``--precision bf16`` issue 39's NFM / base ≤ 2.5 in bf16 (a GPU goal): ``{goal, value, limit, pass}``
    (``--compile``: the goals, set for eager models, checked on the compiled models, and labelled so)."""
    out = []

    def check(goal: str, value: float, limit: float) -> None:
        out.append({"goal": goal + (f" ({COMPILED[compile][0]})" if compile else ""), "value": value, "limit": limit,
                    "pass": value <= limit})
    for r in rows:
        if r["label"].startswith("classifier"):
            width = int(r["label"].split(" w")[1].split(",")[0])
            train, ev = GOALS.get(width, (None, None))
            if train is not None:
                check(f"{r['label']}: train nfm/base", r["train ratio"], train)
                check(f"{r['label']}: eval nfm/base", r["eval ratio"], ev)
            check(f"{r['label']}: train nfm/(base×2) (issue 13)", r["nfm"] / r["base x2"], TARGET)
        if r["label"].startswith("sort_of_clevr"):
            check(f"{r['label']}: train nfm/base", r["train ratio"], SOC_GOAL)
        if precision == "bf16" and r["label"].startswith(("classifier", "sort_of_clevr")):
            check(f"{r['label']}: train nfm/base in bf16 (issue 39)", r["train ratio"], BF16_GOAL)
        check(f"{r['label']}: page faults per train step nfm/base", r["faults nfm"] / max(r["faults base"], 1.0), 1.0)
    return out


def machine(device: torch.device) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpu": cpu, "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "python": sys.version.split()[0], "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "git_commit": commit, "git_dirty": dirty}


def write_text(path: str, text: str) -> None:
    """``text`` to ``path`` atomically (a temporary file beside it, then ``os.replace``)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


def write_json(path: str, data: dict) -> None:
    """``data`` to ``path`` atomically."""
    write_text(path, json.dumps(data, indent=1) + "\n")


def markdown(result: dict) -> str:
    """The rows and goals of one run as Markdown (``--markdown``)."""
    m = result["machine"]
    old = any("old" in r for r in result["rows"])
    compiled = _compiled(result.get("compile"))
    base_eager = any("base eager" in r for r in result["rows"])
    last = bool(result.get("channels_last"))
    options = sorted({f"{k}={v}" for r in result["rows"] for k, v in r.get("nfm compile options", {}).items()})
    lines = [f"NFM cost (`benchmarks/bench_nfm.py {' '.join(result['argv'])}`; {m['cpu']}, {m['threads']} thread(s), "
             f"{m['device']}, {result['precision']}, {COMPILED[compiled][1] if compiled else 'eager'}"
             f"{', both models and their image inputs channels-last' if last else ''}"
             f"{' (the NFM with inductor options ' + ', '.join(options) + ')' if options else ''}, "
             f"torch {m['torch']}, {m['date']}, commit {m['git_commit']}"
             f"{' + working tree' if m['git_dirty'] else ''}; medians of {result['repeats']} interleaved rounds: "
             f"compare ratios within a row).", "",
             "| pair | batch | train nfm / base | eval nfm / base | train nfm / (base×2) | page faults / train step base → nfm"
             + (" | former reader / current (train) | (eval) |" if old else " |")
             + (" NFM compiled / eager, speed (train) | (eval) |" if compiled else "")
             + (" base compiled / eager, speed (train) | (eval) |" if base_eager else "")
             + (" NFM channels-last / channels-first, speed (train) | (eval) | base, likewise (train) | (eval) |"
                if last else ""),
             "|---|---:|---:|---:|---:|---:" + ("|---:|---:|" if old else "|") + ("---:|---:|" if compiled else "")
             + ("---:|---:|" if base_eager else "") + ("---:|---:|---:|---:|" if last else "")]
    for r in result["rows"]:
        row = (f"| {r['label']} | {r['batch']} | {r['train ratio']:.2f} | {r['eval ratio']:.2f} | "
               f"{r['nfm'] / r['base x2']:.2f} | {r['faults base']:.0f} → {r['faults nfm']:.0f} |")
        if old:
            row += f" {r['old'] / r['nfm']:.2f} | {r['eval old'] / r['eval nfm']:.2f} |" if "old" in r else " — | — |"
        if compiled:
            row += f" {r['nfm eager'] / r['nfm']:.2f} | {r['eval nfm eager'] / r['eval nfm']:.2f} |"
        if base_eager:
            row += f" {r['base eager'] / r['base']:.2f} | {r['eval base eager'] / r['eval base']:.2f} |"
        if last:
            row += "".join(f" {speed(r, n):.2f} |" if f"{n} channels-first" in r else " — |"
                           for n in ("nfm", "eval nfm", "base", "eval base"))
        lines.append(row)
    if result["goals"]:
        lines += ["", "| goal | limit | measured | |", "|---|---:|---:|---|"]
        lines += [f"| {g['goal']} | {g['limit']:.2f} | {g['value']:.2f} | {'PASS' if g['pass'] else 'FAIL'} |"
                  for g in result["goals"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="micro pairs only, 1 repeat (smoke test)")
    ap.add_argument("--presets", nargs="+", default=["*micro"], help="globs over NFM preset names (default *micro)")
    ap.add_argument("--width", type=int, nargs="+", default=[16, 64],
                    help="classifier's initial channels, one row each (default 16 64; paper 64)")
    ap.add_argument("--batch", type=int, default=16, help="classifier's batch (default 16)")
    ap.add_argument("--soc-batch", type=int, default=16, help="Sort-of-CLEVR CNN_MLP pair's batch (default 16; "
                    "0: no such row)")
    ap.add_argument("--modules", nargs="+", default=["stage"], choices=["block", "stage"],
                    help="classifier rows: NFM before every stage (the presets, default) and/or every residual block")
    ap.add_argument("--baseline-reader", metavar="PATH",
                    help="a former modwire/nn/nfm.py, or a former modwire/nn folder (its nfm.py with that folder's "
                         "attention.py and nfm_read.py): its NFMLayer.read timed beside the current one")
    ap.add_argument("--out", metavar="PATH", help="write the rows, goals and machine as JSON (atomically)")
    ap.add_argument("--markdown", metavar="PATH", help="write the rows and goals as Markdown tables (atomically)")
    ap.add_argument("--from-json", metavar="PATH", help="with --markdown: render a former run's --out file, run nothing")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--compile", nargs="?", const="model", choices=sorted(COMPILED),
                    help="model (the default of a bare --compile): torch.compile(fullgraph=True) both models of each "
                    "pair (the goals then checked on the compiled pair); readers: only the NFM's readers; either "
                    "way the eager NFM is timed in the same rounds")
    ap.add_argument("--channels-last", action="store_true",
                    help="time both models of each image pair in torch.channels_last, and the channels-first pair "
                    "in the same rounds")
    ap.add_argument("--precision", default="fp32", choices=sorted(PRECISION),
                    help="fp32 (default) or bf16 autocast (issue 39's GPU goal: NFM <= 2.5x its base in bf16)")
    args = ap.parse_args()
    if args.from_json:
        if not args.markdown:
            ap.error("--from-json renders a result file: give --markdown PATH too")
        write_text(args.markdown, markdown(json.loads(Path(args.from_json).read_text())))
        return
    if args.channels_last and (args.compile or args.baseline_reader):
        ap.error("--channels-last times the current eager models: give it without --compile and --baseline-reader")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    todo = pairs(args.presets)
    if not args.quick:
        todo += [classifier(w, args.batch, m) for w in args.width for m in args.modules]
        todo += [sort_of_clevr(args.soc_batch)] if args.soc_batch else []
    repeats = 1 if args.quick else args.repeats
    old_read = load_reader(args.baseline_reader) if args.baseline_reader else None
    print(f"threads {torch.get_num_threads()}, device {device}, train step (forward + backward) and eval forward, "
          f"median of {repeats} interleaved rounds")
    old_head = f" {'old ms':>9} {'old/new':>7} {'ev o/n':>7} {'flt old':>9}" if old_read else ""
    print(f"{'pair':<40} {'batch':>5} {'base ms':>9} {'base×2 ms':>9} {'nfm ms':>9} {'nfm/base':>9} "
          f"{'nfm/(base×2)':>11} {'ev base':>9} {'ev nfm':>9} {'ev n/b':>7} {'flt base':>9} {'flt nfm':>9}{old_head}"
          f"   params base → nfm")
    rows = [r for r in (measure(*p, repeats=repeats, device=device, old_read=old_read, precision=args.precision,
                                compile=args.compile, channels_last=args.channels_last) for p in todo) if r is not None]
    checked = [] if args.quick else goals(rows, args.precision, args.compile)
    for g in checked:
        print(f"goal {g['goal']} <= {g['limit']:.2f}: {g['value']:.2f} {'PASS' if g['pass'] else 'FAIL'}")
    if args.markdown:
        write_text(args.markdown, markdown({"argv": sys.argv[1:], "machine": machine(device), "repeats": repeats,
                                            "precision": args.precision, "compile": args.compile,
                                            "channels_last": args.channels_last, "rows": rows, "goals": checked}))
        print(f"wrote {args.markdown}")
    if args.out:
        write_json(args.out, {"benchmark": "bench_nfm.py", "argv": sys.argv[1:], "machine": machine(device),
                              "repeats": repeats, "precision": args.precision, "compile": args.compile,
                              "channels_last": args.channels_last, "rows": rows, "goals": checked})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
