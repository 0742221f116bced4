"""Load an ``experiments/<name>.py`` script as a module (they are scripts, not a package)."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """``experiments/<name>.py`` imported as module ``name`` (registered in ``sys.modules``, which
    spawned worker processes need to unpickle its jobs)."""
    path = ROOT / "experiments" / f"{name}.py"
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path:
        return loaded          # one module per script: a second copy's functions would not pickle as the first's
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
