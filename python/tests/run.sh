#!/usr/bin/env bash
# Runs the rmmd package's tests (python/tests) with a Python that has pytest
# and numpy: $RMMD_PYTHON, else the checkout's .venv-py (scripts/setup.sh
# makes it). ctest runs this as the test python.pytest, with RMMD_LIBRARY,
# RMMD_DAEMON and RMMD_RMMCTL naming the build's files; exit status 77 (a
# skip, for ctest) where that Python is missing. Arguments go to pytest.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${RMMD_PYTHON:-$root/.venv-py/bin/python}
if ! "$py" -c 'import pytest, numpy' 2>/dev/null; then
  echo "python tests: skipped: $py cannot import pytest and numpy (scripts/setup.sh makes .venv-py)"
  exit 77
fi
exec "$py" -m pytest -p no:cacheprovider -q -rs "$here" "$@"
