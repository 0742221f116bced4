"""Tasks: built-in generators and loaders of official dataset formats (never downloads)."""
from . import loaders, synthetic  # noqa: F401  (register the tasks)
from .base import InputSpec, TaskInfo, build_dataset, describe_task, get_task, list_tasks, register_task
from .metrics import compute_metrics, r2_score, topk_accuracy

__all__ = ["InputSpec", "TaskInfo", "build_dataset", "compute_metrics", "describe_task", "get_task", "list_tasks", "r2_score",
           "register_task", "topk_accuracy"]
