"""The README's results table, generated from the committed result files.

For every paper claim of :data:`registry.CLAIMS`, one row: the paper's number, modwire's CPU-scale
number read from ``experiments/results/<study>/study.json`` (mean ± sample std over the seeds, n
shown; a comparison between models with fewer than 3 seeds is flagged), the setting it was measured
in, and the command that reproduces it (``modwire reproduce NAME``). Below the table, where each
study.json came from (the run's commit, or the logs it was rebuilt from).

    python -m modwire.experiments.report                    # print the section
    python -m modwire.experiments.report --write README.md  # rewrite the section between the markers
    python -m modwire.experiments.report --check README.md  # exit 1, naming the differing lines, when it differs
    python -m modwire.experiments.report --rebuild [NAME]   # rebuild committed study.json files from their logs

``modwire results`` runs this module with the same arguments. The files are those of the clone
(:mod:`modwire.experiments.paths`); without one, ``--results DIR`` names the folder (``--rebuild``
needs the clone: it runs the studies' ``--report`` there). The section sits between the lines
``<!-- results:begin -->`` and ``<!-- results:end -->``; nothing else of the file is touched, and the
file is rewritten atomically. Numbers are formatted with fixed digits, so the same files always
give the same text.
"""
from __future__ import annotations

import argparse
import difflib
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from modwire.errors import UserError
from modwire.experiments import paths, registry
from modwire.experiments.paths import ROOT, require_checkout
from modwire.experiments.registry import Claim, Reported, Seeds

#: the clone's committed results (``None`` without a clone: ``--results DIR``)
RESULTS = None if ROOT is None else ROOT / "experiments" / "results"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
MIN_SEEDS = 3                                           # for a comparison between models (issue 27)
HEADER = ("Paper", "Claim", "Paper's number", "modwire, CPU scale: mean ± std (n)", "Setting here", "Reproduce")

# ----------------------------------------------------------------------------- reading the files


def load_studies(results: Path = RESULTS) -> dict[str, dict | None]:
    """Every registered study's ``study.json`` by study name (``None``: the study has not been run)."""
    from modwire.analysis.study import RESULTS_FILE, read_study

    out = {}
    for name, study in registry.every_study().items():
        path = results / study.results / RESULTS_FILE
        out[name] = read_study(path) if path.is_file() else None
    return out


def lookup(record: dict, path: str):
    """The value at a dotted ``path`` of ``record`` (an integer part indexes a list, ``-1`` the last);
    a path the record does not have is a :class:`ValueError` naming it."""
    value = record
    try:
        for part in path.split("."):
            value = value[int(part)] if isinstance(value, list) else value[part]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ValueError(f"no {path!r} in the record {json.dumps(record)[:160]}") from None
    return value


def matching(study: dict, where: dict) -> list[dict]:
    """The study's records whose fields equal ``where``'s."""
    return [r for r in study["results"] if isinstance(r, dict) and all(r.get(k) == v for k, v in where.items())]


def seed_values(study: dict, m: Seeds) -> list[float]:
    """One value per seed (scaled). Two records of one seed, or per-seed values spread over several
    records, are an error: the registry must say which record is meant."""
    records = matching(study, m.where)
    if m.per_seed:
        if len(records) > 1:
            raise ValueError(f"{study['study']}: {len(records)} records match {m.where}, expected one")
        got = lookup(records[0], m.path) if records else []
        got = [got[k] for k in sorted(got, key=int)] if isinstance(got, dict) else list(got)
    else:
        seeds = [r.get("seed", 0) for r in records]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{study['study']}: several records of one seed match {m.where} (seeds {seeds})")
        got = [lookup(r, m.path) for r in sorted(records, key=lambda r: r.get("seed", 0))]
    return [m.scale * float(v) for v in got]


# ----------------------------------------------------------------------------- the cells


