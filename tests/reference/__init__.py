"""Slow, literal re-statements of the papers' equations (one module, one pair at a time),
written independently of the library's vectorised code; tests compare the library against
them. ``tests/`` is on ``sys.path`` (see ``tests/conftest.py``): ``from reference.nac import …``."""
