"""Every command shown in README.md and docs/*.md runs (issue 27), so none goes stale.

Each fenced ```bash / ```sh / ```shell block is split into commands (``\\`` continuations joined,
``#`` comments dropped), and every command must match a rule of :data:`RULES`, the reviewed table
of what the test does with it: run it as written, run a quick form of it (a few steps, a few
samples), or, for what cannot run here (the test suite itself, 8 processes, a GPU, a paper's
dataset), a dry or validation form. A command that no rule covers fails the suite; so does a
rule that no command uses. The commands of one page run in order in one scratch directory (a
later command may use an earlier one's run), with ``configs/``, ``experiments/`` and
``benchmarks/`` linked in, the repository's ``python`` and ``modwire`` first on ``PATH``, and the
hermetic environment of ``tests/hermetic.py``: the default data root ``$MODWIRE_SYSTEM_DATASETS``
holds only fixtures written here (``tests/task_fixtures.py``).

Each fenced ```python block runs in a fresh namespace, in a scratch directory, unless
``tests/test_readme.py`` runs it with checks of its values (:data:`CHECKED_IN_TEST_README`).
```text blocks are output and are not run.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from task_fixtures import write_mnist

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent                   # the repository's environment: python, modwire
SHELL_LANGS = ("bash", "sh", "shell")
LINKED = ("configs", "experiments", "benchmarks", "README.md")   # what the commands read from the repository
QUICK_TRAIN = ("max_steps=2", "data.batch_size=8", "data.max_samples=64")
QUICK_GAN = ("gan.eval.batch_size=8", "gan.eval.num_samples=16", "gan.eval.real_samples=16",
             "gan.eval.classifier_epochs=1")


def doc_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def rel(path: Path) -> str:
    """The path as the docs name it: relative to the repository (a page elsewhere: its name)."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


# ----------------------------------------------------------------------------- reading the docs

@dataclass(frozen=True)
class Block:
    """One fenced code block: the file, the heading above it, its language, first line and text."""
    file: str
    heading: str
    lang: str
    line: int
    text: str


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the nearest heading above it."""
    out: list[Block] = []
    heading, lang, start, body = "", None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if lang is None and line.startswith("```"):
            lang, start, body = line[3:].strip(), number, []
        elif lang is not None and line.strip() == "```":
            out.append(Block(rel(path), heading, lang, start, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
    assert lang is None, f"{rel(path)}:{start}: a code block is never closed"
    return out


def commands(block: Block) -> list[str]:
    """The shell block's commands, one per logical line, comments dropped, re-quoted by shlex."""
    logical = re.sub(r"\\\n", " ", block.text)
    out = []
    for line in logical.splitlines():
        tokens = shlex.split(line, comments=True)
        if tokens:
            out.append(shlex.join(tokens))
    return out


def shell_commands(path: Path) -> list[tuple[Block, str]]:
    return [(b, c) for b in blocks(path) if b.lang in SHELL_LANGS for c in commands(b)]


# ----------------------------------------------------------------------------- the reviewed table

Rewrite = Callable[[list[str]], list[str]]


def append(*extra: str) -> Rewrite:
    return lambda tokens: [*tokens, *extra]


def with_flags(values: dict[str, str], *extra: str) -> Rewrite:
    """Set each ``--flag`` to its value (replacing the one given, else appending it), then ``extra``."""
    def rewrite(tokens: list[str]) -> list[str]:
        out = list(tokens)
        for flag, value in values.items():
            if flag in out:
                out[out.index(flag) + 1] = value
            else:
                out += [flag, value]
        return [*out, *extra]
    return rewrite


def make_dry(tokens: list[str]) -> list[str]:
    """``make TARGET`` → ``make -n -C <repo> TARGET``: prints the recipe, runs nothing."""
    return ["make", "-n", "-C", str(ROOT), *tokens[1:]]


# validates a `modwire train` command line without training: the config and its overrides
# (load_config), the task's parameters and the model's overrides against the preset
# (the run kind's model_overrides, training/kinds.py; builds no weights, reads no data)
VALIDATE = """
import sys
from modwire.training import load_config
from modwire.training.kinds import kind_of_config
cfg = load_config(sys.argv[1] or None, sys.argv[2:])
kind_of_config(cfg).model_overrides(cfg)
print(f"valid: {cfg.model.name} on {cfg.data.task}")
"""


def validate_train(tokens: list[str]) -> list[str]:
    """``[torchrun ... -m] modwire train [CONFIG] [--set K=V ...]`` → the validation of that config."""
    args = tokens[tokens.index("train") + 1:]
    config, overrides, i = "", [], 0
    while i < len(args):
        if args[i] == "--set":
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                overrides.append(args[i])
                i += 1
        else:
            assert not args[i].startswith("--"), f"validate_train: flag {args[i]} is not handled"
            config, i = args[i], i + 1
    return ["python", "-c", VALIDATE, config, *overrides]