def number(mean: float, std: float | None, digits: int) -> str:
    """``m ± s`` with fixed digits (``m`` alone without a spread)."""
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def measure_cell(study: dict, m: Seeds | Reported, digits: int) -> tuple[str, str, int | None]:
    """``(value, n text, seeds)`` of one measure; ``seeds`` is ``None`` for a :class:`Reported` one."""
    if isinstance(m, Reported):
        records = matching(study, m.where)
        if len(records) != 1:
            return f"missing in study.json ({m.where})", "", None
        r = records[0]
        n, digits = int(lookup(r, m.n_path)), digits if m.digits is None else m.digits
        return number(m.scale * lookup(r, m.mean), m.scale * lookup(r, m.std), digits), f"{n} {m.n_what}", None
    values = seed_values(study, m)
    if not values:
        return f"missing in study.json ({m.where})", "", 0
    spread = statistics.stdev(values) if len(values) > 1 else None
    digits = digits if m.digits is None else m.digits
    return number(statistics.fmean(values), spread, digits), f"n = {len(values)}", len(values)


def value_cell(claim: Claim, study: dict | None) -> str:
    """modwire's number(s) for a claim: each measure's mean ± std, n once when all share it, and a
    flag on a comparison between models with fewer than :data:`MIN_SEEDS` seeds."""
    entry = registry.every_study()[claim.study]
    if study is None:
        return f"not run (no experiments/results/{entry.results}/study.json)"
    cells = [measure_cell(study, m, claim.digits) for m in claim.measures]
    same_n = len({n for _, n, _ in cells}) == 1
    parts = [f"{m.label} {v}" + ("" if same_n or not n else f" ({n})") for m, (v, n, _) in zip(claim.measures, cells)]
    text = (" vs " if claim.compare and len(parts) == 2 else "; ").join(parts)
    if same_n and cells[0][1]:
        text += f" ({cells[0][1]})"
    seeds = [s for _, _, s in cells if s is not None]
    if claim.compare and seeds and min(seeds) < MIN_SEEDS:
        text += f" ⚠ fewer than {MIN_SEEDS} seeds"
    return text


def reproduce_cell(claim: Claim) -> str:
    """The command that reproduces a claim's number."""
    entry = registry.every_study()[claim.reproduce or claim.study]
    if entry.name not in registry.STUDY:
        raise ValueError(f"claim {claim.paper}, {claim.claim!r}: {entry.name} is not a study modwire reproduce runs")
    return f"`modwire reproduce {entry.name}`"


def provenance(name: str, study: dict) -> str:
    """Where one study.json came from: the run's commit and time, or the logs it was rebuilt from."""
    path = f"`experiments/results/{registry.every_study()[name].results}/study.json`"
    source = study.get("source")
    if source:
        commit = (source.get("logs_commit") or "uncommitted logs")[:7]
        return f"{path}: rebuilt from its run logs (last changed in {commit}) by `{source['command']}`"
    commit = (study.get("commit") or "unknown commit")[:7]
    minutes = "" if study.get("wall_time_s") is None else f", {study['wall_time_s'] / 60:.1f} min"
    cores = (study.get("machine") or {}).get("cpu_count")
    return f"{path}: run at {commit}" + (f" on {cores} CPUs" if cores else "") + minutes


# ----------------------------------------------------------------------------- the section


def section(results: Path = RESULTS) -> str:
    """The README's results section (the text between the markers, without them)."""
    studies = load_studies(results)
    rows = [[c.paper, c.claim, c.paper_value, value_cell(c, studies[c.study]), c.setting, reproduce_cell(c)]
            for c in registry.CLAIMS]
    used = list(dict.fromkeys(c.study for c in registry.CLAIMS if studies[c.study] is not None))
    lines = ["*Generated by `modwire results --write README.md` (`modwire.experiments.report`) from the committed "
             "`experiments/results/*/study.json`; `modwire results --check README.md` fails when this section "
             "and those files differ. Mean ± sample std over training seeds unless the cell says otherwise; "
             "paper numbers are from the papers' full-scale setups, ours from CPU-sized ones (the setting column), "
             "so only the direction of a comparison can be set beside the paper's.*", "",
             "| " + " | ".join(HEADER) + " |", "| " + " | ".join("---" for _ in HEADER) + " |",
             *("| " + " | ".join(row) + " |" for row in rows), "", "Where each number comes from:", "",
             *(f"- {provenance(name, studies[name])}" for name in used)]
    return "\n".join(lines) + "\n"


