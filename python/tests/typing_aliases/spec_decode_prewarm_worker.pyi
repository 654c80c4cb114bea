# Tests import tests/kernel/spec_decode_prewarm_worker.py by its bare name, as
# spec_decode_worker.pyi explains; this stub gives mypy that name.
from kernel.spec_decode_prewarm_worker import *  # noqa: F403 - the re-export is the point
