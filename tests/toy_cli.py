"""``modwire`` CLI with the toy test task registered (for subprocess and torchrun tests)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import toy_task  # noqa: E402,F401

from modwire.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