@dataclass(frozen=True)
class Rule:
    """What the test does with the commands that ``pattern`` fully matches (first rule wins)."""
    pattern: str
    how: str                      # "as written", "quick" or "dry"
    why: str
    rewrite: Rewrite | None = None
    expect: str | None = None     # a regex the command's output must contain
    creates: str | None = None    # a file (relative to the scratch directory) it must write

    def __post_init__(self):
        assert self.how in ("as written", "quick", "dry") and (self.rewrite is None) == (self.how == "as written")

    def command(self, text: str) -> list[str]:
        tokens = shlex.split(text)
        return self.rewrite(tokens) if self.rewrite else tokens


RULES: tuple[Rule, ...] = (
    Rule(r"make test", "dry", "the test suite itself: `make -n` shows the recipe", make_dry, expect=r"pytest"),
    Rule(r"make demo", "dry", "minutes of training; tests/test_demo.py runs modwire.demo at a tiny budget",
         make_dry, expect=r"modwire\.demo"),
    Rule(r"python -m modwire\.demo --dataset digits .*", "quick",
         "the demo on the bundled digits: 3 training steps, 32 test images per copy, 2 draws",
         with_flags({"--steps": "3", "--max-samples": "32", "--draws": "2"}), expect=r"random subsets"),
    Rule(r"make bench", "dry", "about half an hour; tests/test_benchmarks.py runs the scripts' quick forms",
         make_dry, expect=r"bench_nac\.py"),
    Rule(r"torchrun --nproc-per-node \d+ -m modwire train .*", "dry",
         "several processes (and GPUs); the config is validated. tests/training/test_training_processes.py "
         "runs torchrun with 2 CPU processes", validate_train, expect=r"^valid: "),
    Rule(r"modwire train configs/(?!cpu/|gan/cpu/)\S+( --set .*)?", "dry",
         "a paper's GPU-sized setup and dataset, not on this machine; the config is validated",
         validate_train, expect=r"^valid: "),
    Rule(r"modwire train --resume \S+( --set epochs=\d+ --allow-change epochs)?", "as written",
         "resumes a run made above with the quick form (max_steps=2): it ends at once",
         expect=r'"status": "finished"'),
    Rule(r"modwire train configs/gan/cpu/\S+ --set .*", "quick",
         "a CPU-sized GAN run: 2 steps of batch 8, its classifier-FID on 16 images after one classifier epoch",
         append("--set", *QUICK_TRAIN, *QUICK_GAN), expect=r'"status": "finished"'),
    Rule(r"modwire train (configs/cpu/\S+ )?--set .*", "quick",
         "a CPU-sized run: 2 steps of batch 8 on at most 64 samples per split", append("--set", *QUICK_TRAIN),
         expect=r'"status": "finished"'),
    Rule(r"modwire eval \S+ --set gan\.eval\.\S+", "as written",
         "a GAN run scores its generated samples with the run's own gan.eval settings (the quick ones above); "
         "--max-samples does not apply to it", expect=r'"classifier_fid"'),
    Rule(r"modwire eval \S+( .*)?", "quick", "scores at most 16 samples",
         with_flags({"--max-samples": "16"}), expect=r'"step": \d+'),
    Rule(r"modwire analyze \S+ --baseline .*", "quick",
         "NAC vs a baseline: 16 samples, 1 timed batch of 8, edges removed at 0 and 90 % only, no plots",
         with_flags({"--max-samples": "16", "--iters": "1", "--batch": "8", "--edges": "0,.9"}, "--no-plots"),
         expect=r"wrote:"),
    Rule(r"modwire analyze \S+ --drop \S+", "quick", "module dropping: 16 samples, 1 timed batch of 8, no plots",
         with_flags({"--max-samples": "16", "--iters": "1", "--batch": "8"}, "--no-plots"), expect=r"wrote:"),
    Rule(r"modwire analyze \S+", "quick",
         "what the model declares (circuits, workspace, read map) on 64 samples (enough for the 5-fold "
         "separation score of a conditional NAC), no plots",
         with_flags({"--max-samples": "64"}, "--no-plots"), expect=r"wrote:|plots in"),
    Rule(r"modwire finetune \S+ --task .*", "quick", "one seed, 2 steps of batch 8 on at most 64 samples per split",
         with_flags({"--epochs": "1", "--seeds": "0"}, "--set", "max_steps=2", "data.batch_size=8",
                    "data.max_samples=64"), expect=r"seed 0"),
    Rule(r"modwire reproduce --list", "as written", "lists the studies", expect=r"table1_ladder"),
    Rule(r"modwire reproduce \S+ --quick --out \S+", "as written",
         "the study's quick form (tiny data, a few steps) into the scratch directory", expect=r"study\.json"),
    Rule(r"modwire reproduce \S+ --dry-run", "as written", "prints the study's commands, runs none",
         expect=r"-m modwire\.experiments\."),
    Rule(r"modwire results( --check README\.md)?", "as written",
         "reads the committed result files (README.md is linked in)", expect=r"results:begin|Paper|the results section matches the result files"),
    Rule(r"modwire list (models|tasks)", "as written", "prints the registry", expect=r"nac_small|fashion_mnist"),
    Rule(r"modwire data check configs/cpu/\S+", "as written", "reads the fixture dataset",
         expect=r"all readable"),
    Rule(r"python -c .from modwire\.analysis import plot_priors; plot_priors\(.*priors\.png.*\).", "as written",
         "draws the four graph priors", creates="priors.png"),
)


