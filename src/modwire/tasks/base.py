"""Tasks: a dataset per split, a description of its inputs, the loss and the metrics.

A task is registered once with :func:`register_task`: a :class:`TaskInfo` (what its
inputs are, as :class:`~modwire.models.inputs.InputSpec` — kind, shape, vocabulary,
padding id — and its class count, which each model maps onto its own input layer; and
how it is scored) and a ``build``
function ``build(split, **params) -> torch.utils.data.Dataset`` whose items are
``(input, target)`` tensors; a multimodal task for a conditional model (NAC §2.2, App. G)
gives ``input`` as a dict ``{"x": executor input, "condition": circuit generator input}``,
which a model takes as ``model(x, condition=c)``; NI's digits multi-task gives ``{"x": image,
"task": dataset id}`` (an ``InputSpec.index``) for a model with one CLS token and head per
dataset (``TaskInfo.heads``), ``model(x, task=t)``. Built-in generators need no files and make each sample
a pure function of ``(seed, index)``, so a split is a fixed dataset; loaders read the
official on-disk formats from ``root`` and never download.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from torch.utils.data import Dataset, Subset

from ..models.inputs import Inputs, InputSpec, check_inputs  # noqa: F401  (InputSpec re-exported)
from ..errors import UnknownNameError, UserError, UserTypeError
from ..fields import Bounds, check_mapping, did_you_mean
from ..seeding import numpy_rng

# token_cross_entropy: targets [B, T], logits [B, T, V]; bce: multi-label targets [C] of 0/1 (NFM §4.2)
LOSSES = ("cross_entropy", "mse", "token_cross_entropy", "bce")


@runtime_checkable
class EpochDataset(Protocol):
    """A dataset whose random draws follow the epoch (augmentation pipelines): the trainer calls
    ``set_epoch(epoch)`` before each training epoch."""

    def set_epoch(self, epoch: int) -> None: ...


def pad_collate(batch: Sequence[tuple[Tensor, Tensor]], pad_value: int = 0) -> tuple[Tensor, Tensor]:
    """Stack ``(ids [L_i], target)`` pairs into ``ids [B, max L_i]`` right-padded with ``pad_value``."""
    inputs = [b[0] for b in batch]
    length = max(1, max(x.shape[0] for x in inputs))
    out = inputs[0].new_full((len(inputs), length), pad_value)
    for row, x in zip(out, inputs):
        row[: x.shape[0]] = x
    return out, torch.stack([torch.as_tensor(b[1]) for b in batch])



#: the class names of the digit tasks (MNIST, SVHN, MNIST-M, the digits, ListOps' values)
DIGIT_CLASSES = tuple(str(d) for d in range(10))
#: the losses of classification tasks, whose datasets carry ``classes``
CLASSIFICATION_LOSSES = ("cross_entropy", "bce")

# describe(params) -> (inputs, num_classes) or (inputs, num_classes, heads)
Describe = Callable[[dict[str, Any]], tuple]


@dataclass(frozen=True)
class TaskInfo:
    """What a model and a trainer need to know about a task.

    name: registry name. kind: ``"generator"`` (built in) or ``"loader"`` (reads files).
    num_classes: output width of one head (1 for scalar regression); None when only the data
        tell it (e.g. ``image_folder`` counts its class folders): see :meth:`resolve`.
    heads: how many predictions one sample carries, each read from its own CLS token by a
        model that has them (NI §4.1-4.2): Fuzzy Boolean's ``F`` functions (targets ``[F]``,
        the model returns ``[B, F]``), or the 3 datasets of the digits multi-task (one label per
        sample; its ``task`` input picks the head, the model returns ``[B, num_classes]``).
        Models with a single read-out (NAC, Perceiver IO) refuse ``heads != 1``.
    inputs: what one item's input is, as an :class:`~modwire.models.inputs.InputSpec`
        (image / tokens / vectors and their shape, vocabulary, padding id), or a mapping of
        named specs for a multimodal task (``{"x": ..., "condition": ...}``). Each model maps it
        onto its own input layer (``ModelConfig.for_inputs``); tasks know nothing of models.
    describe: for a task whose inputs or class count depend on its parameters (a patch size,
        feature widths, a maximum length, the folders under ``root``): ``describe(params) ->
        (inputs, num_classes)`` or ``(inputs, num_classes, heads)`` given the full parameters
        (defaults merged). ``inputs`` and ``num_classes`` left out are filled from
        ``describe(params)`` at registration; a ``heads`` it gives always replaces the field.
    loss: one of ``LOSSES``: ``cross_entropy`` (labels), ``mse`` (regression) or ``bce``
        (multi-label: float targets ``[num_classes]`` of 0 / 1, one sigmoid per class, e.g. the
        digit classes present in a multi-digit image, NFM §4.2).
        metrics: names from :mod:`modwire.tasks.metrics`.
    splits: the split names ``build`` accepts. params: defaults of ``build``'s keyword
        parameters (documented there). collate: optional batch collation (padding).
    subsets: named masks over a batch of inputs (``inputs [B, ...] -> bool [B]``; a dict of
        batched tensors for the dict inputs of a conditional task); every
        metric is also reported on each subset as ``<metric>_<subset>`` (e.g. Sort-of-CLEVR's
        relational and non-relational questions).
    categories: ``(label, names)``: a categorical label of each input of a batch
        (``inputs -> LongTensor [B]`` indexing ``names``) that analyses colour samples by,
        e.g. Sort-of-CLEVR's question type for NAC Fig. 6.
    class_names: the name of each class, index ``k`` for label ``k`` (``dataset.classes`` of every
        split :func:`build_dataset` builds for a classification task, as torchvision's datasets have);
        None: a dataset's own ``classes`` (class folders, WordNet ids), else the labels as strings
        ``"0"``, ``"1"``, ... (:func:`class_names`).
    param_bounds / param_choices: what each parameter accepts, as a config class's ``bounds`` /
        ``choices`` tables (:mod:`modwire.fields`): ``{"size": Bounds(lo=8, multiple_of=8,
        integer=True, note="the images are 8x8")}``, ``{"resize": ("center_crop", "stretch")}``.
        A rule on a list (or mapping) parameter applies to each element; None passes a Bounds.
        :meth:`merged_params` checks them, so a bad value is refused before any data is read
        (``describe_task``, before a run directory exists). Checks between parameters, of files
        or of split names stay in the task's code.
    """

    name: str
    kind: str
    description: str
    num_classes: int | None = None
    inputs: Inputs | None = None
    loss: str = "cross_entropy"
    metrics: tuple[str, ...] = ("top1",)
    splits: tuple[str, ...] = ("train", "val", "test")
    params: dict[str, Any] = field(default_factory=dict)
    collate: Callable | None = None
    subsets: dict[str, Callable] = field(default_factory=dict)
    categories: tuple[Callable, tuple[str, ...]] | None = None
    describe: Describe | None = None
    heads: int = 1                      # new fields go after it: the fields before keep their positions
    param_bounds: dict[str, Bounds] = field(default_factory=dict)
    param_choices: dict[str, tuple] = field(default_factory=dict)
    class_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("generator", "loader"):
            raise UserError(f"task {self.name!r}: kind must be 'generator' or 'loader', got {self.kind!r}")
        ruled = sorted({*self.param_bounds, *self.param_choices} - set(self.params))
        if ruled:
            raise UnknownNameError(f"task {self.name!r}: param_bounds / param_choices name {ruled}, which are not "
                                   f"parameters; valid: {sorted(self.params)}{did_you_mean(ruled, self.params)}")
        self.check_params(self.params)      # the defaults obey the task's own rules
        if self.loss not in LOSSES:
            raise UserError(f"task {self.name!r}: loss must be one of {LOSSES}, got {self.loss!r}")
        if self.class_names is not None and self.num_classes is not None and len(self.class_names) != self.num_classes:
            raise UserError(f"task {self.name!r}: class_names has {len(self.class_names)} names for "
                            f"{self.num_classes} classes")
        if self.inputs is None:
            if self.describe is None:
                raise UserError(f"task {self.name!r}: give inputs= (an InputSpec) or describe=")
            inputs, num_classes, heads = self._described(self.params)
            object.__setattr__(self, "inputs", inputs)
            if self.num_classes is None:
                object.__setattr__(self, "num_classes", num_classes)
            if heads is not None:
                object.__setattr__(self, "heads", heads)
        if isinstance(self.inputs, Mapping) and "tokenizer" in self.inputs:
            raise UserTypeError(f"task {self.name!r}: inputs describe the data, not a model: got model fields "
                                f"{dict(self.inputs)}; give e.g. InputSpec.image(3, 32, 32), "
                                f"InputSpec.tokens(2000, 16, pad_id=0) or InputSpec.vectors(6, 8) "
                                f"(TaskInfo.model_overrides is gone)")
        object.__setattr__(self, "inputs", check_inputs(self.inputs, f"task {self.name!r}: inputs"))
        if self.num_classes is None and self.describe is None:
            raise UserError(f"task {self.name!r}: num_classes is required without describe=")
        if self.num_classes is not None:
            _check_num_classes(self.name, self.num_classes)
        _check_heads(self.name, self.heads)

    def merged_params(self, params: Mapping[str, Any] | None = None, *,
                      own_checks: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
        """The task's default parameters updated by ``params``. An unknown name is a KeyError (with
        close matches). A value whose default is a bool, int, float or str must have that type (an
        int where a float is expected is fine, None, a parameter switched off, always is, and a
        None default takes any value), else a TypeError naming the task, the parameter, the value
        and the type. Then :meth:`check_params`: the task's ``param_bounds`` / ``param_choices``.
        ``own_checks``: the task code about to read the parameters (its ``build`` or ``describe``),
        run first when the type of a parameter without a table rule is wrong, so that the task's
        own UserError wins where it has one; anything else it raises gives way to the type error
        (a parameter with a rule gets the type error at once: the table is its own check)."""
        params = dict(params or {})
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            hint = did_you_mean(unknown, self.params)
            raise UnknownNameError(f"unknown parameter(s) {unknown} for task {self.name!r}; valid: "
                                   f"{sorted(self.params)}{'.' + hint if hint else ''}")
        merged = {**self.params, **params}
        errors = ((n, _param_type_error(self.name, n, v, self.params[n])) for n, v in params.items())
        name, wrong = next(((n, e) for n, e in errors if e is not None), (None, None))
        if wrong is not None:
            if own_checks is not None and name not in self.param_bounds and name not in self.param_choices:
                try:
                    own_checks(merged)
                except UserError:
                    raise                       # the task's own message for it
                except Exception:               # a crash on the wrong type: the type error says it plainly
                    pass
            raise wrong
        self.check_params(merged)
        return merged

    def check_params(self, params: Mapping[str, Any]) -> None:
        """A :class:`UserError` ``task 'digits': parameter 'size': got 12, expected an integer >= 8 and a
        multiple of 8 (the images are 8x8)`` for the first value of ``params`` (all of the task's
        parameters) that its ``param_choices`` or ``param_bounds`` refuse."""
        check_mapping(params, choices=self.param_choices, bounds=self.param_bounds,
                      label=f"task {self.name!r}: parameter")

    def resolve(self, params: Mapping[str, Any] | None = None) -> "TaskInfo":
        """This task as built with ``params`` (over the defaults): ``inputs`` and ``num_classes``
        described for them. A task without ``describe`` is the same for every parameter."""
        merged = self.merged_params(params, own_checks=None if self.describe is None else self._described)
        if self.describe is None:
            return self
        inputs, num_classes, heads = self._described(merged)
        if num_classes is None:
            raise UserError(f"task {self.name!r}: its class count comes from the data, which the "
                            f"parameters {merged} do not locate")
        _check_num_classes(self.name, num_classes)
        heads = self.heads if heads is None else heads
        _check_heads(self.name, heads)
        return dataclasses.replace(self, inputs=check_inputs(inputs, f"task {self.name!r}: inputs"),
                                   num_classes=num_classes, heads=heads)

    def _described(self, params: dict[str, Any]) -> tuple[Inputs, int | None, int | None]:
        """``describe(params)`` as ``(inputs, num_classes, heads)`` (heads None: not described)."""
        try:
            out = self.describe(params)
        except (TypeError, ValueError) as e:  # a parameter the description cannot use: name the task once
            if str(e).startswith((self.name, f"task {self.name!r}")):
                raise
            raise type(e)(f"task {self.name!r}: {e}") from e
        if not isinstance(out, tuple) or len(out) not in (2, 3):
            raise UserTypeError(f"task {self.name!r}: describe(params) must return (inputs, num_classes) or "
                                f"(inputs, num_classes, heads), got {out!r}")
        return out if len(out) == 3 else (*out, None)


#: The parameter types :meth:`TaskInfo.merged_params` checks, by the type of the default.
_PARAM_TYPES = {bool: "a bool (true / false)", int: "an int", float: "a number (int or float)", str: "a string"}


def _param_type_error(task: str, name: str, value: Any, default: Any) -> UserTypeError | None:
    """The UserTypeError naming the task, the parameter, the value and the type its default has,
    or None when ``value`` has that type (bool, int, float, str defaults only; an int is a float
    too; None always passes: it is how a task parameter is switched off, e.g. ``pad_to: null``)."""
    kind = type(default)
    if kind not in _PARAM_TYPES or value is None:
        return None
    if kind in (int, float):
        ok = isinstance(value, int if kind is int else (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    return None if ok else UserTypeError(
        f"task {task!r}: parameter {name!r}: got {value!r} ({type(value).__name__}), expected "
        f"{_PARAM_TYPES[kind]} like its default {default!r}")


def _check_num_classes(task: str, n: Any) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UserError(f"task {task!r}: num_classes must be a positive int, got {n!r}")


def _check_heads(task: str, n: Any) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UserError(f"task {task!r}: heads must be a positive int (predictions per sample, one per "
                        f"CLS token), got {n!r}")


_TASKS: dict[str, tuple[TaskInfo, Callable[..., Dataset]]] = {}


def register_task(info: TaskInfo, build: Callable[..., Dataset]) -> None:
    if info.name in _TASKS:
        raise UserError(f"task {info.name!r} is already registered")
    _TASKS[info.name] = (info, build)


def list_tasks(pattern: str = "*", kind: str | None = None) -> list[str]:
    return sorted(n for n, (i, _) in _TASKS.items() if fnmatch.fnmatch(n, pattern) and kind in (None, i.kind))


def get_task(name: str) -> TaskInfo:
    if name not in _TASKS:
        valid = list_tasks()
        raise UnknownNameError(f"unknown task {name!r}.{did_you_mean(name, valid)} Valid: {valid}")
    return _TASKS[name][0]


def describe_task(name: str, params: Mapping[str, Any] | None = None) -> TaskInfo:
    """Task ``name`` as built with ``params`` (e.g. ``cfg.data.params``): its ``inputs`` and
    ``num_classes`` fit those parameters (:meth:`TaskInfo.resolve`)."""
    return get_task(name).resolve(params)


class BadSampleError(UserError):
    """One item of a dataset cannot be read: its file is not a decodable image (an HTML page saved as
    ``.jpg``, a truncated JPEG, a git-lfs pointer, ...) or is missing. ``path``: the file, ``reason``:
    why, in words; ``task``: the task whose loader read it. The message names all three and the
    expected layout. Raised by the loaders that read a file per item, instead of Pillow's own
    traceback; :class:`SkipBadSamples` drops such items from their batch (``data.bad_samples: skip``).
    Only ``message`` is positional, so the DataLoader can re-raise it from a worker process."""

    def __init__(self, message: str, path: Any = None, reason: str | None = None, task: str | None = None) -> None:
        super().__init__(message)
        self.path, self.reason, self.task = path, reason, task

    def __reduce__(self):
        return (_bad_sample_error, (type(self), str(self), self.path, self.reason, self.task))


class MissingSampleError(BadSampleError, FileNotFoundError):
    """A :class:`BadSampleError` whose file is missing (a file a label list names); also a
    ``FileNotFoundError``."""


def _bad_sample_error(cls: type, message: str, path: Any, reason: str | None, task: str | None) -> BadSampleError:
    return cls(message, path, reason, task)


# ----------------------------------------------------------------------------- class labels of a dataset


def class_targets(dataset: Dataset) -> np.ndarray | None:
    """The class label of every item, ``int64 [len(dataset)]``, when the dataset declares them without
    reading its items, else None. The one declared way (torchvision's convention): an attribute
    ``targets``, one integer label per item in item order (a list, tuple, numpy array or tensor).
    Anything else (a method, a float or multi-label array, a length that is not the dataset's) is no
    declaration; other attributes are never guessed at (``labels`` of some generators is their source
    pool's, not their items')."""
    for name in ("targets",):
        try:
            value = getattr(dataset, name, None)
        except Exception:   # a property that cannot answer: no declaration
            continue
        if isinstance(value, Tensor):
            value = value.detach().cpu().numpy()
        elif isinstance(value, (list, tuple)):
            try:
                value = np.asarray(value)
            except (TypeError, ValueError):
                continue
        if isinstance(value, np.ndarray) and value.ndim == 1 and np.issubdtype(value.dtype, np.integer):
            try:
                if len(value) == len(dataset):
                    return value.astype(np.int64, copy=False)
            except TypeError:   # an unsized dataset
                return None
    return None


#: The random stream of :func:`stratified_indices` (``numpy_rng(seed, SUBSAMPLE_STREAM)``).
SUBSAMPLE_STREAM = 0x53554253


def stratified_indices(labels: Sequence[int] | np.ndarray, n: int, seed: int = 0) -> list[int]:
    """``n`` of the item indices of ``labels`` (one class per item), drawn by ``seed`` alone, with every
    class represented in proportion to its share of the items (largest remainder, equal remainders
    in a random order), and every class present at least once when ``n`` is at least the number of
    classes (taken from the largest share; else ``n`` classes drawn at random get one item each);
    the items of a class are a random draw among its items. Returned in increasing order (the
    dataset's own order)."""
    labels = np.asarray(labels, dtype=np.int64)
    total = len(labels)
    if n >= total:
        return list(range(total))
    rng = numpy_rng(int(seed), SUBSAMPLE_STREAM)
    classes, counts = np.unique(labels, return_counts=True)
    if n < len(classes):
        quota = np.zeros(len(classes), dtype=np.int64)
        quota[rng.choice(len(classes), size=n, replace=False)] = 1
    else:
        share = n * counts / total
        quota = np.floor(share).astype(np.int64)
        left = n - int(quota.sum())
        if left:   # largest remainder first; equal remainders in a random order
            order = np.lexsort((rng.random(len(classes)), -(share - quota)))
            quota[order[:left]] += 1
        for c in np.flatnonzero(quota == 0):   # every class present gets one, from the largest quota
            quota[int(np.argmax(quota))] -= 1
            quota[c] = 1
    chosen: list[int] = []
    for c, k in zip(classes, quota):
        if k:
            members = np.flatnonzero(labels == c)
            chosen += members[rng.permutation(len(members))[:k]].tolist()
    return sorted(chosen)


class Subsample(Subset):
    """Some items of ``dataset`` (``indices``, in that order): a ``Subset`` that also forwards the
    dataset's other attributes (``set_epoch``, ``classes``, ...), so a wrapped dataset keeps working
    as before, and says what it took in ``note`` (also :meth:`describe`), a line a trainer can log.
    ``targets``: the class labels of the items kept, when the dataset declares its own
    (:func:`class_targets`), else None."""

    def __init__(self, dataset: Dataset, indices: Sequence[int], note: str = "") -> None:
        super().__init__(dataset, list(indices))
        self.note = note or f"{len(self.indices):,} of {len(dataset):,} samples"

    def describe(self) -> str:
        """What was taken, in one line (``note``)."""
        return self.note

    @property
    def targets(self) -> Tensor | None:
        labels = class_targets(self.dataset)
        return None if labels is None else torch.from_numpy(labels[np.asarray(self.indices, dtype=np.int64)])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "indices", "note"):  # unpickling: no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)


class FirstN(Subsample):
    """The first ``n`` items of ``dataset`` (a :class:`Subsample`); ``why``: added to the note (why the
    first items and not a stratified draw)."""

    def __init__(self, dataset: Dataset, n: int, why: str = "") -> None:
        super().__init__(dataset, range(min(n, len(dataset))),
                         f"the first {min(n, len(dataset)):,} of {len(dataset):,} samples{why}")


def subsample(dataset: Dataset, n: int, seed: int = 0) -> Subsample:
    """``n`` items of ``dataset`` (``data.max_samples``): a seeded class-stratified draw
    (:func:`stratified_indices`) when the dataset declares its labels (:func:`class_targets`; class-
    sorted loaders such as IMDB would otherwise give one class only), else its first ``n`` items.
    The result's ``note`` says which, e.g. ``"100 of 25,000 samples, stratified over 2 classes,
    seed 0"`` or ``"the first 100 of 2,000 samples (the dataset declares no class labels: not
    stratified)"``."""
    labels = class_targets(dataset)
    if labels is None:
        return FirstN(dataset, n, " (the dataset declares no class labels: not stratified)")
    indices = stratified_indices(labels, n, seed)
    classes = len(np.unique(labels[indices])) if indices else 0
    return Subsample(dataset, indices, f"{len(indices):,} of {len(dataset):,} samples, stratified over "
                                       f"{classes} class{'es' if classes != 1 else ''}, seed {seed}")


def class_names(info: TaskInfo, params: Mapping[str, Any]) -> list[str]:
    """The names of a classification task's classes: its ``class_names``, else the labels as strings
    (``"0"``, ``"1"``, ...: the task does not name them)."""
    if info.class_names is not None:
        return list(info.class_names)
    return [str(k) for k in range(info.resolve(params).num_classes)]


def build_dataset(name: str, split: str, *, max_samples: int | None = None, sample_seed: int = 0,
                  **params: Any) -> Dataset:
    """The dataset of one split of task ``name``; ``params`` override the task's defaults.

    ``max_samples``: keep only N items (a :class:`Subsample` view, :func:`subsample`: a class-stratified
    draw by ``sample_seed`` when the dataset declares its class labels, else the first N; its
    ``note`` says which); all of them when the split is smaller; ``None`` or 0 = all
    (``data.max_samples`` in a training config). ``sample_seed``: the seed of that draw (a run's
    seed); not named ``seed``, which is a parameter of several tasks.

    A classification task's dataset has ``classes``, the name of each class (torchvision's
    ``dataset.classes``): its own, else the task's ``class_names``, else ``"0"``, ``"1"``, ...
    """
    if max_samples is not None and (isinstance(max_samples, bool) or not isinstance(max_samples, int)):
        raise UserTypeError(f"max_samples must be an int (0 = all), got {max_samples!r} ({type(max_samples).__name__})")
    if max_samples is not None and max_samples < 0:
        raise UserError(f"max_samples must be >= 0 (0 = all), got {max_samples}")
    if isinstance(sample_seed, bool) or not isinstance(sample_seed, (int, np.integer)) or sample_seed < 0:
        raise UserTypeError(f"sample_seed must be an int >= 0 (the seed of the max_samples draw), got "
                            f"{sample_seed!r} ({type(sample_seed).__name__})")
    info = get_task(name)
    if split not in info.splits:
        raise UserError(f"task {name!r} has splits {list(info.splits)}, got {split!r}")
    build = _TASKS[name][1]
    merged = info.merged_params(params, own_checks=lambda p: build(split, **p))  # KeyError: an unknown parameter
    dataset = build(split, **merged)
    if info.loss in CLASSIFICATION_LOSSES and not hasattr(dataset, "classes"):
        dataset.classes = class_names(info, merged)
    if max_samples and max_samples < len(dataset):
        return subsample(dataset, max_samples, int(sample_seed))
    return dataset


# ----------------------------------------------------------------------------- bad samples during training

BAD_SAMPLE_OPTIONS = ("stop", "skip")


class SkipBadSamples(Dataset):
    """``dataset`` whose unreadable items (a :class:`BadSampleError`) become ``None`` instead of an
    error, counted: ``data.bad_samples: skip``. Use it as the outermost wrapper (after augmentation,
    which it lets the error pass through) with :meth:`collate_fn` as the DataLoader's
    ``collate_fn``, which drops the ``None`` items of a batch before collating the others (a batch
    of bad items only collates to ``None``: skip that step).

    ``skipped``: how many items were dropped so far, counted across DataLoader worker processes
    (a shared counter handed to the workers when they start); ``recent()``: ``(index, path)`` of the
    last ``keep`` of them; :meth:`summary`: a line to log. Other attributes are the dataset's.
    ``context``: the DataLoader's ``multiprocessing_context`` when it is given one (a name such as
    ``"spawn"`` or a context); None: the default context, which a DataLoader uses by default."""

    def __init__(self, dataset: Dataset, keep: int = 20, context: Any = None) -> None:
        self.dataset, self.keep = dataset, int(keep)
        self._context = context if context is None or isinstance(context, str) else context.get_start_method()
        self._shared()

    def _shared(self, count: int = 0, recent: Sequence[int] = ()) -> None:
        import multiprocessing as mp
        ctx = mp.get_context(self._context)
        self._count = ctx.Value("q", count)
        self._recent = ctx.Array("q", max(1, self.keep))
        for k, i in enumerate(list(recent)[:len(self._recent)]):
            self._recent[k] = i

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except BadSampleError:
            with self._count.get_lock():
                self._recent[self._count.value % len(self._recent)] = int(index)
                self._count.value += 1
            return None

    @property
    def skipped(self) -> int:
        """Items dropped so far (all processes)."""
        return int(self._count.value)

    def recent(self) -> list[tuple[int, Any]]:
        """``(index, path or None)`` of the last (up to ``keep``) items dropped, oldest first."""
        with self._count.get_lock():
            n, ring = self._count.value, list(self._recent)
        size = len(ring)
        order = [ring[k % size] for k in range(max(0, n - size), n)]
        return [(i, item_path(self.dataset, i)) for i in order]

    def summary(self) -> str:
        """``"skipped 3 unreadable samples (data.bad_samples: skip), e.g. 17: /data/x.jpg"``, or ``""``."""
        n = self.skipped
        if not n:
            return ""
        shown = ", ".join(f"{i}: {p}" if p is not None else str(i) for i, p in self.recent()[-3:])
        return f"skipped {n} unreadable sample{'s' if n != 1 else ''} (data.bad_samples: skip), e.g. {shown}"

    def collate_fn(self, collate: Callable | None = None) -> "DropBadSamples":
        """The DataLoader's ``collate_fn``: ``collate`` (default: torch's ``default_collate``) of the
        items of a batch that are not ``None``."""
        return DropBadSamples(collate)

    def __getstate__(self) -> dict:
        from multiprocessing import context
        state = dict(self.__dict__)
        if context.get_spawning_popen() is None:     # a plain pickle (not a worker start): plain numbers
            state["_count"] = int(self._count.value)
            state["_recent"] = list(self._recent)
        return state

    def __setstate__(self, state: dict) -> None:
        count, recent = state.pop("_count"), state.pop("_recent")
        self.__dict__.update(state)
        if isinstance(count, int):
            self._shared(count, recent)
        else:
            self._count, self._recent = count, recent

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "keep", "_context", "_count", "_recent"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


class DropBadSamples:
    """A collate function: ``collate`` of the batch's items that are not ``None`` (the items
    :class:`SkipBadSamples` dropped); ``None`` when none is left. Picklable (DataLoader workers)."""

    def __init__(self, collate: Callable | None = None) -> None:
        self.collate = collate

    def __call__(self, batch: Sequence[Any]) -> Any:
        kept = [item for item in batch if item is not None]
        if not kept:
            return None
        if self.collate is None:
            from torch.utils.data import default_collate
            return default_collate(kept)
        return self.collate(kept)


def item_path(dataset: Any, index: int) -> Any:
    """The file of item ``index`` when the dataset (or one it wraps) says: ``sample_path(index)``."""
    for _ in range(8):
        if hasattr(type(dataset), "sample_path"):
            try:
                return dataset.sample_path(index)
            except Exception:
                return None
        if isinstance(dataset, Subset):
            index, dataset = dataset.indices[index], dataset.dataset
        elif "dataset" in getattr(dataset, "__dict__", {}):
            dataset = dataset.__dict__["dataset"]
        else:
            return None
    return None
