"""``python -m modwire`` (and ``torchrun ... -m modwire train ...``)."""
import sys

from .cli import main

sys.exit(main())
