"""Allow ``python -m qwen3090``."""

import sys

from qwen3090.cli import main

sys.exit(main())