def split(text: str, where: str) -> tuple[str, str, str]:
    """``(before, section, after)`` of a text with one pair of markers, each on a line of its own."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(f"{where}: expected one line {BEGIN} followed by one line {END}, found {len(starts)} "
                         f"begin and {len(ends)} end marker(s)")
    b, e = starts[0], ends[0]
    return "".join(lines[:b + 1]), "".join(lines[b + 1:e]), "".join(lines[e:])


def write(path: Path, results: Path = RESULTS) -> bool:
    """Rewrite ``path``'s section (atomically); whether it changed."""
    from modwire.files import atomic_write_text

    text = path.read_text()
    before, old, after = split(text, str(path))
    new = section(results)
    if new != old:
        atomic_write_text(path, before + new + after)
    return new != old


def check(path: Path, results: Path = RESULTS) -> list[str]:
    """The differences between ``path``'s section and what the files give, as unified-diff lines
    (empty: they agree)."""
    _, old, _ = split(path.read_text(), str(path))
    return list(difflib.unified_diff(old.splitlines(), section(results).splitlines(), f"{path} (results section)",
                                     "what experiments/results/*/study.json give", lineterm="", n=0))


def rebuildable(results: Path = RESULTS) -> list[str]:
    """The studies whose committed ``study.json`` was rebuilt from committed logs (``source`` set):
    the ones ``--rebuild`` can rebuild. A study that trained here keeps only its study.json."""
    every = registry.every_study()
    return [n for n, s in every.items() if s.rebuild is not None and (results / s.results / "study.json").is_file()
            and json.loads((results / s.results / "study.json").read_text())["source"]]


def rebuild(names: Sequence[str], log=print) -> int:
    """Run each named study's ``rebuild`` command (its ``--report``: study.json from the committed
    logs, no training) with this Python, from the checkout's root; the number that failed."""
    root = require_checkout("modwire results --rebuild")
    every, known = registry.every_study(), rebuildable(root / "experiments" / "results")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"--rebuild: {unknown} cannot be rebuilt: only a study.json rebuilt from "
                         f"committed logs can (a study that trained here commits only its study.json); "
                         f"those: {', '.join(sorted(known))}")
    failed = 0
    for name in names or known:
        argv = [a.replace(registry.OUT, f"experiments/results/{every[name].results}") for a in every[name].rebuild]
        log(f"{name}: python {' '.join(argv)}")
        run = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True)
        if run.returncode != 0:
            failed += 1
            log(f"  failed ({run.returncode}): {run.stderr.strip().splitlines()[-1:] or ''}")
    return failed


def main(argv: list[str] | None = None, prog: str = "python -m modwire.experiments.report") -> int:
    ap = argparse.ArgumentParser(prog=prog, description="The README's results table, from experiments/results/*/"
                                                         "study.json: print it, --write it, or --check it.")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--write", type=Path, metavar="FILE", help="rewrite FILE's section between the markers")
    what.add_argument("--check", type=Path, metavar="FILE", help="exit 1 when FILE's section differs from the files")
    what.add_argument("--rebuild", nargs="*", metavar="NAME",
                      help="rebuild the study.json files rebuilt from committed logs, from them (all, or the NAMEs)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default experiments/results)")
    args = ap.parse_args(argv)
    if args.results is None and args.rebuild is None:
        print(f"{prog}: error: give --results DIR: {paths.NO_CHECKOUT}", file=sys.stderr)
        return 2
    try:
        if args.rebuild is not None:
            return 1 if rebuild(args.rebuild) else 0
        if args.write:
            changed = write(args.write, args.results)
            print(f"{args.write}: results section {'rewritten' if changed else 'already up to date'}")
            return 0
        if args.check:
            diff = check(args.check, args.results)
            if diff:
                print(f"{args.check}: the results section differs from experiments/results/*/study.json "
                      f"(run `modwire results --write {args.check}`):\n" + "\n".join(diff), file=sys.stderr)
                return 1
            print(f"{args.check}: the results section matches the result files")
            return 0
        print(section(args.results), end="")
        return 0
    except (ValueError, OSError, KeyError, json.JSONDecodeError, UserError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
