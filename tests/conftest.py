import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/reference/, toy_task.py, toy_cli.py, hermetic.py

# the hermetic run (tests/hermetic.py): default data roots empty, machine datasets refused, nothing left behind
from hermetic import pytest_configure, pytest_runtest_makereport, pytest_sessionfinish  # noqa: E402,F401

torch.set_num_threads(min(2, torch.get_num_threads()))

# data.num_workers defaults to "auto" (DataLoader processes sized to the machine). The suite's runs are a
# few steps long, where starting loader processes costs more than it saves and 2-CPU machines
# oversubscribe: "auto" resolves to 0 here. tests/training/test_loader_defaults.py restores it (the
# `machine_auto_workers` fixture) to check that a run with workers equals one without, bit for bit.
import modwire.training.config as _training_config  # noqa: E402

_training_config.MAX_AUTO_WORKERS = 0
