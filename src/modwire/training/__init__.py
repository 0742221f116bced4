"""Training: typed config, optimizer and schedule, atomic checkpoints, the loop, torchrun support."""
from .config import TrainConfig, load_config
from .trainer import build_model_for_task, evaluate, train

__all__ = ["TrainConfig", "build_model_for_task", "evaluate", "load_config", "train"]
