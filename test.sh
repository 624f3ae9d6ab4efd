#!/usr/bin/env bash
# The test suite (everything that fits the CI budget on CPU; gpu/network tests skip with a reason).
# Extra arguments go to pytest, e.g. ./test.sh -m "not slow" or ./test.sh tests/unit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
scripts/ensure_venv.sh
exec .venv/bin/python -m pytest "$@"