def rule_for(command: str) -> Rule | None:
    return next((r for r in RULES if re.fullmatch(r.pattern, command)), None)


# a python block whose values tests/test_readme.py checks, by (file, heading): that test's name
CHECKED_IN_TEST_README = {
    ("README.md", "Neural Attentive Circuits and Perceiver IO"): "test_readme_nac_example_runs_as_written",
    ("README.md", "Neural Interpreters and the ViT"): "test_readme_ni_example_runs_as_written",
    ("README.md", "The Associative Transformer (AiT)"): "test_readme_ait_example_runs_as_written",
    ("README.md", "Neural Function Modules (NFM)"): "test_readme_nfm_example_runs_as_written",
    ("docs/nac.md", "Quick start"): "test_nac_quickstart_runs_as_written",
    ("docs/nfm.md", "Transformer language model with NFM (NFM §4.6, Table 8)"): "test_nfm_lm_example_runs_as_written",
    ("docs/speed.md", "What dropping modules can save"): "test_speed_flop_ratio_of_dropping_is_as_stated",
    ("docs/tools.md", "A plain PyTorch loop"): "test_tools_plain_loop_gives_the_losses_of_modwire_train",
    ("docs/tools.md", "A LightningModule"): "test_tools_lightning_module_gives_the_losses_of_modwire_train",
}

# pages whose commands train several models: run with the slow tests (`make test-all`, CI)
SLOW_PAGES = {"README.md", "docs/analysis.md", "docs/nac.md", "docs/nfm.md", "docs/reproduce.md", "docs/training.md"}


# ----------------------------------------------------------------------------- the static checks

def test_every_command_in_the_docs_has_a_reviewed_rule():
    missing = [f"{b.file}:{b.line}: {c}" for path in doc_files() for b, c in shell_commands(path)
               if rule_for(c) is None]
    assert not missing, ("commands that no rule of tests/test_doc_commands.py RULES covers (add one: run as "
                         "written, a quick form or a dry form, with the reason):\n" + "\n".join(missing))


def test_every_rule_covers_a_command():
    used = {id(rule_for(c)) for path in doc_files() for _, c in shell_commands(path)}
    unused = [r.pattern for r in RULES if id(r) not in used]
    assert not unused, f"rules that no command in README.md or docs/ uses (remove them): {unused}"


def test_the_rules_rewrite_as_reviewed():
    """Spot checks of the table: the quick and dry forms are what the reasons say."""
    train = rule_for("modwire train configs/cpu/nac_fashion_mnist.yaml --set out_dir=runs/x")
    assert train.command("modwire train configs/cpu/x.yaml --set a=1")[-4:] == ["--set", *QUICK_TRAIN]
    assert rule_for("modwire train configs/nac_tiny_imagenet.yaml").how == "dry"
    assert rule_for("modwire train configs/gan/nfm_gan_resnet_cifar10.yaml").how == "dry"
    assert rule_for("modwire train configs/gan/cpu/nfm_gan_fashion_mnist.yaml --set out_dir=g").how == "quick"
    text = "modwire analyze runs/a --baseline runs/b --max-samples 2000 --edges 0,.5,.9"
    analyze = rule_for(text).command(text)
    assert analyze[analyze.index("--max-samples") + 1] == "16" and analyze.count("--max-samples") == 1
    assert analyze[analyze.index("--edges") + 1] == "0,.9" and analyze[-1] == "--no-plots"
    assert "--iters" not in rule_for("modwire analyze runs/ait").command("modwire analyze runs/ait")
    dry = rule_for("torchrun --nproc-per-node 8 -m modwire train c.yaml --set a=1 b=2")
    assert dry.command("torchrun --nproc-per-node 8 -m modwire train c.yaml --set a=1 b=2")[-3:] == ["c.yaml", "a=1", "b=2"]
    assert rule_for("rm -rf runs") is None and rule_for("modwire train configs/cpu/x.yaml") is None


