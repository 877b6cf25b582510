#!/usr/bin/env bash
# `make setup`: create .venv with the pinned stack (requirements/*.txt) and ORTModule's C++
# extensions. Idempotent: pip runs only when a requirements file or pyproject.toml changed
# (a stamp in .venv keyed on their hash); wheels come from a wheelhouse in ~/.cache/ortft
# (keyed on the requirements) once downloaded; the extensions are kept, or restored from
# ~/.cache/ortft, instead of rebuilt. A second run takes seconds.
set -euo pipefail

PYTHON="${PYTHON:-python3.11}"
VENV="${VENV:-.venv}"

cd "$(dirname "$0")/.."

step() { echo "==> $*" >&2; }
fail() {
  echo >&2
  echo "make setup failed: $1" >&2
  echo "what to do: $2" >&2
  exit 1
}

# 1. A Python with an ORT training wheel (Linux x86_64 only): 3.11 (onnxruntime-training
#    1.19.2) or 3.12 (onnxruntime-training-cpu 1.19.2, CPU only; PyPI has no cp312 CUDA build).
#    Each has its own lock; on 3.12 torch-ort is installed without its dependencies, because it
#    declares onnxruntime-training, which would pull the CUDA build over the -cpu one.
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  fail "$PYTHON not found; ortft's pinned stack needs Python 3.11 or 3.12" \
    "install it (Debian/Ubuntu: apt-get install python3.11 python3.11-venv python3.11-dev, or pyenv install 3.11), or point to one: make setup PYTHON=/path/to/python3.11"
fi
version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$version" in
  3.11) LOCK=requirements/lock.txt NODEPS=(requirements/data.txt) ;;
  3.12) LOCK=requirements/lock-py312.txt NODEPS=(requirements/data.txt requirements/torch-ort.txt) ;;
  *) echo "make setup: $PYTHON is Python $version; ortft supports 3.11 and 3.12 (ORT training has wheels for those only): make setup PYTHON=python3.11" >&2
     exit 1 ;;
esac
REQS=("$LOCK" requirements/dev.txt "${NODEPS[@]}" pyproject.toml)
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  fail "this is $(uname -s) $(uname -m); onnxruntime-training 1.19.2 has wheels for Linux x86_64 only" \
    "use a Linux x86_64 machine (or container)"
fi

# 2. The virtual environment; recreated when it is broken or of another Python.
if [ -e "$VENV" ] && [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$version" ]; then
  step "$VENV is broken or not Python $version: recreating it"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV with $PYTHON ($("$PYTHON" -c 'import sys; print(sys.executable)'))"
  "$PYTHON" -m venv "$VENV" ||
    fail "could not create $VENV with $PYTHON" \
      "install the venv module (Debian/Ubuntu: apt-get install python$version-venv), then run make setup again"
fi

# 3. The pinned packages, only when the requirements changed. The wheels are kept in a
#    wheelhouse outside the clone (pip's own HTTP cache does not keep them here), marked
#    complete per requirements hash, so a later set-up on this machine, CI included,
#    downloads nothing; a changed pin downloads only what is new.
for f in "${REQS[@]}"; do
  [ -f "$f" ] || fail "$f is missing" "run make setup from a complete checkout of ortft"
done
hash=$(cat "${REQS[@]}" | sha256sum | cut -c1-16)
stamp="$VENV/.ortft-setup-$hash"
lock_hash=$(cat "$LOCK" requirements/dev.txt "${NODEPS[@]}" | sha256sum | cut -c1-16)
wheels="${ORTFT_CACHE:-$HOME/.cache/ortft}/wheels"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
pip_fix="read pip's error above (network, or disk space: ~10 GB with the wheelhouse), then run make setup again"
if [ -f "$stamp" ]; then
  step "packages up to date (requirements hash $hash)"
else
  if [ ! -f "$wheels/.complete-$lock_hash" ]; then
    step "downloading the pinned wheels into $wheels (first time: ~3 GB, a few minutes)"
    mkdir -p "$wheels"
    "${pip[@]}" download -d "$wheels" -r "$LOCK" -r requirements/dev.txt ||
      fail "pip could not download $LOCK + requirements/dev.txt" "$pip_fix"
    for f in "${NODEPS[@]}"; do
      "${pip[@]}" download --no-deps -d "$wheels" -r "$f" ||
        fail "pip could not download $f" "$pip_fix"
    done
    # A pin with no wheel on PyPI (seqeval 1.2.2) arrives as an sdist, which the offline
    # install below could not build: its build backend (setuptools) would come from the index.
    # Build its wheel now, while the index is reachable; pip prefers the wheel offline.
    for sdist in "$wheels"/*.tar.gz "$wheels"/*.zip; do
      [ -e "$sdist" ] || continue
      "${pip[@]}" wheel --no-deps -w "$wheels" "$sdist" ||
        fail "pip could not build a wheel from $sdist" "$pip_fix"
    done
    touch "$wheels/.complete-$lock_hash"
  fi
  offline=(--no-index --find-links "$wheels")
  step "installing the pinned stack from $wheels"
  "${pip[@]}" install "${offline[@]}" -r "$LOCK" -r requirements/dev.txt ||
    fail "pip could not install $LOCK + requirements/dev.txt" \
      "read pip's error above; if the wheelhouse is damaged: rm -rf $wheels, then make setup again"
  step "installing ${NODEPS[*]} (without their dependencies)"
  for f in "${NODEPS[@]}"; do
    "${pip[@]}" install "${offline[@]}" --no-deps -r "$f" ||
      fail "pip could not install $f" "rm -rf $wheels and run make setup again"
  done
  step "installing ortft itself (editable)"
  "${pip[@]}" install "${offline[@]}" --no-deps --no-build-isolation -e . ||
    fail "pip could not install ortft from this folder" "$pip_fix"
  rm -f "$VENV"/.ortft-setup-*
  touch "$stamp"
fi

# 4. ORTModule's C++ extensions: kept, restored from ~/.cache/ortft, or built (~5 min, 2 cores).
step "ORTModule's C++ extensions"
"$VENV/bin/python" -m ortft.tools.extensions >/dev/null ||
  fail "ORTModule's C++ extensions are not in place (the line starting with 'error:' above says why)" \
    "fix that, then run make setup again (or $VENV/bin/ortft doctor --fix)"

step "ready: $VENV (check it with: $VENV/bin/ortft doctor)"
