#!/usr/bin/env bash
# `make gpu-check`: on a machine with an NVIDIA GPU, verify the GPU path and bring back numbers
# (benchmarks/gpu_check.py says what it runs; results in benchmarks/results/gpu-check-*.json).
# Refuses with exit 2 and one line where nvidia-smi lists no GPU: nothing here can be checked
# without one. Arguments go to benchmarks/gpu_check.py (--steps, --repeats, --timeout, --out).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L lists none); run it on a machine with one" >&2
  exit 2
fi
# make setup installs the GPU profile by itself where nvidia-smi lists a GPU; GPU=1 says so.
GPU=1 scripts/setup.sh
exec "$VENV/bin/python" benchmarks/gpu_check.py "$@"
