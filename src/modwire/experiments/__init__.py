"""The studies: what modwire reproduces of the five papers at CPU scale, one module each.

Each study runs as ``python -m modwire.experiments.NAME [--quick] [--out DIR]`` (or ``modwire
reproduce NAME``, which runs the steps :data:`registry.STUDIES` lists) and writes ``OUT/study.json``
(:mod:`modwire.experiments.common`). :mod:`~modwire.experiments.registry` holds the studies and the
README's paper claims, :mod:`~modwire.experiments.report` turns the committed results into the
README's table (``modwire results``). The studies read their configs from, and by default write their
results into, a clone of the repository (:mod:`modwire.experiments.paths`).

This package sits above training and analysis: it imports them, and only the CLI imports it.
"""
