# The kvarn tests import tests/kvarn/kvarn_ref.py by its bare name: pytest puts its directory on
# sys.path. mypy can't make that directory a package base (its conftest.py would clash with
# tests/conftest.py), so this stub, found through mypy_path, gives the bare name its types.
from kvarn.kvarn_ref import *  # noqa: F403 - the re-export is the point
