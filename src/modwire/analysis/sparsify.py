"""Post-hoc sparsification of NAC (NAC App. F) and of Perceiver IO latents.

Three operations, none of which touches the model it is given (each returns a deep copy):

* :func:`module_importance` — NAC App. F Eq. 10: ``q_i = Σ_j P_ij`` with ``P`` the
  link probabilities among processor modules (:meth:`NAC.link_probs`, NAC Eq. 2).
* :func:`drop_modules` — "Selecting what modules are dropped": sort the processor
  modules by ``q_i`` and *remove* the ``k`` with the smallest ``q_i`` (the most strongly
  connected modules are dropped last). Removal is real, not masking: the per-module
  tensors ``processors.signatures`` ``[U_p, d_sig]`` and ``processors.codes``
  ``[U_p, d_code]`` are index-selected (kept rows in their original order) and
  ``config.num_processor_modules`` is updated, so the read-in, every propagator
  (attention ``O(U_p²)``, ModFFN ``O(U_p)``) and the read-out really run on fewer
  modules. Every other weight is shared by all modules and stays as it is; this is
  *asserted* on every call by building the architecture for the old and the new
  module count on the ``meta`` device and checking that the only tensors whose shapes
  differ are the per-module ones handled here (a shape test for "a dimension equal to
  U_p" would be fooled by coincidences, e.g. ``tokenizer.conv_channels: 320`` with 320 modules).

  Perceiver IO has no ``P``: its latents ``[U, d_model]`` are dropped in a given
  ``order`` (indices, first dropped first), or, without one, the *last* latents
  (``seed=None``) or a random set drawn from ``torch.Generator().manual_seed(seed)``.
  The same ``order`` / ``seed`` choices exist for a NAC (a NAC without a kernel has no
  ``P`` either and needs one of them).
* :func:`eliminate_edges` — "Eliminating connections between modules": the smallest
  ``fraction`` of the off-diagonal ``P_ij`` are set to 0. ``P`` is symmetric (cosine
  distance), so the ranking is done on the pairs ``i < j`` of ``(P + Pᵀ)/2`` and the
  result mirrored: exactly ``fraction`` of the upper and of the lower triangular part is
  removed, as in the paper ("90% of elements in the lower and upper triangular portion
  of the matrix P_ij (excluding the diagonal) are set to 0"). The diagonal is always
  kept. The copy's propagator kernel gets the bool edge mask ``[U_p, U_p]``
  (True = kept) through :class:`SignatureKernel`'s ``mask`` argument, which hands
  eliminated pairs a ``-1e9`` logit bias: their attention weights are exactly 0.

  The copy's propagators get the bool edge mask ``[U_p, U_p]`` (True = kept) through
  :func:`set_edge_mask`, which installs an :class:`~modwire.nn.EdgeMaskedKernel` as the
  NAC's ``propagator_kernel`` (its mask is a buffer, saved with the weights; a saved copy
  reloads edge-masked): eliminated pairs are masked keys, their attention weights exactly 0. The read-out
  kernel (output → processor) is not masked. ``link_probs()`` of the copy reports the
  masked ``P`` (eliminated entries 0), so :func:`module_importance` of an
  edge-eliminated model ranks by the surviving connections.

The operations compose: dropping modules from an edge-eliminated model index-selects the
edge mask too; eliminating edges on an edge-eliminated model ANDs the masks.
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..models import ModuleAxis
from ..models.capabilities import ModuleSurgery
from ..nn import EdgeMaskedKernel
from ..errors import UserError, UserTypeError

__all__ = ["drop_modules", "edge_mask", "eliminate_edges", "get_edge_mask", "keep_modules", "module_axis",
           "module_importance", "modules_to_keep", "set_edge_mask"]

_NEEDS_P = "a model with link probabilities P over its modules, shared by every sample (an unconditional NAC " \
           "with kernel.enabled=True)"


# ----------------------------------------------------------------------------- helpers

def module_axis(model: nn.Module) -> ModuleAxis:
    """The model's own description of its per-module axis (``model.module_axis()``, see
    :class:`~modwire.models.ModuleAxis`): NAC processor modules, Perceiver IO latents."""
    if not isinstance(model, ModuleSurgery):
        raise UserTypeError(f"{type(model).__name__} does not describe its modules: module surgery needs a model "
                            f"with a module_axis() method (see modwire.models.ModuleAxis), e.g. a NAC or a PerceiverIO")
    return model.module_axis()


def get_edge_mask(model: nn.Module) -> Tensor | None:
    """The bool ``[U_p, U_p]`` edge mask installed on a NAC's propagators, or None (no mask, or not
    a NAC). The installed kernel is an :class:`~modwire.nn.EdgeMaskedKernel` or the block-sparse
    kernel made from one; both keep the mask as their ``edge_mask`` buffer."""
    from ..models.nac import NAC

    if not isinstance(model, NAC) or model.propagator_kernel is None:
        return None
    return model.propagator_kernel.edge_mask


def set_edge_mask(model: nn.Module, mask: Tensor | None) -> None:
    """Restrict a NAC's propagators to the edges where ``mask`` ``[U_p, U_p]`` (bool) is True
    (NAC App. F, "Eliminating connections between modules"), in place; None restores all."""
    if mask is None:
        model.propagator_kernel = None
        return
    axis = module_axis(model)
    if not axis.link_probs:
        raise UserError(f"edge masks need {_NEEDS_P}; got {type(model).__name__}")
    u = axis.size
    if mask.dtype != torch.bool or tuple(mask.shape) != (u, u):
        raise UserError(f"edge mask must be a bool tensor of shape ({u}, {u}), got {mask.dtype} {tuple(mask.shape)}")
    model.propagator_kernel = EdgeMaskedKernel(model.kernel, mask.to(model.kernel.log_epsilon.device))


def _droppable_axis(model: nn.Module) -> ModuleAxis:
    """:func:`module_axis`, checked to allow removing modules after training."""
    axis = module_axis(model)
    if axis.fixed is not None:
        raise UserError(f"module dropping needs modules fixed after training; {type(model).__name__}: {axis.fixed}")
    return axis


def _set_tensor(model: nn.Module, name: str, value: Tensor) -> None:
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    old = getattr(owner, attr)
    if isinstance(old, nn.Parameter):
        setattr(owner, attr, nn.Parameter(value, requires_grad=old.requires_grad))
    else:
        setattr(owner, attr, value)


def _fresh_copy(model: nn.Module) -> nn.Module:
    """``copy.deepcopy`` made outside inference mode (so that the copy's parameters are
    ordinary tensors even when called under ``torch.inference_mode()``), without the
    inference caches of ModFC modulation factors."""
    with torch.inference_mode(False):
        new = copy.deepcopy(model)
    for m in new.modules():
        m.__dict__.pop("_m_cache", None)
    return new


def _check_only_module_tensors_change(model: nn.Module, num_new: int) -> None:
    """Assert that between the architectures with ``U`` and ``num_new`` modules only the
    per-module tensors (handled by :func:`keep_modules`) change shape."""
    axis = _droppable_axis(model)
    field, names, u_old = axis.config_field, axis.tensors, axis.size
    u_other = num_new if num_new != u_old else u_old + 1   # a different count, to see what depends on it
    shapes = []
    with torch.device("meta"):   # shapes only: nothing is allocated or initialised
        for u in (u_old, u_other):
            ref = type(model)(model.config.replace(**{field: u}))
            shapes.append({k: tuple(v.shape) for k, v in ref.state_dict().items()})
    changed = {k for k in shapes[0] if shapes[0][k] != shapes[1].get(k)}
    if changed != set(names):
        raise RuntimeError(f"{type(model).__name__}: tensors depending on {field} are {sorted(changed)}, "
                           f"but only {list(names)} are index-selected")
    actual = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith("propagator_kernel.")}
    if actual != shapes[0]:
        raise RuntimeError(f"{type(model).__name__}: state_dict does not match its config")


# ----------------------------------------------------------------------------- importance

def module_importance(model: nn.Module) -> Tensor:
    """``q_i = Σ_j P_ij`` (NAC App. F Eq. 10): ``[U_p]``, detached. For an
    edge-eliminated NAC eliminated links count as 0."""
    if not module_axis(model).link_probs:
        raise UserTypeError(f"module_importance needs {_NEEDS_P}; got {type(model).__name__}")
    with torch.no_grad():
        p = model.link_probs()
    return p.sum(dim=1)


# ----------------------------------------------------------------------------- dropping modules

def _num_drop(num_drop: int | float, u: int) -> int:
    if isinstance(num_drop, bool) or not isinstance(num_drop, (int, float)):
        raise UserTypeError(f"num_drop must be an int (count) or a float (fraction), got {num_drop!r}")
    if isinstance(num_drop, float):
        if not 0.0 <= num_drop < 1.0:
            raise UserError(f"num_drop as a fraction must be in [0, 1), got {num_drop}")
        num_drop = round(num_drop * u)
    if not 0 <= num_drop < u:
        raise UserError(f"num_drop must be in [0, {u}) (at least one module is kept), got {num_drop}")
    return num_drop


def modules_to_keep(model: nn.Module, num_drop: int | float, order: Sequence[int] | Tensor | None = None,
                    seed: int | None = None) -> Tensor:
    """Indices (sorted, int64) of the modules that :func:`drop_modules` keeps.

    ``num_drop``: a count, or a float fraction of the modules (rounded).
    ``order``: module indices in drop order (first dropped first); it may be a prefix of
    length ≥ ``num_drop``. Default: a NAC with a kernel sorts by ``q_i`` ascending
    (stable: ties drop the lower index first); otherwise the last modules
    (``seed=None``) or a seeded random permutation.
    """
    axis = _droppable_axis(model)
    u = axis.size
    k = _num_drop(num_drop, u)
    if order is not None:
        order = torch.as_tensor(order, dtype=torch.long).flatten().cpu()
        if len(order) < k or len(torch.unique(order)) != len(order) or \
                (len(order) and (order.min() < 0 or order.max() >= u)):
            raise UserError(f"order must hold >= {k} distinct indices in [0, {u})")
    elif axis.link_probs:
        order = torch.sort(module_importance(model).cpu(), stable=True).indices
    elif seed is None:
        order = torch.arange(u - 1, -1, -1)
    else:
        order = torch.randperm(u, generator=torch.Generator().manual_seed(seed))
    keep = torch.ones(u, dtype=torch.bool)
    keep[order[:k]] = False
    return keep.nonzero().squeeze(1)


def keep_modules(model: nn.Module, keep: Sequence[int] | Tensor) -> nn.Module:
    """A deep copy of ``model`` with only the modules ``keep`` (in the given order;
    pass sorted indices to keep the original order): the per-module tensors are
    index-selected, the module count in the config is updated, all shared weights are
    copied unchanged. ``model`` is untouched."""
    axis = _droppable_axis(model)
    field, names, u = axis.config_field, axis.tensors, axis.size
    keep = torch.as_tensor(keep, dtype=torch.long).flatten()
    if len(keep) == 0 or len(torch.unique(keep)) != len(keep) or keep.min() < 0 or keep.max() >= u:
        raise UserError(f"keep must hold distinct indices in [0, {u}), at least one")
    _check_only_module_tensors_change(model, len(keep))
    new = _fresh_copy(model)
    new.config = model.config.replace(**{field: len(keep)})
    with torch.inference_mode(False), torch.no_grad():
        for name in names:
            t = new.get_parameter(name)
            _set_tensor(new, name, t.index_select(0, keep.to(t.device)).clone())
        m = get_edge_mask(new)
        if m is not None:
            idx = keep.to(m.device)
            set_edge_mask(new, m.index_select(0, idx).index_select(1, idx))
    return new


def drop_modules(model: nn.Module, num_drop: int | float, order: Sequence[int] | Tensor | None = None,
                 seed: int | None = None) -> nn.Module:
    """Remove ``num_drop`` processor modules (NAC) or latents (Perceiver IO); see
    :func:`modules_to_keep` for how they are chosen (NAC default: smallest ``q_i``,
    NAC App. F) and :func:`keep_modules` for what is copied. Returns a new model with
    ``U - num_drop`` modules whose per-module rows are the kept ones in their original
    order; ``model`` is untouched."""
    return keep_modules(model, modules_to_keep(model, num_drop, order, seed))


# ----------------------------------------------------------------------------- eliminating edges

@torch.no_grad()
def edge_mask(model: nn.Module, fraction: float) -> Tensor:
    """Bool ``[U_p, U_p]``, True = kept: the ``round(fraction · U_p(U_p-1)/2)`` pairs
    ``i < j`` with the smallest ``(P_ij + P_ji)/2`` are eliminated in both directions
    (stable sort: among ties the pair earlier in row-major order goes first); the
    diagonal is always kept. For an edge-eliminated NAC the ranking uses its masked
    ``P`` and the result is ANDed with its current mask."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 <= fraction <= 1:
        raise UserError(f"fraction must be a number in [0, 1], got {fraction!r}")
    if not module_axis(model).link_probs:
        raise UserError(f"eliminate_edges needs {_NEEDS_P}; got {type(model).__name__}")
    p = model.link_probs().detach()
    p = (p + p.T) / 2
    u = p.shape[0]
    iu, ju = torch.triu_indices(u, u, offset=1, device=p.device)
    k = round(fraction * len(iu))
    drop = torch.sort(p[iu, ju], stable=True).indices[:k]
    mask = torch.ones(u, u, dtype=torch.bool, device=p.device)
    mask[iu[drop], ju[drop]] = False
    mask[ju[drop], iu[drop]] = False
    if get_edge_mask(model) is not None:
        mask &= get_edge_mask(model).to(mask.device)
    return mask


