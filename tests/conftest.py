import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/reference/, toy_task.py, toy_cli.py
torch.set_num_threads(min(2, torch.get_num_threads()))
