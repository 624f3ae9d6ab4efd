#!/usr/bin/env bash
# The test suite. Without arguments: the default suite (everything but `slow`; gpu/network tests skip with a
# reason). Arguments go to pytest instead, e.g. ./test.sh -m slow, ./test.sh tests/unit, ./test.sh -m "" (all).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
scripts/ensure_venv.sh
if [ "$#" -eq 0 ]; then
  set -- -m "not slow"
fi
exec .venv/bin/python -m pytest "$@"
