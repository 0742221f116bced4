"""Robustness: every class of fault and bad input a user can hit, replayed (issue 9's probe).

``pytest tests/robustness`` runs them; each case asserts a clear error (what was expected, what
was given, the key path / file / line where there is one), never a raw traceback, a silent
wrong result or lost data.

- ``test_train_configs.py``: training-config values (NaN, inf, 0, negatives, choices), YAML
  syntax errors, directories, missing / non-UTF-8 / empty files, ``base:`` cycles, ``--set``.
- ``test_model_configs.py``: model-config fields (declared bounds), ``config.json`` that is a
  list / null / invalid / lacks ``model_type``, ``create_model`` with a non-string name.
- ``test_model_inputs.py``: model inputs (shape, dtype incl. uint8, channels, image size,
  empty batch / token set, ids out of the vocabulary, NaN/inf, numpy arrays and lists,
  conditions of a conditional NAC).
- ``test_inputs.py``: task input descriptions and their mapping onto models.
- ``test_training_faults.py``: the run-directory lock, resume rules, corrupted checkpoints
  (checksums), failed writes (disk full), interrupts during validation, which checkpoint
  ``eval`` scores and its JSON, labels outside the model's classes.
- ``test_demo.py``: the demo's usage errors and its output directory.
- ``test_cli_usage.py``: repeated ``--set`` options, ``--resume`` with ``--overwrite``,
  ``device=cuda`` without a GPU.
- ``test_api_usage.py``: ``train()`` / ``load_config()`` called with the wrong argument types.
- ``test_eval_labels.py``: labels beyond the model's classes at evaluation, float labels.
- ``test_eval_overrides.py``: ``eval`` / ``analyze`` overrides the checkpoint decides, a
  checkpoint without its run's config, an output path that is a file.
- ``test_checkpoint_files.py``: a deleted checksum manifest, weights of another model config.
- ``test_task_params.py``: a ``size`` mapping without the split asked for.
- ``test_eval_task_fit.py``: ``eval --task`` of a task whose inputs the run's model cannot read.

Real dataset files (Tiny-ImageNet ``wnids.txt``, ListOps TSV headers, HTML where binary was
expected, paths tried) are replayed on fixtures in ``tests/tasks/test_real_files.py``; SIGKILL
and SIGTERM resumes in ``tests/training/test_training_processes.py``.
"""
