"""The training run's typed config. YAML files are mapped onto these dataclasses by
OmegaConf (structured configs): unknown keys and wrongly typed values are rejected
with the key's full path; ``--set a.b=value`` (merge) and ``--set a.b:=value``
(replace) overrides use the same machinery. A file may start from others with
``base:`` (see :func:`load_config`); :func:`validate` checks every field against the
``choices`` and ``bounds`` tables each section declares (:mod:`modwire.fields`), then the
relations between fields."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Optional, Sequence

from ..errors import ConfigWarning, UserError, UserTypeError
from ..fields import COUNT, NON_NEGATIVE, POSITIVE, UNIT, Bounds, ChoicesOrImport, check_tree, did_you_mean, flatten
from .gan_config import GANSection
from .ema import horizon_note
from .kinds import check_kind_settings
from .loggers import LOGGER_CHOICES, check_logger_names
from ..tasks.base import BAD_SAMPLE_OPTIONS
from .divergence import NONFINITE
from .mixup import MIXUP_CHOICES, check_mixup_config
from .precision import COMPILE_CHOICES, PRECISIONS, check_compile_setting

OPTIMIZERS = ("adamw", "radam", "sgd")
SCHEDULES = ("cosine", "linear", "constant", "step")
DEVICES = ("auto", "cpu", "cuda")
AUGMENT_CHOICES = ChoicesOrImport((False, True, "deit", "randaugment", "crop_flip", "resized_crop_flip"),
                                  note="true = deit; an import path names your own transform or its factory")
MAX_AUTO_WORKERS = 4        # data.num_workers: auto never starts more loader processes than this per process


@dataclass(frozen=True)
class WorkerCount(Bounds):
    """``data.num_workers``: ``"auto"`` or an integer >= 0 (:func:`resolve_num_workers`)."""

    def holds(self, value: Any, owner: Any = None) -> bool:
        return value == "auto" if isinstance(value, str) else super().holds(value, owner)

    def describe(self, owner: Any = None, integer: bool = False) -> str:
        return "'auto' or " + super().describe(owner, integer)


WORKERS = WorkerCount(lo=0, integer=True, note="auto: loader processes sized to the machine")


@dataclass
class ModelSection:
    name: str = "nac_small"                       # a preset from modwire.list_models()
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class FewShotSection:
    """A k-shot n-way training subset drawn by the run's ``seed`` (``modwire.training.finetune``;
    NI Fig. 5a, NAC Fig. 4): ``ways`` classes, ``shots`` training samples of each, labels
    renumbered 0..ways-1 in class order; the validation split keeps every sample of those
    classes, renumbered alike. Classification tasks with one head only."""
    shots: int = 0                                # k samples per class; 0 = every sample of the drawn classes
    ways: int = 0                                 # n classes; 0 = every class (labels unchanged)

    bounds: ClassVar[dict[str, Bounds]] = {"shots": NON_NEGATIVE, "ways": NON_NEGATIVE}


@dataclass
class DataSection:
    task: str = "triangle"                        # a task from modwire.tasks.list_tasks()
    params: dict[str, Any] = field(default_factory=dict)  # task build() parameters
    train_split: str = "train"
    val_split: str = "val"
    batch_size: int = 64                          # global batch (split across processes)
    num_workers: Any = "auto"                     # DataLoader processes: an integer >= 0 (0 = load in the training
                                                  # process) | auto = min(4, CPUs per process - 1 on CUDA, - 2 on
                                                  # the CPU) (resolve_num_workers)
    augment: Any = False                          # false | true = "deit" (NAC App. C regimen) | "randaugment" (NI App. C)
                                                  # | "crop_flip" / "resized_crop_flip" (AiT App. A.1: CIFAR / Pet)
                                                  # | "package.module:attribute": your own transform or its
                                                  # factory f(image_size=(H, W), channels=C) (docs/tools.md)
    mixup: Any = False                            # false | true = "deit": mixup/cutmix with label smoothing (NAC
                                                  # App. C) | "input": Input Mixup (Zhang et al. 2018) as in NFM
                                                  # Table 2 / Verma et al.: lam ~ Beta(a, a), random pairs, no cutmix
    mixup_alpha: float = 1.0                      # a of "input" mixup (NFM Table 2: 1.0)
    max_samples: int = 0                          # > 0: N samples of each split (class-stratified, the run's seed,
                                                  # where the dataset declares its labels; else the first N); 0 = all
    few_shot: FewShotSection = field(default_factory=FewShotSection)  # applied after max_samples
    bad_samples: str = "stop"                     # an unreadable training file: stop (a clear error; the run resumes
                                                  # from its last checkpoint) | skip it, counted in metrics.jsonl

    bounds: ClassVar[dict[str, Bounds]] = {"batch_size": COUNT, "num_workers": WORKERS,
                                           "max_samples": NON_NEGATIVE, "mixup_alpha": POSITIVE}
    choices: ClassVar[dict[str, tuple]] = {"augment": AUGMENT_CHOICES, "mixup": MIXUP_CHOICES,
                                           "bad_samples": BAD_SAMPLE_OPTIONS}


@dataclass
class OptimSection:
    name: str = "adamw"                           # adamw | radam | sgd (momentum = betas[0])
    lr: float = 3e-4
    weight_decay: float = 0.05
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    decay_steps: int = 0                          # > 0: cosine reaches min_lr at this step, then stays (NI A.1.5)
    schedule: str = "cosine"                      # cosine | linear (lr → min_lr) | constant | step: lr × gamma at
                                                  # each of `milestones` (optimizer
    milestones: list[int] = field(default_factory=list)  # steps; Verma et al. / NFM Table 2: epochs 500, 1000, 1500)
    gamma: float = 0.1                            # step schedule: factor at each milestone
    grad_clip: float = 1.0                        # max global grad norm; 0 = off
    label_smoothing: float = 0.0
    filter_bias_and_norm: bool = True             # no decay on biases, norms, <=1-D and paper-exempt parameters
                                                  # (timm's filter_bias_and_bn); False: decay every parameter
                                                  # (the AiT authors' AdamW over net.parameters())

    bounds: ClassVar[dict[str, Bounds]] = {
        "lr": POSITIVE, "warmup_lr": NON_NEGATIVE, "min_lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE,
        "grad_clip": NON_NEGATIVE, "warmup_steps": NON_NEGATIVE, "decay_steps": NON_NEGATIVE,
        "milestones": NON_NEGATIVE, "gamma": Bounds(lo=0, hi=1, lo_open=True), "label_smoothing": UNIT,
        "betas": UNIT}
    choices: ClassVar[dict[str, tuple]] = {"name": OPTIMIZERS, "schedule": SCHEDULES}


@dataclass
class FinetuneSection:
    """Start from trained weights (``modwire finetune``; NI Table 1, Fig. 5, NAC Fig. 4). With
    ``init`` the architecture is the checkpoint's ``config.json`` (``model.name`` only labels the
    run and ``model.overrides`` must be empty). Parameters outside the ``train`` sets (names from
    ``model.parameter_sets()``) are frozen (``requires_grad=False``) and left out of the optimizer."""
    init: Optional[str] = None                    # run directory (its best, else last checkpoint) or checkpoint dir
    new_task: bool = False                        # fresh task-specific outputs (model.new_task): CLS tokens / head
    train: list[str] = field(default_factory=lambda: ["all"])  # parameter sets that train, e.g. [cls, type_inference]
    add_functions: int = 0                        # > 0: model.add_functions(n) first (NI §4.2, Fig. 5b)
    weights: Optional[str] = None                 # init's weights: null = what its validation scored (the EMA's when
                                                  # it kept one) | live | ema

    bounds: ClassVar[dict[str, Bounds]] = {"add_functions": NON_NEGATIVE}
    choices: ClassVar[dict[str, tuple]] = {"weights": (None, "live", "ema")}


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    finetune: FinetuneSection = field(default_factory=FinetuneSection)
    gan: GANSection = field(default_factory=GANSection)   # GAN models only (training/gan.py)
    # Weight of each auxiliary loss a model reports (``model.auxiliary_losses()``, e.g. NAC's
    # "graph"): the objective is task loss + Σ weight·loss. Every reported loss needs one.
    aux_loss_weights: dict[str, float] = field(default_factory=dict)
    epochs: int = 1
    max_steps: int = 0                            # > 0 stops early (optimizer steps); a GAN's length (generator steps)
    grad_accum: int = 1
    precision: str = "fp32"                       # fp32 | bf16 | fp16
    compile: Any = False                          # false | true = "default" | "default" | "reduce-overhead" | "max-autotune":
                                                  # torch.compile(model, mode=...); "reduce-overhead" uses CUDA graphs on
                                                  # CUDA (exact: same kernels, replayed); on the CPU it compiles as "default"
    grad_checkpointing: bool = False              # recompute each block in the backward (timm's set_grad_checkpointing):
                                                  # less activation memory, more compute; the ViT, NI, NAC, Perceiver IO
                                                  # and the LM (the others refuse it)
    ema_decay: float = 0.0                        # > 0 keeps an EMA of the weights
    nonfinite: str = "stop"                       # a NaN/inf loss or gradient: stop (the last finite checkpoint
                                                  # is kept) | skip that optimizer step (training/divergence.py)
    seed: int = 0
    out_dir: str = "runs/default"
    checkpoint_every: int = 0                     # optimizer steps; 0 = at epoch ends only
    keep_weights_every: int = 0                   # > 0: also keep the weights every N steps in
                                                  # checkpoints/weights-<step> (analyses over training)
    log_every: int = 10
    loggers: list[str] = field(default_factory=list)  # where records go besides metrics.jsonl (always written):
                                                  # csv | tensorboard | mlflow | wandb | "package.module:attribute"
                                                  # (your logger's factory; training/loggers.py, docs/tools.md)
    progress: bool = True
    device: str = "auto"                          # auto | cpu | cuda

    bounds: ClassVar[dict[str, Bounds]] = {
        "aux_loss_weights": NON_NEGATIVE, "epochs": COUNT, "grad_accum": COUNT, "log_every": COUNT,
        "max_steps": NON_NEGATIVE, "checkpoint_every": NON_NEGATIVE, "keep_weights_every": NON_NEGATIVE,
        "seed": NON_NEGATIVE, "ema_decay": UNIT}
    choices: ClassVar[dict[str, tuple]] = {"precision": PRECISIONS, "device": DEVICES, "compile": COMPILE_CHOICES,
                                           "nonfinite": NONFINITE, "loggers": LOGGER_CHOICES}


def resolve_num_workers(value: Any, local_world: int | None = None, device: Any = None) -> int:
    """The DataLoader worker processes of a ``data.num_workers`` setting: an integer as given;
    ``"auto"``: ``min(MAX_AUTO_WORKERS, CPUs per process - reserved)``, the CPUs this process may run
    on (its affinity) shared among the ``local_world`` processes of this machine (torchrun's
    ``LOCAL_WORLD_SIZE``), less those the training process keeps: 1 when ``device`` is CUDA, 2 on
    the CPU, where the model computes on its threads (on a 2-CPU machine one worker gained nothing
    and cost a small model's run up to 13%: ``benchmarks/results/train_loop_cpu.md``)."""
    if value != "auto":
        return int(value)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:                       # not on Linux
        cpus = os.cpu_count() or 1
    local = local_world if local_world is not None else int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    reserved = 1 if getattr(device, "type", device) == "cuda" else 2
    return max(0, min(MAX_AUTO_WORKERS, cpus // max(1, local) - reserved))


class ConfigError(UserError):
    """A config file or ``--set`` override that cannot be used; the message names the file / key."""


def check_run_length(c: TrainConfig, total: int) -> None:
    """The settings that count optimizer steps, against the run's ``total``, before the first step:
    each that cannot do what it says in this run warns (:class:`~modwire.errors.ConfigWarning`, naming
    the field, the run's length and what the run does instead): a warm-up the run never leaves, step
    milestones it never reaches, weights kept every N > total steps, a cosine decay that stops above
    ``min_lr``, no record or checkpoint before the end (``log_every`` at its default does not warn), and the
    optimizer settings this optimizer and schedule never read (:func:`unread_optim_notes`). The
    run goes on (a smoke test of a long recipe is a short run of it); ``-W error::modwire.errors.ConfigWarning``
    (Python) or a filter makes them errors."""
    o, run = c.optim, f"the run has {total} optimizer step{'s' if total != 1 else ''} in all"
    notes = []
    if o.warmup_steps and o.warmup_steps >= total:
        notes.append(f"config key 'optim.warmup_steps': {o.warmup_steps}, but {run}: it ends still warming up "
                     f"(lr rising from optim.warmup_lr={o.warmup_lr:g}), never at optim.lr={o.lr:g}; set "
                     f"warmup_steps below {total} or train longer (epochs, max_steps)")
    if o.schedule == "step" and min(o.milestones) >= total:
        notes.append(f"config key 'optim.milestones': {list(o.milestones)}, but {run}: the learning rate never "
                     f"steps; give milestones below {total} or optim.schedule: constant")
    if c.keep_weights_every > total:
        notes.append(f"config key 'keep_weights_every': {c.keep_weights_every}, but {run}: no weights are kept; "
                     f"set it to at most {total}, or 0")
    if o.schedule == "cosine" and o.decay_steps > total:
        notes.append(f"config key 'optim.decay_steps': {o.decay_steps} is beyond the run's {total} steps: the "
                     f"cosine decay stops part-way, above optim.min_lr={o.min_lr:g}")
    if o.schedule == "cosine" and 0 < o.decay_steps <= o.warmup_steps:
        notes.append(f"config key 'optim.decay_steps': {o.decay_steps} is not after the warm-up's "
                     f"{o.warmup_steps} steps: the learning rate drops to optim.min_lr={o.min_lr:g} when it ends")
    notes.append(horizon_note(c.ema_decay, total))                   # the EMA's own check (ema.py)
    notes += unread_optim_notes(o)
    if c.log_every > total and c.log_every != TrainConfig.log_every:   # a short run at the default says nothing
        notes.append(f"config key 'log_every': {c.log_every} is beyond the run's {total} steps: metrics.jsonl gets "
                     f"the last step's losses only")
    if c.checkpoint_every > total:
        notes.append(f"config key 'checkpoint_every': {c.checkpoint_every} is beyond the run's {total} steps: "
                     f"checkpoints are written at epoch ends only")
    for note in filter(None, notes):
        warnings.warn(note, ConfigWarning, stacklevel=3)


#: Top-level keys that no longer exist, and where what they set lives now (an unknown-key error
#: alone would not say).
MOVED_KEYS: dict[str, str] = {
    "graph_prior": "NAC's graph prior is model.overrides.graph_prior ({name, params, loss, reduction, align}), "
                   "weighted by aux_loss_weights.graph (e.g. --set 'model.overrides.graph_prior={name: scale_free}' "
                   "aux_loss_weights.graph=1e-4); a section with name: null, as in the config.yaml of earlier runs, "
                   "sets nothing: delete it",
}


def check_moved_keys(keys: Sequence[str], where: str) -> None:
    """A :class:`ConfigError` naming the first of ``keys`` (dotted paths) whose top-level key has moved."""
    for key in keys:
        top = key.split(".", 1)[0]
        if top in MOVED_KEYS:
            raise ConfigError(f"{where}: key {key!r}: the top-level {top!r} section has moved: {MOVED_KEYS[top]}")


# ----------------------------------------------------------------------------- reading files


def _yaml_error(file: Path, text: str, exc: Exception) -> ConfigError:
    """A YAML syntax error as one line naming the file, line and column."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        where = f"line {mark.line + 1}, column {mark.column + 1}"
    elif getattr(exc, "position", None) is not None:  # yaml.reader.ReaderError: a character offset
        where = f"line {text.count(chr(10), 0, exc.position) + 1}"
    else:
        where = "unknown line"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return ConfigError(f"config file {file}, {where}: YAML syntax error: {problem}")


def read_config_file(file: Path, *, named_by: Path | None = None) -> Any:
    """The top-level mapping of one YAML config file, as an OmegaConf ``DictConfig``.

    Every way a file can be unusable is one line naming it: missing (``FileNotFoundError``),
    a directory, unreadable, not UTF-8, a YAML syntax error (with line and column), empty,
    or a list / scalar at the top level (``ConfigError``, a ``ValueError``).
    """
    import yaml
    from omegaconf import OmegaConf

    via = f" (named by 'base:' in {named_by})" if named_by is not None else ""
    if file.is_dir():
        raise ConfigError(f"config path {file} is a directory, expected a YAML file{via}")
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {file} not found{via}") from None
    except OSError as exc:
        raise ConfigError(f"config file {file} cannot be read ({exc.strerror or exc}){via}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {file} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start}); save it as UTF-8") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)  # the document's shape, before any value is built
        if node is None:
            raise ConfigError(f"config file {file} is empty (no keys); expected a mapping of config keys "
                              f"such as model:, data:, optim:")
        if not isinstance(node, yaml.MappingNode):
            kind = "a list" if isinstance(node, yaml.SequenceNode) else f"the scalar {node.value[:40]!r}"
            raise ConfigError(f"config file {file} holds {kind} at the top level; expected a mapping of "
                              f"config keys such as model:, data:, optim:")
        return OmegaConf.create(text)  # OmegaConf's own YAML reading (also refuses duplicate keys)
    except yaml.YAMLError as exc:
        raise _yaml_error(file, text, exc) from None


def _base_paths(file: Path, data: Any) -> list[Path]:
    """The files named by ``base:`` in ``file`` (relative to its folder), removed from ``data``."""
    from omegaconf import OmegaConf

    if "base" not in data:
        return []
    bases = OmegaConf.to_container(data)["base"]
    del data["base"]
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not bases or not all(isinstance(b, str) and b for b in bases):
        raise ConfigError(f"config file {file}: 'base:' must be a file name or a list of file names "
                          f"(relative to the file's folder), got {bases!r}")
    return [file.parent / os.path.expanduser(b) for b in bases]


def config_layers(path: str | Path, *, _chain: tuple[Path, ...] = (), _seen: set | None = None,
                  _named_by: Path | None = None) -> list[tuple[Path, Any]]:
    """``(file, mapping)`` of ``path`` and of its ``base:`` files, in the order they apply.

    A file's bases come before it, in the order listed, each with its own bases first
    (depth first); a file reached twice applies once, at its first place. A cycle raises.
    """
    file, seen = Path(path), set() if _seen is None else _seen
    key = file.resolve()
    if key in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain[_chain.index(key):], key))
        raise ConfigError(f"config file {file}: 'base:' files form a cycle: {cycle}")
    if key in seen:
        return []
    seen.add(key)
    data = read_config_file(file, named_by=_named_by)
    layers: list[tuple[Path, Any]] = []
    for base in _base_paths(file, data):
        layers += config_layers(base, _chain=(*_chain, key), _seen=seen, _named_by=file)
    return [*layers, (file, data)]


# ----------------------------------------------------------------------------- overrides


def _omegaconf_message(exc: Exception) -> str:
    """An OmegaConf error as one line: ``key 'a.b': <what is wrong>``."""
    msg = str(getattr(exc, "msg", None) or exc).splitlines()[0]            # OmegaConf's own did-you-mean
    section = getattr(exc, "object_type", None)
    if isinstance(exc, KeyError) and is_dataclass(section):                 # an unknown key: list the valid ones
        valid = [f.name for f in fields(section)]
        if "Did you mean" not in msg:
            msg += ("" if msg.endswith((".", "?")) else ".") + did_you_mean(str(getattr(exc, "key", "")), valid)
        msg += f" Valid keys: {valid}"
    key = getattr(exc, "full_key", None)
    return f"key {key!r}: {msg}" if key else msg


def apply_override(cfg: Any, item: str, *, schema: type | None = None) -> Any:
    """Apply one ``--set`` item to the OmegaConf config ``cfg``: ``key=VALUE`` merges ``VALUE`` into
    the key (a mapping keeps its other entries), ``key:=VALUE`` replaces the key's whole subtree
    (a typed section restarts from its defaults in ``schema``, default :class:`TrainConfig`)."""
    import yaml
    from omegaconf import OmegaConf

    key, sep, value = item.partition("=")
    replace = key.endswith(":")
    key = key[:-1].strip() if replace else key.strip()
    if not sep or not key:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE (merge) or KEY:=VALUE (replace)")
    if key == "base" or key.startswith("base."):
        raise ConfigError(f"override {item!r}: 'base:' is read from config files only, it cannot be --set")
    try:
        parsed = OmegaConf.from_dotlist([f"{key}={value}"])  # VALUE parsed as YAML, as in a file
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: the value is not valid YAML "
                          f"({getattr(exc, 'problem', None) or exc})") from None
    if not replace:
        return OmegaConf.merge(cfg, parsed)
    return _replace_subtree(cfg, key, OmegaConf.select(parsed, key), schema)


def _replace_subtree(cfg: Any, key: str, new: Any, schema: type | None = None) -> Any:
    """``key:=VALUE``: ``new`` in place of the key's whole subtree (a typed section restarts from its
    defaults in ``schema``, default :class:`TrainConfig`)."""
    from omegaconf import OmegaConf

    default = OmegaConf.select(OmegaConf.structured(schema or TrainConfig), key, default=None)
    if OmegaConf.is_dict(default) and is_dataclass(OmegaConf.get_type(default)):
        new = OmegaConf.merge(default, new)  # a typed section restarts from its defaults
    OmegaConf.update(cfg, key, new, merge=False)
    return cfg


def apply_values(cfg: Any, values: Mapping[str, Any]) -> Any:
    """Settings given as data into the OmegaConf config ``cfg``, key by key: each key a dotted path
    (``"optim.lr"``) or a section (``"optim"`` with a mapping), each value merged as the
    ``key=VALUE`` override of the same value would be (a mapping keeps the entries it does not
    name); a key ending in ``:`` replaces the subtree, as ``key:=VALUE`` does
    (``{"data.params:": {"size": 16}}``). Errors name the key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(values, Mapping) or not all(isinstance(k, str) and k for k in values):
        raise UserTypeError(f"values: expected a mapping of config keys (dotted paths such as 'optim.lr') to "
                            f"values, got {type(values).__name__} {values!r}")
    for name, value in values.items():
        key, replace = name.removesuffix(":").strip(), name.endswith(":")
        check_moved_keys([key], f"config value {name!r}")
        if not key or key == "base" or key.startswith("base."):
            raise ConfigError(f"config value {name!r}: expected a config key ('base:' is read from config files only)")
        nested = str(value) if isinstance(value, Path) else value   # a path field is a str
        for part in reversed(key.split(".")):
            nested = {part: nested}
        try:
            new = OmegaConf.create(nested)
            cfg = _replace_subtree(cfg, key, OmegaConf.select(new, key)) if replace else OmegaConf.merge(cfg, new)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"config value {name!r}: {_omegaconf_message(exc)}") from None
    return cfg


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                values: Mapping[str, Any] | None = None) -> TrainConfig:
    """A validated :class:`TrainConfig` from a YAML file (optional), settings given as data
    (``values``, for code: :func:`apply_values`) and ``--set`` overrides (strings, for the command line).

    File: a mapping of the config's keys. ``base: FILE`` or ``base: [FILE, ...]`` (paths
    relative to the file's folder) makes it a delta: the base files apply first, in order
    (each with its own bases first; a file reached twice applies once; a cycle is an
    error), then the file itself, deep-merged (a mapping in the file updates the base's
    mapping key by key; lists and scalars replace).

    Values, applied after the files: ``{"optim.lr": 1e-3, "data.params": {"size": 64}}`` is the
    data form of ``["optim.lr=0.001", "data.params={size: 64}"]`` (a ``Path`` becomes its text;
    ``"data.params:"`` replaces, as ``data.params:=``).

    Overrides, applied in order after the files and the values, each parsed as YAML:

    - ``key=VALUE`` merges: ``data.params={size: 64}`` sets ``size`` and keeps the other params;
    - ``key:=VALUE`` replaces the subtree: ``data.params:={size: 64}`` leaves ``size`` as the
      only param; on a section (``optim:={lr: 1e-3}``) the other keys return to their defaults.

    Errors (``ValueError`` / ``FileNotFoundError``, one line) name the file and line, or the
    key path, the value and what is expected.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(overrides, (str, bytes, dict)) or not all(isinstance(item, str) for item in overrides):
        raise UserTypeError(f"overrides: expected a list of 'key=value' strings such as ['max_steps=3'], "
                            f"got {type(overrides).__name__} {overrides!r}")
    cfg = OmegaConf.structured(TrainConfig)
    for file, layer in (config_layers(path) if path is not None else []):
        check_moved_keys(list(layer), f"config file {file}")
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"config file {file}: {_omegaconf_message(exc)}") from None
    if values:
        cfg = apply_values(cfg, values)
    for item in overrides:
        check_moved_keys([item.partition("=")[0].rstrip(":").strip()], f"override {item!r}")
        try:
            cfg = apply_override(cfg, item)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"override {item!r}: {_omegaconf_message(exc)}") from None
    try:
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid training config: {_omegaconf_message(exc)}") from None
    validate(config)
    return config


# ----------------------------------------------------------------------------- validation


def validate(c: TrainConfig) -> None:
    """Check every field against the ``choices`` / ``bounds`` tables of its section
    (:func:`modwire.fields.check_tree`), then the relations between fields; raise a ``UserError``
    naming the key path, the value and what is expected."""
    check_compile_setting(c.compile)               # precision.py
    check_tree(c)
    if c.optim.schedule == "step" and not c.optim.milestones:
        raise UserError("config key 'optim.milestones': the step schedule needs at least one milestone (steps at "
                        "which lr is multiplied by optim.gamma), got []")
    if c.optim.schedule != "step" and c.optim.milestones:
        raise UserError(f"config key 'optim.milestones': got {list(c.optim.milestones)}, but they are used only by "
                        f"optim.schedule: step (the schedule is {c.optim.schedule!r})")
    if c.optim.gamma != OptimSection.gamma and c.optim.schedule != "step":
        raise UserError(f"config key 'optim.gamma': got {c.optim.gamma:g}, but it is used only by optim.schedule: "
                        f"step (the schedule is {c.optim.schedule!r})")
    if c.optim.decay_steps and c.optim.schedule != "cosine":
        raise UserError(f"config key 'optim.decay_steps': got {c.optim.decay_steps}, but it is used only by "
                        f"optim.schedule: cosine (the schedule is {c.optim.schedule!r})")
    check_mixup_config(c)                          # mixup.py
    check_logger_names(c.loggers)                  # loggers.py
    if len(c.optim.betas) != 2:
        raise UserError(f"config key 'optim.betas': got {list(c.optim.betas)}, expected two numbers [beta1, beta2]")
    if c.optim.min_lr > c.optim.lr:
        raise UserError(f"config key 'optim.min_lr': got {c.optim.min_lr:g}, expected <= optim.lr ({c.optim.lr:g}): "
                        f"the schedule decays from lr to min_lr")
    _validate_finetune(c)
    check_kind_settings(c, flat_config(c), flat_config(TrainConfig()))   # what the run's kind reads (kinds.py)


def unread_optim_notes(o: OptimSection) -> list[str]:
    """A note for each general ``optim`` setting, set away from its default, that this optimizer and schedule never
    read (``min_lr`` under a constant or step schedule, ``warmup_lr`` without a warm-up, ``betas[1]`` with SGD,
    ``filter_bias_and_norm`` without weight decay). Warned, not refused: a base config sets them for all its
    variants. (A schedule's own settings, ``milestones``, ``gamma``, ``decay_steps``, are refused by
    :func:`validate` under another schedule.)"""
    default = OptimSection()
    unread = [  # key, value, default, unread here, what reads it, what this config has instead
        ("min_lr", o.min_lr, default.min_lr, o.schedule not in ("cosine", "linear"),
         "optim.schedule cosine or linear (the lr they decay to)", f"the schedule is {o.schedule!r}"),
        ("warmup_lr", o.warmup_lr, default.warmup_lr, o.warmup_steps == 0, "a warm-up", "optim.warmup_steps is 0"),
        ("betas[1]", o.betas[1:2], default.betas[1:2], o.name == "sgd", "adamw and radam (SGD's momentum is betas[0])",
         "optim.name is 'sgd'"),
        ("filter_bias_and_norm", o.filter_bias_and_norm, default.filter_bias_and_norm, o.weight_decay == 0,
         "weight decay", "optim.weight_decay is 0"),
    ]
    return [f"config key 'optim.{key}': {value[0] if isinstance(value, list) else value!r} is not read by this run "
            f"({instead}); only {reader} reads it"
            for key, value, base, ignored, reader, instead in unread if ignored and value != base]


def _validate_finetune(c: TrainConfig) -> None:
    """The relations between the fine-tuning fields (``finetune.*``, ``data.few_shot``)."""
    f = c.finetune
    if f.init is not None and not f.init.strip():
        raise UserError("config key 'finetune.init': got an empty path, expected a run or checkpoint directory "
                        "(or null to train from scratch)")
    if f.init is not None and c.model.overrides:
        raise UserError(f"config key 'model.overrides': got {sorted(c.model.overrides)}, but with finetune.init the "
                        f"architecture comes from the checkpoint's config.json ({f.init}): leave it empty")
    if f.new_task and f.init is None:
        raise UserError("config key 'finetune.new_task': new task outputs replace a trained model's, so it needs "
                        "finetune.init (a run or checkpoint directory)")
    if f.weights is not None and f.init is None:
        raise UserError(f"config key 'finetune.weights': got {f.weights!r}, but it chooses the weights of "
                        f"finetune.init, which is not set")
    if f.add_functions and f.init is None:
        raise UserError("config key 'finetune.add_functions': functions are added to a trained model, so it needs "
                        "finetune.init (a run or checkpoint directory)")
    if not f.train or not all(isinstance(n, str) and n.strip() for n in f.train):
        raise UserError(f"config key 'finetune.train': got {list(f.train)!r}, expected a non-empty list of "
                        f"parameter-set names such as [all] or [cls, type_inference]")


def flat_config(cfg: TrainConfig) -> dict[str, Any]:
    """``{"optim.lr": 3e-4, "model.overrides.tokenizer.max_len": 64, ...}``: every leaf by its key path
    (:func:`modwire.fields.flatten`; read from the dataclasses: an OmegaConf round trip cost ~30 ms a call,
    paid on every config read)."""
    from omegaconf import OmegaConf

    return flatten(cfg, lambda n: OmegaConf.to_container(n, resolve=True) if OmegaConf.is_config(n) else n)


def to_yaml(c: TrainConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(c))