def eliminate_edges(model: nn.Module, fraction: float) -> tuple[nn.Module, Tensor]:
    """NAC App. F, "Eliminating connections between modules": ``(copy, mask)`` where the
    copy's propagators attend only along the kept edges
    (``mask`` from :func:`edge_mask`). ``model`` is untouched."""
    with torch.inference_mode(False):
        mask = edge_mask(model, fraction)
    new = _fresh_copy(model)
    set_edge_mask(new, mask)
    return new, mask


# ----------------------------------------------------------------------------- block-sparse inference

def prior_groups(model: nn.Module, prior: str, num_blocks: int | None = None, **params) -> Tensor:
    """Block of each processor module in a block prior's frame: the modules are matched to
    the prior's nodes (NAC App. A, Eq. 9 + Hungarian) and take the block of their node
    (planted partition: its cluster; ring of cliques: its clique). ``LongTensor [U_p]``."""
    from ..graphs import PRIORS, block_assignment, match
    from ..graphs import prior as prior_matrix

    u = module_axis(model).size
    counts = {"planted_partition": "num_clusters", "ring_of_cliques": "num_cliques"}
    if prior not in counts:
        raise UserError(f"prior_groups needs a block prior, one of {sorted(counts)}; got {prior!r}")
    k = num_blocks or params.get(counts[prior]) or \
        inspect.signature(PRIORS[prior]).parameters[counts[prior]].default   # the graphon's default
    with torch.no_grad():
        sigma = match(model.link_probs().detach().cpu(), prior_matrix(prior, u, **params))
    return block_assignment(u, k)[sigma]


