"""What every modwire model shares: the base :class:`Record` of a forward pass and
:class:`PretrainedModel` (save/load, auxiliary losses, parameter counting).

``save_pretrained(dir)`` writes ``config.json`` and ``model.safetensors``
atomically (temporary file, then rename); ``from_pretrained(dir)`` never unpickles
(:func:`read_pretrained`) and builds the model without initialising the weights it then
overwrites (:func:`load_model`). The table of model types (:data:`MODEL_TYPES`, filled by
``modwire.models.registry.register_model_type``) lives here, not in the registry, because
loading dispatches on it and the registry imports this module. The folder is the layout of
``huggingface_hub.PyTorchModelHubMixin`` (each reads the other's), ``from_pretrained`` also takes a Hub
repo id and ``push_to_hub`` uploads: :mod:`modwire.hub`.

The config machinery lives in :mod:`modwire.models.config` and the shared tokenizer config
in :mod:`modwire.models.tokenizer_config`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor, nn

from ..nn.blocks import run_block
from ..nn.init import single_thread
from ..nn.nfm import INDUCTOR_OPTIONS, NFM
from .config import ModelConfig
from ..errors import UnknownNameError, UserError, UserTypeError
from ..fields import check_keywords, did_you_mean

__all__ = ["BATCHNORM_REFUSAL", "CONFIG_FILE", "WEIGHTS_FILE", "MODEL_TYPES", "NORM_LAYERS", "PretrainedModel", "Record",
           "config_class", "load_model", "no_weight_decay_names", "read_pretrained", "unknown_name"]

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


@dataclass
class Record:
    """What one forward pass computed, for analysis: the base of every family's record (the model
    class's ``record_type``, returned by its ``forward_record(x, **inputs)``). ``logits`` as
    ``forward`` returns them, ``states``: the final states the output reads (shapes: each family's
    record). Each family adds only its own fields: :class:`~modwire.models.perceiver_io.PerceiverIORecord`,
    :class:`~modwire.models.nac.NACRecord`, :class:`~modwire.models.set_model.SetModelRecord` (ViT),
    :class:`~modwire.models.neural_interpreter.NIRecord`, :class:`~modwire.models.ait.AiTRecord`,
    :class:`~modwire.models.nfm.NFMModelRecord` (LM, PreActResNet, CNN_MLP)."""

    logits: Tensor
    states: Tensor


# Normalisation layers, by type: none of their parameters (gains, shifts) is weight-decayed. (BatchNorm*,
# SyncBatchNorm and InstanceNorm* derive from _NormBase; modwire's ChannelLayerNorm from LayerNorm.)
NORM_LAYERS: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)


def no_weight_decay_names(module: nn.Module, exempt: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Full names (as ``module.named_parameters()``) of the parameters trained without weight decay:

    * every bias: a parameter called ``bias``, whatever its shape (NI's per-token heads' ``[T, C]`` bias);
    * every parameter of a normalisation layer (:data:`NORM_LAYERS`, by module type);
    * every parameter of at most one dimension: the scalars (NFM's γ, ``ModulatedLinear``'s α, NI's
      log σ) and vectors (LM's output bias) (NAC App. C: "the weight decay is neither applied to
      parameters with dimension less than or equal to 1"; timm's rule too);
    * every parameter under one of ``exempt``: dotted paths matched as whole components of the name
      (``"relative"`` is a module, ``"scripts.0.functions.signatures"`` and ``"functions.signatures"``
      are both under ``"signatures"``; ``"added_signatures"`` is not).

    What is left, and decayed, is the weight matrices and kernels of the linear, convolutional and
    embedding layers and the model's other learned tensors of two or more dimensions."""
    norms = {id(p) for m in module.modules() if isinstance(m, NORM_LAYERS) for p in m.parameters(recurse=False)}
    paths = [tuple(e.split(".")) for e in exempt]

    def under(name: str) -> bool:
        parts = tuple(name.split("."))
        return any(parts[i:i + len(e)] == e for e in paths for i in range(len(parts) - len(e) + 1))
    return tuple(n for n, p in module.named_parameters()
                 if p.ndim <= 1 or n.rsplit(".", 1)[-1] == "bias" or id(p) in norms or under(n))


