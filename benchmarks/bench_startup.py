"""Start-up time: ``create_model`` and ``from_pretrained`` of every preset (issue 9, item 7).

Run ``python benchmarks/bench_startup.py`` (about a minute on 2 quiet cores; add
``--presets 'nac_imagenet'`` for one preset, ``--quick`` for the small presets only).
Run it twice, with ``OMP_NUM_THREADS=1`` and with the default thread count: torch's
initialiser collapses when threads outnumber the free cores.

For every preset it prints, as medians over ``--repeat`` rounds:

* ``old``: ``create_model`` with the previous initialiser, ``torch.nn.init.trunc_normal_``
  (patched back in for the measurement). For a ±2σ truncation torch redraws the whole
  tensor until no element is out of bounds, about five full passes per weight.
* ``new``: ``create_model`` as shipped (:func:`modwire.nn.init.trunc_normal_`: only the
  outliers are redrawn, on one thread; the same distribution, see tests/nn/test_init.py).
  Old and new are interleaved (old, new, old, new, ...) so that slow phases of a shared
  machine hit both; ``old/new`` is their ratio.
* ``load``: ``from_pretrained`` of the preset saved once to a temporary directory (built on
  the meta device, the saved tensors assigned: nothing is initialised), and ``load old``:
  the previous path (build with the old initialiser, then ``load_state_dict``).

Target (issue 9): every preset's ``new`` under 1 s on this machine when it is quiet.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

import torch

import modwire
import modwire.nn.init as fast_init
from modwire.models import list_models

SMALL = ("*micro", "*small")


@contextlib.contextmanager
def old_initialiser() -> Iterator[None]:
    """``modwire.nn.init.init_linear_`` drawing through torch's ``trunc_normal_`` (the old init)."""
    fast = fast_init.trunc_normal_
    fast_init.trunc_normal_ = torch.nn.init.trunc_normal_
    try:
        yield
    finally:
        fast_init.trunc_normal_ = fast


def _seconds(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _old_build(name: str) -> None:
    with old_initialiser():
        modwire.create_model(name)


def _old_load(name: str, directory: str) -> None:
    from safetensors.torch import load_file
    with old_initialiser():
        model = modwire.create_model(name)
    model.load_state_dict(load_file(f"{directory}/model.safetensors"))


def bench_preset(name: str, repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"old": [], "new": [], "load": [], "load old": []}
    for _ in range(repeat):
        times["old"].append(_seconds(lambda: _old_build(name)))
        times["new"].append(_seconds(lambda: modwire.create_model(name)))
    with tempfile.TemporaryDirectory() as d:
        modwire.create_model(name).save_pretrained(d)
        for _ in range(repeat):
            times["load old"].append(_seconds(lambda: _old_load(name, d)))
            times["load"].append(_seconds(lambda: modwire.from_pretrained(d)))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="*", help="glob over preset names (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per measurement (median kept)")
    parser.add_argument("--quick", action="store_true", help="only the micro/small presets")
    args = parser.parse_args(argv)
    names = [n for n in list_models(args.presets) if not args.quick or any(n.endswith(s[1:]) for s in SMALL)]
    modwire.create_model("nac_micro")   # warm-up: imports, first-call dispatch
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, median of {args.repeat}")
    print(f"{'preset':28s} {'params':>8s} {'old':>8s} {'new':>8s} {'old/new':>8s} {'load old':>9s} {'load':>8s}")
    for name in names:
        params = modwire.create_model(name).num_parameters() / 1e6
        t = bench_preset(name, args.repeat)
        print(f"{name:28s} {params:7.1f}M {t['old']:7.3f}s {t['new']:7.3f}s {t['old'] / t['new']:7.1f}x "
              f"{t['load old']:8.3f}s {t['load']:7.3f}s", flush=True)


if __name__ == "__main__":
    main()