def block_sparse(model: nn.Module, block_size: int, groups: Tensor | None = None) -> nn.Module:
    """An inference copy of an edge-eliminated NAC whose propagators compute only the
    attention blocks that hold a kept edge (NAC App. F; the "sparse kernels" the paper
    leaves to future work).

    The processor modules are reordered so that kept edges form blocks: by ``groups``
    (e.g. :func:`prior_groups`: the matched planted-partition clusters), else by reverse
    Cuthill-McKee on the edge mask. The permutation does not change the function (read-in
    and propagators are equivariant in the modules, the read-out sums over them); the
    eval-mode kernel is computed once and pre-gathered into the kept blocks. The copy is
    for inference only (its forward in train mode raises) and keeps its precomputed bias
    on the device ``model`` is on (make it there); ``model`` is untouched.
    """
    from ..nn.block_sparse import BlockSparseBias, BlockSparseKernel, block_order, order_by_groups

    if get_edge_mask(model) is None:
        raise UserError("block_sparse needs an edge-eliminated NAC (see eliminate_edges)")
    if model.kernel.eval_mode == "sample":
        raise UserError("block_sparse needs a deterministic eval kernel (kernel.eval_mode 'expected' or "
                        "'threshold'), got 'sample'")
    order = order_by_groups(groups) if groups is not None else block_order(get_edge_mask(model).cpu())
    new = keep_modules(model, order).eval()
    with torch.inference_mode(False), torch.no_grad():
        s, masked = new.generator.processors.signatures, new.propagator_kernel
        bias, key_mask = masked(s, s, 1)
        pattern = BlockSparseBias.from_dense(bias, masked.edge_mask, block_size, key_mask=key_mask)
        new.propagator_kernel = BlockSparseKernel(masked, pattern)
    return new.eval()
