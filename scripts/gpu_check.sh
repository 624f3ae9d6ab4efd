#!/usr/bin/env bash
# The project's GPU check (issue 34; bench/gpu_check.py says what it runs and what it writes):
#
#   scripts/gpu_check.sh [--out DIR] [--work DIR] [--deadline S] [...]   on a machine with one CUDA GPU
#   scripts/gpu_check.sh --cpu [...]                                     the dry run of the same shape on CPU
#
# Which Python: the project's .venv when it exists and (without --cpu) its torch sees a GPU (after ./test.sh's
# setup with a CUDA torch); else, when .whl/ holds the project's wheels (a bare GPU node: docs/real-checkpoints.md, "The GPU check", says how to make it),
# they are installed into /tmp/site over the machine's own torch and PYTHONPATH=/tmp/site:$PWD; else python3 as
# it is. The whole log is teed into <out>/gpu_check.log (--out, default $OUT, else outputs/gpu_check), so a check
# cut short still leaves it; the figures are in <out>/gpu_check.json. Exit status: the driver's (0 = all passed).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cpu=0
out="${OUT:-outputs/gpu_check}"
prev=""
for a in "$@"; do
  [ "$a" = "--cpu" ] && cpu=1
  [ "$prev" = "--out" ] && out="$a"
  case "$a" in --out=*) out="${a#--out=}" ;; esac
  prev="$a"
done
mkdir -p "$out"
log="$out/gpu_check.log"
: > "$log"
say() { echo "[gpu_check.sh] $*" | tee -a "$log" >&2; }

py=""
if [ -x .venv/bin/python ]; then
  if [ "$cpu" = 1 ] || .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    py=.venv/bin/python
  else
    say ".venv's torch sees no CUDA device; looking for the carried wheels (.whl/) or python3"
  fi
fi
if [ -z "$py" ] && compgen -G ".whl/*.whl" > /dev/null; then
  say "installing the project's wheels from .whl/ into /tmp/site (the machine's own torch stays)"
  if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl 2>&1 | tee -a "$log"; then
    say "pip could not install .whl/*.whl into /tmp/site"
    exit 2
  fi
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  py=python3
fi
if [ -z "$py" ]; then
  py=python3
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1
say "python: $py ($("$py" -c 'import sys; print(sys.version.split()[0])' 2>&1)); log: $log"
"$py" bench/gpu_check.py "$@" 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