def test_every_checked_python_block_exists_and_its_test_does():
    import test_readme

    found = {(b.file, b.heading) for path in doc_files() for b in blocks(path) if b.lang == "python"}
    for key, test in CHECKED_IN_TEST_README.items():
        assert key in found, f"no python block under {key}: update CHECKED_IN_TEST_README"
        assert callable(getattr(test_readme, test, None)), f"tests/test_readme.py has no {test}"


def test_cited_result_files_exist():
    """Every result file or directory the docs cite is committed where they say."""
    cited = {m for path in doc_files()
             for m in re.findall(r"(?:experiments|benchmarks)/results/[\w./-]*[\w/]", path.read_text())}
    placeholder = re.compile(r"/[A-Z][A-Z_]*(/|$)")      # experiments/results/NAME/: a name to fill in
    missing = sorted(c for c in cited if not placeholder.search(c) and not (ROOT / c).exists())
    assert not missing, f"cited in README.md / docs/ but not in the repository: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).strip().replace(" ", "-")


def test_links_between_pages_resolve():
    """Every relative link of README.md and docs/ names a file that exists, and a heading it has."""
    broken = []
    for path in doc_files():
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue                                    # a web address
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{rel(path)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in {
                    slug(line.lstrip("#")) for line in dest.read_text().splitlines() if line.startswith("#")}:
                broken.append(f"{rel(path)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_block_reader_joins_continuations_and_drops_comments(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# T\n```bash\nmodwire train --set a=1 \\\n    b='x y'   # two\n# only a comment\n```\n"
                    "```text\nnot run\n```\n")
    (block, command), = shell_commands(page)
    assert (block.heading, block.line, command) == ("T", 2, "modwire train --set a=1 'b=x y'")
    assert [b.lang for b in blocks(page)] == ["bash", "text"]


# ----------------------------------------------------------------------------- running them

def _write_fixtures(work: Path) -> dict[str, str]:
    """The scratch directory: the repository's folders linked in, fixture data, the environment."""
    for name in LINKED:
        (work / name).symlink_to(ROOT / name)
    datasets = work / ".datasets"
    write_mnist(datasets / "fashion-mnist", n=40, balanced=True)   # where fashion_mnist looks by default
    from PIL import Image
    for split in ("train", "test"):                                  # docs/data.md's own image folders
        for c, cls in enumerate(("cat", "dog")):
            (work / "data" / "my_images" / split / cls).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (20, 16), (60 * c + 10 * i, 0, 0)).save(work / "data" / "my_images" / split / cls / f"{i}.png")
    env = dict(os.environ)
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", MODWIRE_SYSTEM_DATASETS=str(datasets),
               OMP_NUM_THREADS=str(torch.get_num_threads()))
    return env


def _shell_pages() -> Iterator:
    for path in doc_files():
        if shell_commands(path):
            marks = [pytest.mark.slow] if rel(path) in SLOW_PAGES else []
            yield pytest.param(path, id=rel(path), marks=marks)


@pytest.mark.parametrize("path", list(_shell_pages()))
def test_shell_commands_of_the_page_run(path, tmp_path):
    assert (BIN / "modwire").exists(), f"{BIN / 'modwire'} is missing: install modwire (make install)"
    env = _write_fixtures(tmp_path)
    for block, text in shell_commands(path):
        rule = rule_for(text)
        assert rule is not None, f"{block.file}:{block.line}: no rule for {text!r}"
        argv = rule.command(text)
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        print(f"{time.perf_counter() - start:6.1f} s  {block.file}:{block.line}: {shlex.join(argv)[:150]}")
        output = done.stdout + done.stderr
        where = f"{block.file}:{block.line}: {text}\n  ran ({rule.how}): {shlex.join(argv)}\n{output[-3000:]}"
        assert done.returncode == 0, f"exit {done.returncode}: {where}"
        if rule.expect:
            assert re.search(rule.expect, output, re.M), f"output lacks /{rule.expect}/: {where}"
        if rule.creates:
            assert (tmp_path / rule.creates).is_file(), f"{rule.creates} was not written: {where}"


def _python_blocks() -> Iterator:
    for path in doc_files():
        for b in blocks(path):
            if b.lang == "python" and (b.file, b.heading) not in CHECKED_IN_TEST_README:
                yield pytest.param(b, id=f"{b.file}:{b.line}")


@pytest.mark.parametrize("block", list(_python_blocks()))
def test_python_block_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(block.text, f"{block.file}:{block.line}", "exec"), {"__name__": "__doc_block__"})
