#!/usr/bin/env bash
# The test suite. Without arguments: the default suite (everything but `slow`; gpu/network tests skip with a
# reason), on two pytest-xdist workers, each taking whole files (--dist loadfile: a module's fixture is built once).
# Arguments go to pytest instead, as given, e.g. ./test.sh -m slow, ./test.sh tests/unit, ./test.sh -m "" (all);
# add -n 2 --dist loadfile for the workers, --shuffle SEED for a random order (tests/conftest.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
scripts/ensure_venv.sh
if [ "$#" -eq 0 ]; then
  set -- -m "not slow" -n 2 --dist loadfile
fi
exec .venv/bin/python -m pytest "$@"
