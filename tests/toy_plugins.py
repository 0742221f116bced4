"""A user's own augmentation and logger, named by import path in the tests (``toy_plugins:...``)."""
import random

import numpy as np
import torch

CALLS = []            # (image_size, channels) of each factory call


def shift_and_noise(image_size, channels):
    """A factory: a transform drawing from torch's, Python's and NumPy's global RNGs (as
    torchvision's and timm's transforms do)."""
    CALLS.append((tuple(image_size), channels))

    def transform(img):
        shift = random.randint(-2, 2)
        scale = float(np.random.uniform(0.9, 1.1))
        return (torch.roll(img, shift, dims=-1) * scale + 0.05 * torch.randn(img.shape)).clamp(0, 1)
    return transform


def train_and_eval(image_size, channels):
    """A factory returning ``(train, eval)``: both add 1 (a normalisation both sides need)."""
    return (lambda img: img + 1.0), (lambda img: img + 1.0)


def needs_other_arguments(size):
    return lambda img: img


class Flip:
    """A transform object (not a factory): used as it is."""

    def __call__(self, img):
        return img.flip(-1) if torch.rand(()) < 0.5 else img


FLIP = Flip()
NOT_CALLABLE = 3


class ListLogger:
    """A logger factory: keeps every record in ``RECORDS[run_dir]``."""

    RECORDS: dict = {}
    CLOSED: list = []

    def __init__(self, run_dir, config, resume_step):
        self.run_dir, self.resume_step = run_dir, resume_step
        self.RECORDS.setdefault(str(run_dir), [])
        self.model = config.model.name

    def log(self, record):
        self.RECORDS[str(self.run_dir)].append(dict(record))

    def close(self):
        self.CLOSED.append(str(self.run_dir))


def not_a_logger(run_dir, config, resume_step):
    return object()