def _in_parameter_dtype(forward: Any) -> Any:
    """``forward`` returning its output in the model's parameters' dtype. Under autocast the last op
    would decide (bf16 from a Linear head, fp32 from an einsum head on the CPU, which autocast leaves
    alone), so families differed; now an fp32 model returns fp32 under bf16 / fp16 autocast on every
    device, as the loss and metrics expect, and a bf16 model returns bf16. Inside ``forward`` (not a
    hook), so ``torch.compile`` traces it into the model's one graph.

    Each wrapped method gets its own code object: ``torch.compile`` keeps a model's compiled graphs on
    the code of the frame it enters (this wrapper), at most ``torch._dynamo.config.recompile_limit``
    (8) per code. With one code shared by every model, the fifth model compiled in a process (a graph
    for train and one for eval each) failed under ``fullgraph=True`` (issue 39)."""
    @functools.wraps(forward)
    def in_parameter_dtype(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        output = forward(self, *args, **kwargs)
        logits = output.logits if isinstance(output, Record) else output
        if isinstance(logits, Tensor) and logits.is_floating_point():
            dtype = next(self.parameters()).dtype
            if logits.dtype != dtype:
                logits = logits.to(dtype)
                if isinstance(output, Record):             # forward_record: its logits
                    return dataclasses.replace(output, logits=logits)
                return logits
        return output
    code = in_parameter_dtype.__code__
    own = {"co_qualname": f"in_parameter_dtype[{forward.__qualname__}]"} if hasattr(code, "co_qualname") else {}
    in_parameter_dtype.__code__ = code.replace(**own)          # a new code object, also on Python 3.10
    return in_parameter_dtype


#: Why a network with BatchNorm in its blocks refuses :meth:`PretrainedModel.set_grad_checkpointing`.
BATCHNORM_REFUSAL = ("has BatchNorm in its blocks: a block run again in the backward would update the running "
                     "statistics a second time")


class PretrainedModel(nn.Module):
    """Mixin for models with a ``config``: save/load and parameter counting. Every model's ``forward``
    (and a classifier's ``forward_head``) returns its output in the parameters' dtype, under autocast
    too, and ``forward_record`` its logits (:func:`_in_parameter_dtype`, applied to each subclass's own
    methods when the class is defined).

    A model that records its forward pass (the ``Records`` capability, :mod:`modwire.models.capabilities`)
    declares ``record_type`` (a :class:`Record` subclass) and defines
    ``forward_record(x, **inputs) -> record_type``, where ``inputs`` are its config's other
    ``input_names()`` (``condition``, ``task``, ``question``) and nothing else."""

    config_class: ClassVar[type[ModelConfig]]
    config: ModelConfig

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("forward", "forward_record", "forward_head"):
            if name in cls.__dict__:
                setattr(cls, name, _in_parameter_dtype(cls.__dict__[name]))
        if "__init__" in cls.__dict__:
            cls.__init__ = _config_from_dict(cls.__dict__["__init__"])

    def forward_intermediates(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        """timm's contract on the classifiers (:class:`~modwire.models.classifier_api.Classifier`); a model
        that is not one (the causal LM, the GAN) refuses it. (For one release, issue 37, this name was an
        alias of ``forward_record``, where the paper's records are.)"""
        raise UserError(f"{type(self).__name__} is not an image classifier: timm's forward_intermediates "
                        f"applies to the classifiers (docs/layout.md, 'timm's model API'); the record of its "
                        f"forward pass is model.forward_record(x, **inputs)")

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    # What this model's paper (or its authors' configs) trains without weight decay besides what no model
    # decays (biases, normalisation layers, ≤1-D parameters): dotted name paths, :func:`no_weight_decay_names`.
    # Default: learned positional encodings of the tokenizers (the NAC authors' configs exempt their ``grid``).
    decay_exempt: ClassVar[tuple[str, ...]] = ("tokenizer.pos",)

    def no_weight_decay(self) -> tuple[str, ...]:
        """The full names of every parameter trained without weight decay (:func:`no_weight_decay_names`
        with :attr:`decay_exempt`): the one list :func:`modwire.training.optim.param_groups` uses, in the
        form timm's optimizer factory matches exactly (``no_weight_decay_list``)."""
        return no_weight_decay_names(self, self.decay_exempt)

    # The paper's weight of each auxiliary loss the model reports (``auxiliary_losses``), used by the
    # trainer where the config sets none (AiT: σ = 1e-2 for "balance", AiT Eq. 6).
    aux_loss_defaults: ClassVar[dict[str, float]] = {}
    # Options of evaluation a trained model takes (``set_eval_options``, the EvalOptions capability
    # of modwire.models.capabilities; ``modwire eval RUN --set model.overrides.<option>=…``).
    eval_options: ClassVar[tuple[str, ...]] = ()

    # Why this model cannot recompute its blocks in the backward (timm's ``set_grad_checkpointing``), or None
    # where it can: its forward runs each block through :meth:`run_block`.
    grad_checkpointing_refusal: ClassVar[str | None] = "runs no blocks that recompute in the backward"
    grad_checkpointing: bool = False

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's ``set_grad_checkpointing``: with ``enable``, each block of the forward keeps only its inputs
        and is run again in the backward (``torch.utils.checkpoint``, non-reentrant, the random state of its
        dropout restored), trading compute for activation memory; outputs and gradients are unchanged.
        A model whose blocks cannot be recomputed exactly refuses, saying why
        (:attr:`grad_checkpointing_refusal`)."""
        if not isinstance(enable, bool):
            raise UserTypeError(f"set_grad_checkpointing: enable must be a bool, got {type(enable).__name__} {enable!r}")
        if enable and self.grad_checkpointing_refusal:
            able = sorted(c.__name__ for c in MODEL_TYPES.values() if c.grad_checkpointing_refusal is None)
            raise UserError(f"set_grad_checkpointing: this {type(self).__name__} {self.grad_checkpointing_refusal}; "
                            f"the models that recompute their blocks: {', '.join(able)}")
        self.grad_checkpointing = enable

    def run_block(self, block: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``block(*args, **kwargs)``, or under :meth:`set_grad_checkpointing` (while gradients are recorded)
        through ``torch.utils.checkpoint``: its activations recomputed in the backward."""
        return run_block(self.grad_checkpointing, block, *args, **kwargs)

    def prepare_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Called before weights are loaded: a model whose optional parts (e.g. a NAC's
        edge-masked kernel after sparsification) are in ``state`` installs them here."""

    def auxiliary_losses(self) -> dict[str, Tensor]:
        """Named auxiliary losses of the last forward pass in training mode: scalars that carry
        gradient, e.g. NAC's graph structure regularizer ``{"graph": L_graph(P, P0)}`` (NAC App. A,
        Eq. 6-9) or an Associative Transformer's balance loss. The trainer adds
        ``Σ_name weight[name] · loss`` (weights from the training config's ``aux_loss_weights``;
        a reported loss without a weight is an error), scales it like the task loss under
        gradient accumulation and logs each as ``aux/<name>``. A model computes them inside
        ``forward`` and returns them here; in eval mode it returns ``{}``. Default: none."""
        return {}

    def compile_options(self) -> dict[str, Any]:
        """The inductor options this model compiles with (what :meth:`compile_kwargs` adds): inductor's
        layout optimization off in a model on the CPU that holds an NFM (:data:`modwire.nn.nfm.INDUCTOR_OPTIONS`;
        on a GPU unmeasured, so inductor's default there); none in any other."""
        on_cpu = all(p.device.type == "cpu" for p in self.parameters())
        return dict(INDUCTOR_OPTIONS) if on_cpu and any(isinstance(m, NFM) for m in self.modules()) else {}

    def compile_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """``torch.compile`` keywords for this model, ``torch.compile(model, **model.compile_kwargs(fullgraph=True))``:
        ``kwargs`` with :meth:`compile_options` added to inductor's ``options`` (the caller's own options win).
        torch takes a ``mode`` or ``options``, not both, so a known ``mode`` becomes the options it stands
        for (``torch._inductor.list_mode_options``); another backend than inductor takes ``kwargs`` as given
        (no ``backend``, or None: torch's default backend, inductor unless ``torch.compiler.set_default_backend``
        changed it)."""
        extra, kwargs = self.compile_options(), dict(kwargs)
        if kwargs.get("options") is not None and not isinstance(kwargs["options"], dict):
            raise UserTypeError(f"compile: options must be a dict of inductor settings, got "
                                f"{type(kwargs['options']).__name__} {kwargs['options']!r}")
        if not extra or _backend(kwargs.get("backend")) != "inductor":
            return kwargs
        from torch._inductor import list_mode_options
        mode = kwargs.get("mode")
        if mode is not None and mode not in list_mode_options():
            return kwargs                                   # torch's own error names the modes
        kwargs.pop("mode", None)
        mode_options = list_mode_options(mode, kwargs.get("dynamic")) if mode is not None else {}
        return {**kwargs, "options": {**mode_options, **extra, **(kwargs.get("options") or {})}}

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``nn.Module.compile`` (compiles this module's ``__call__`` in place) with :meth:`compile_kwargs`."""
        super().compile(*args, **self.compile_kwargs(**kwargs))

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (each atomically, :mod:`modwire.files`) into
        ``directory``, then ``manifest.json`` with the weights' sha256, which :meth:`from_pretrained`
        verifies (``config.json`` stays editable by hand; a training checkpoint lists every file)."""
        from safetensors.torch import save_file

        from ..files import atomic_write, atomic_write_text
        from ..manifest import MANIFEST_FILE, write_manifest

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / MANIFEST_FILE).unlink(missing_ok=True)   # the old checksums no longer describe the files
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        atomic_write(d / WEIGHTS_FILE, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}), needed=size)
        atomic_write_text(d / CONFIG_FILE, self.config.to_json())
        write_manifest(d, [WEIGHTS_FILE])
        return d

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, map_location: str | torch.device = "cpu", *,
                        config: ModelConfig | None = None, **hub: Any):
        """This class's model saved by :meth:`save_pretrained`, or by ``PyTorchModelHubMixin.save_pretrained``
        (a ``config.json`` without ``model_type`` is this class's config), from a folder or a Hub repo id
        (``"org/name"``, through the Hub's cache: :func:`modwire.hub.resolve`, whose keywords ``revision``,
        ``cache_dir``, ``force_download``, ``token``, ``local_files_only`` ``hub`` holds). ``config``: the
        config of a folder that has weights but no ``config.json`` (accelerate's ``save_model``)."""
        from ..hub import resolve

        directory = resolve(name_or_path, **hub)
        config, state = read_pretrained(directory, config=config, default=cls.config_class)
        if not isinstance(config, cls.config_class):
            raise UserError(f"{name_or_path} holds a {config.model_type!r} model, not {cls.config_class.model_type!r}")
        return load_model(cls, config, state, directory, map_location)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Upload :meth:`save_pretrained`'s folder and a model card to the Hub repo ``repo_id`` (created if
        needed) in one commit, as ``PyTorchModelHubMixin.push_to_hub``; ``kwargs``: ``commit_message``,
        ``private``, ``token``, ``branch``, ``create_pr`` (:func:`modwire.hub.push_to_hub`)."""
        from ..hub import PUSH_OPTIONS, push_to_hub

        check_keywords("push_to_hub", kwargs, PUSH_OPTIONS)
        return push_to_hub(self, repo_id, **kwargs)


def _config_from_dict(init: Any) -> Any:
    """A model class's ``__init__(config)`` that also takes a ``config.json``'s contents as a dict (read by
    ``config_class.from_dict``, which checks its ``model_type`` when it has one): what
    ``PyTorchModelHubMixin.from_pretrained`` passes, since it cannot decode the config itself."""
    @functools.wraps(init)
    def __init__(self: PretrainedModel, *args: Any, **kwargs: Any) -> None:
        if args and isinstance(args[0], dict):
            args = (type(self).config_class.from_dict(args[0]), *args[1:])
        elif isinstance(kwargs.get("config"), dict):
            kwargs["config"] = type(self).config_class.from_dict(kwargs["config"])
        init(self, *args, **kwargs)
    return __init__


#: ``model_type`` → model class, filled by :func:`modwire.models.registry.register_model_type`.
MODEL_TYPES: dict[str, type[PretrainedModel]] = {}


def unknown_name(kind: str, name: Any, valid: list[str]) -> UnknownNameError:
    """The error for a name not in ``valid``, with close matches: ``unknown model 'nac_smal'. Did you mean ...``."""
    hint = did_you_mean(name, valid) if isinstance(name, str) else ""
    return UnknownNameError(f"unknown {kind} {name!r}.{hint} Valid: {valid}")


def config_class(model_type: str) -> type[ModelConfig]:
    """The config class of a registered ``model_type`` (a KeyError with close matches otherwise)."""
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise unknown_name("model_type", model_type, sorted(MODEL_TYPES))
    return MODEL_TYPES[model_type].config_class


# Weights modwire never reads, because loading them unpickles (PyTorchModelHubMixin's and transformers'
# fallback, torch.save's files).
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
SHARD_INDEX = "model.safetensors.index.json"   # accelerate's and transformers' weights in several files


def read_pretrained(directory: str | os.PathLike, *, config: ModelConfig | None = None,
                    default: type[ModelConfig] | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read ``config.json`` (→ the right config class) and the safetensors weights, after verifying
    ``manifest.json`` where there is one. ``default``: the config class of a ``config.json`` without
    ``model_type`` (``PyTorchModelHubMixin``'s); ``config``: the config of a folder that has the weights
    but no ``config.json`` (accelerate's ``save_model``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(directory)
    layout = f"expected {d}/{CONFIG_FILE} and {d}/{WEIGHTS_FILE} (written by save_pretrained)"
    _check_layout(d, layout, config)
    if config is None:
        config = _read_config(d / CONFIG_FILE, config_class, default)
    elif not isinstance(config, ModelConfig):
        raise UserTypeError(f"config: expected a model config (e.g. modwire.get_config('nac_micro')), "
                            f"got {type(config).__name__}")
    from ..manifest import verify_manifest

    verify_manifest(d)   # a checkpoint's sha256 manifest, when there is one (modwire.training)
    try:
        state = load_file(str(d / WEIGHTS_FILE))
    except (SafetensorError, OSError) as e:
        raise UserError(f"{d / WEIGHTS_FILE} is not a readable safetensors file ({e}); {layout}") from e
    return config, state


def _check_layout(d: Path, layout: str, config: ModelConfig | None) -> None:
    """A clear error for each folder ``read_pretrained`` cannot read: none, a training run, pickled
    weights only, weights without ``config.json`` (unless ``config`` is given), or both configs."""
    has_config, has_weights = (d / CONFIG_FILE).is_file(), (d / WEIGHTS_FILE).is_file()
    if has_weights and has_config and config is not None:
        raise UserError(f"{d} holds its own {CONFIG_FILE}: config= is for a folder of weights without one "
                        f"(accelerate's save_model); load it without config=")
    if has_weights and (has_config or config is not None):
        return
    hint = ""
    if (d / "checkpoints").is_dir():  # a training run: its checkpoints are what from_pretrained reads
        hint = f"; {d} is a training run directory: load {d}/checkpoints/best (or checkpoints/last)"
    elif (d / SHARD_INDEX).is_file():
        hint = (f"; {d} holds weights in shards ({SHARD_INDEX}), which modwire does not read: save them as one "
                f"file (accelerate: save_model(..., max_shard_size larger than the model))")
    elif has_weights:
        hint = (f"; {d} holds {WEIGHTS_FILE} without {CONFIG_FILE} (as accelerate's save_model writes): pass "
                f"the model's config: from_pretrained({str(d)!r}, config=modwire.get_config(preset, ...))")
    elif d.is_dir() and (pickled := sorted(f.name for f in d.iterdir() if f.suffix in PICKLED_SUFFIXES)):
        hint = (f"; it holds pickled weights ({', '.join(pickled)}), which modwire never loads (unpickling "
                f"runs code): save them as {WEIGHTS_FILE} with safetensors")
    raise FileNotFoundError(f"not a saved modwire model: {layout}{hint}")


_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
               type(None): "null"}


def _read_config(path: Path, config_class: typing.Callable[[str], type[ModelConfig]],
                 default: type[ModelConfig] | None = None) -> ModelConfig:
    """``config.json`` → its config (``default`` where it names no ``model_type``, as
    ``PyTorchModelHubMixin`` writes it); every error is one line naming ``path`` and what was expected."""
    expected = "a JSON object with a 'model_type' key (as written by save_pretrained)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}); expected {expected}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                        f"expected {expected}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected {expected}, got {_JSON_KINDS.get(type(data), type(data).__name__)}")
    if "model_type" not in data and default is not None:
        data = {"model_type": default.model_type, **data}
    if not isinstance(data.get("model_type"), str):
        got = f"model_type {data['model_type']!r}" if "model_type" in data else "no 'model_type' key"
        hint = ("; a folder saved by PyTorchModelHubMixin names none: load it with its model class, e.g. "
                "modwire.models.nac.NAC.from_pretrained(folder)") if "model_type" not in data else ""
        raise UserError(f"{path}: expected {expected}, got {got}{hint}")
    try:
        return config_class(data["model_type"]).from_dict(data)
    except (KeyError, ValueError, TypeError) as e:   # a field's error, prefixed with the file
        raise type(e)(f"{path}: {e.args[0] if e.args else e}") from None


def load_model(cls: type[nn.Module], config: ModelConfig, state: dict[str, torch.Tensor], where: Any,
               map_location) -> nn.Module:
    """``cls(config)`` holding ``state``, without initialising the weights it then overwrites:
    the model is built on the meta device (no memory, no sampling) and the loaded tensors are
    assigned to it. Should a tensor not come from ``state`` (a buffer left out of the state
    dict, a plain tensor attribute), the model is built and initialised normally instead, so
    nothing stays unset on the meta device."""
    with torch.device("meta"):
        model = cls(config)
    if not _fill(model, state, where, assign=True):
        model = cls(config)
        _fill(model, state, where, assign=False)
    return model.to(map_location)


def _fill(model: nn.Module, state: dict[str, torch.Tensor], where: Any, *, assign: bool) -> bool:
    """Load ``state`` into ``model``; with ``assign``, the tensors of ``state`` become the
    model's (copied once into the dtype the model declares). False if a tensor is left unset (meta)."""
    model.prepare_state_dict(state)
    own = model.state_dict()
    missing, unexpected = set(own) - set(state), set(state) - set(own)
    if missing or unexpected:
        raise UserError(f"weights in {where} do not match the config: missing {sorted(missing)[:5]}, "
                        f"unexpected {sorted(unexpected)[:5]}")
    if assign:  # fresh, aligned storage: safetensors' tensors may sit at any offset of the file
        # buffer, and a misaligned weight changes the SIMD summation order (logits differ in ulps).
        # One thread: a memory-bound copy gains little from more, and stalls when cores are shared.
        with single_thread():
            state = {k: torch.empty(v.shape, dtype=own[k].dtype, device=v.device).copy_(v) for k, v in state.items()}
    try:
        model.load_state_dict(state, assign=assign)
    except RuntimeError as e:  # shape mismatches: name the files, keep torch's details
        raise UserError(f"weights in {where} do not match its config.json: {e}") from None
    return not any(isinstance(t, Tensor) and t.is_meta for m in model.modules()
                   for t in (*m._parameters.values(), *m._buffers.values(), *vars(m).values()))


def _backend(backend: Any) -> Any:
    """The backend ``torch.compile(backend=backend)`` uses: ``None`` is torch's default (``inductor`` unless
    ``torch.compiler.set_default_backend`` changed it; a torch without that setting: inductor)."""
    if backend is not None:
        return backend
    default = getattr(torch.compiler, "get_default_backend", None)
    return "inductor" if default is None else default()
