#!/usr/bin/env bash
# The clean runtime for `make test-consumer`: a venv with requirements/consumer.txt only
# (onnxruntime + tokenizers, none of ortft's stack), outside the clone and keyed on that
# file's hash, so a second run reuses it; its wheels are kept in a store beside setup.sh's
# wheelhouse, so a rebuilt venv downloads nothing. Prints the venv's python on stdout.
set -euo pipefail

PYTHON="${PYTHON:-python3.11}"
cd "$(dirname "$0")/.."
reqs=requirements/consumer.txt
cache="${ORTFT_CACHE:-$HOME/.cache/ortft}"
hash=$(sha256sum "$reqs" | cut -c1-16)
wheels="$cache/consumer-wheels"
venv="$cache/consumer-venv-$hash"

# one builder at a time: make test-consumer's two pytest workers may both ask for it first
mkdir -p "$cache"
exec 9>"$cache/consumer-env.lock"
flock 9

if [ ! -f "$venv/.complete" ]; then
  if [ ! -f "$wheels/.complete-$hash" ]; then
    echo "==> downloading the consumer wheels into $wheels (first time: ~40 MB)" >&2
    mkdir -p "$wheels"
    "$PYTHON" -m pip --disable-pip-version-check download --quiet --no-deps -d "$wheels" -r "$reqs" >&2
    touch "$wheels/.complete-$hash"
  fi
  echo "==> creating the consumer venv $venv" >&2
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv" >&2
  "$venv/bin/python" -m pip --disable-pip-version-check install --quiet --no-index --no-deps \
    --find-links "$wheels" -r "$reqs" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
