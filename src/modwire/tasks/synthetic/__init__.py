"""Built-in task generators (no files needed). Each module registers its tasks on import.

Every sample is a pure function of ``(seed, split, index)`` (see ``_common``):

* ``listops`` (:mod:`.listops`): LRA ListOps, token ids, 10 classes.
* ``triangle`` (:mod:`.triangle`): equilateral or not, 64×64 images, 2 classes.
* ``sort_of_clevr`` (:mod:`.sort_of_clevr`): one question about a 75×75 scene per item,
  patch tokens carrying the question, 10 answers.
* ``sort_of_clevr_conditional`` (:mod:`.sort_of_clevr`): the same items for a conditional NAC
  (NAC §4.4, App. G): ``{"x": image tokens, "condition": 3 question ids}``.
* ``fuzzy_boolean`` / ``fuzzy_boolean_adapt`` (:mod:`.fuzzy_boolean`): NI's fuzzy Boolean
  regression, pre-training (functions 0-19) and adaptation (20-29).
* ``digits_multitask_offline`` (:mod:`.digits_offline`): an offline stand-in for NI's digits
  multi-task from scikit-learn's 8×8 digits, ``{"x": [3, 32, 32], "task": dataset id}``, 3 heads.
* ``multi_digit`` (:mod:`.multi_digit`): NFM §4.2's 64×64 images of 1-5 digits, multi-label
  target of the classes present (loss ``bce``).
"""
from . import digits_offline, fuzzy_boolean, listops, multi_digit, sort_of_clevr, triangle  # noqa: F401  (register the tasks)
