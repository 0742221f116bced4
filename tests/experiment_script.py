"""Load an ``experiments/<name>.py`` script as a module (they are scripts, not a package)."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """``experiments/<name>.py`` imported as module ``name`` (registered in ``sys.modules``, which
    spawned worker processes need to unpickle its jobs)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
