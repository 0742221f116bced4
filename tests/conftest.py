import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/reference/, toy_task.py, toy_cli.py, hermetic.py

# the hermetic run (tests/hermetic.py): default data roots empty, machine datasets refused, nothing left behind
from hermetic import pytest_configure, pytest_runtest_makereport, pytest_sessionfinish  # noqa: E402,F401

torch.set_num_threads(min(2, torch.get_num_threads()))
