"""The fine-tuning protocol of models whose task-specific output is a read-out with one linear
head (NAC and Perceiver IO): :meth:`parameter_sets` and :meth:`new_task`.

Every :class:`~modwire.models.base.PretrainedModel` that ``modwire finetune`` adapts offers

- ``parameter_sets() -> {name: parameter-name prefixes}``: the subsets a fine-tuning run may
  train by name (``finetune.train``; everything else is frozen), always with ``"all"`` (prefix
  ``""``);
- ``new_task(num_classes, heads=1)``: replace the task-specific output parameters with freshly
  initialised ones for a task with ``num_classes`` outputs per head, and update ``config`` so
  that ``save_pretrained`` / ``from_pretrained`` round-trip.

For NAC and Perceiver IO the task-specific part is the read-out's final linear head
(``ReadOut.head``: ``logits = head(Σ_o conf_o · y_o)``, NAC §2.1): NAC Fig. 4 adapts an
ImageNet-pretrained NAC and Perceiver IO to 8-way CUB / CIFAR, which needs a new 8-class head.
(ViT and Neural Interpreters implement the same two methods in ``models/set_model.py``, with
their CLS tokens and heads as the task-specific part, NI §4.1-4.2.)
"""
from __future__ import annotations

from typing import ClassVar

from .config import check_single_head
from ..errors import UserError


class ReadOutHeadFineTuning:
    """Mixin for a model with ``read_out`` (a :class:`~modwire.nn.ReadOut`) and a ``config``
    with ``num_classes``. ``readout_design``: the prefixes of the parameters that design the
    output modules / queries outside ``read_out`` (they belong to the ``"readout"`` set)."""

    readout_design: ClassVar[tuple[str, ...]] = ()

    def parameter_sets(self) -> dict[str, tuple[str, ...]]:
        """``"head"``: the read-out's final linear head; ``"readout"``: the whole read-out
        (output modules or queries, their attention and FFN, the confidences, the head);
        ``"all"``: every parameter."""
        return {"head": ("read_out.head.",), "readout": (*self.readout_design, "read_out."), "all": ("",)}

    def new_task(self, num_classes: int, heads: int = 1) -> None:
        """A freshly initialised head ``Linear(d_model, num_classes)`` (PyTorch's default
        ``nn.Linear`` initialisation, as when the model was built), on the model's device and dtype
        (:meth:`~modwire.models.classifier_api.Classifier.replace_classifier`); ``config.num_classes``
        follows. Only one head: these models read one prediction per sample (use a ViT or Neural
        Interpreter for tasks with several heads)."""
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise UserError(f"new_task: num_classes must be a positive int, got {num_classes!r}")
        check_single_head(heads, self.config.model_type)
        self.replace_classifier(num_classes)
