# The kernel tests and the benchmark import tests/kernel/spec_decode_ref.py by its bare name
# (its directory is on sys.path); as for spec_decode_worker.pyi, this stub gives mypy that name.
from kernel.spec_decode_ref import *  # noqa: F403 - the re-export is the point
