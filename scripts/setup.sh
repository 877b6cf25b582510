#!/usr/bin/env bash
# `make setup`: create .venv with the pinned stack (requirements/*.txt) and ORTModule's C++
# extensions. Idempotent: pip runs only when a requirements file or pyproject.toml changed
# (a stamp in .venv keyed on their hash); wheels come from a wheelhouse in ~/.cache/ortft
# (keyed on the requirements) once downloaded; the extensions are kept, or restored from
# ~/.cache/ortft, instead of rebuilt. DeepSpeed, an sdist that imports torch in its setup.py, is
# built into a wheel once per wheelhouse, inside .venv after torch is installed. A second run
# takes seconds.
set -euo pipefail

# STACK=ort (the default): torch 2.6 + onnxruntime-training 1.19.2, the last training release;
# STACK=current: today's torch and ONNX Runtime (inference), every route but ORT's (issue 48)
STACK="${STACK:-ort}"
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

# --------------------------------------------------------------------------- the GPU profile
# GPU=1 installs it on any machine (so it can be built and checked without a GPU), GPU=0 never;
# unset: when `nvidia-smi -L` lists a GPU. requirements/gpu-cu11.txt goes to $VENV/cuda11 with
# pip --target (the cu11 and torch's cu12 wheels share folder names: side by side in
# site-packages one would overwrite the other's files), and a .pth in the venv preloads it before
# onnxruntime's first import (ortft/env/cudalibs.py says why; docs/gpu.md the design).
GPU_LOCK=requirements/gpu-cu11.txt

gpu_profile_wanted() {
  case "${GPU:-}" in
    1 | yes | true) return 0 ;;
    0 | no | false) return 1 ;;
    "") command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' ;;
    *) fail "GPU=$GPU is neither 1 nor 0" "make setup GPU=1 (the GPU profile) or GPU=0 (not)" ;;
  esac
}

gpu_profile() {
  [ -f "$GPU_LOCK" ] || fail "$GPU_LOCK is missing" "run make setup from a complete checkout of ortft"
  local gpu_hash dest site
  gpu_hash=$(sha256sum "$GPU_LOCK" | cut -c1-16)
  dest="$VENV/cuda11"
  if [ -f "$dest/.ortft-gpu-$gpu_hash" ]; then
    step "GPU profile: CUDA 11.8 libraries up to date ($dest)"
  else
    if [ ! -f "$wheels/.complete-gpu-$gpu_hash" ]; then
      step "GPU profile: downloading the CUDA 11.8 wheels into $wheels (first time: ~1.4 GB)"
      mkdir -p "$wheels"
      "${pip[@]}" download --no-deps -d "$wheels" -r "$GPU_LOCK" ||
        fail "pip could not download $GPU_LOCK" "$pip_fix"
      touch "$wheels/.complete-gpu-$gpu_hash"
    fi
    step "GPU profile: installing the CUDA 11.8 libraries into $dest (~2.2 GB)"
    rm -rf "$dest"
    "${pip[@]}" install --no-index --find-links "$wheels" --no-deps --target "$dest" -r "$GPU_LOCK" ||
      fail "pip could not install $GPU_LOCK into $dest" \
        "read pip's error above; if the wheelhouse is damaged: rm -rf $wheels, then make setup GPU=1 again"
    touch "$dest/.ortft-gpu-$gpu_hash"
  fi
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import ortft.env.cudalibs; ortft.env.cudalibs.install_hook()" >"$site/ortft-cuda11.pth"
  # -c, not -m: the .pth has imported ortft.env.cudalibs already, and runpy warns about that
  "$VENV/bin/python" -c 'import sys, ortft.env.cudalibs as c; sys.exit(c.main([]))' >&2 ||
    fail "ORT's CUDA provider still has unresolved libraries (the line above names them)" \
      "rm -rf $dest, then make setup GPU=1 again"
}

want_gpu=0
if gpu_profile_wanted; then want_gpu=1; fi # before anything is installed: GPU=maybe fails now

# 1. The stack's Python and machine. ort: a Python with an ORT training wheel (Linux x86_64
#    only): 3.11 (onnxruntime-training 1.19.2) or 3.12 (onnxruntime-training-cpu 1.19.2, CPU
#    only; PyPI has no cp312 CUDA build). Each has its own lock; on 3.12 torch-ort is installed
#    without its dependencies, because it declares onnxruntime-training, which would pull the
#    CUDA build over the -cpu one. current: one lock for 3.11 to 3.13, Linux x86_64 or aarch64.
case "$STACK" in
  ort | current) ;;
  *) fail "STACK=$STACK is neither ort nor current" \
       "make setup (the ort profile) or make setup STACK=current (today's torch, no ORT training)" ;;
esac
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  fail "$PYTHON not found; ortft's $STACK stack needs Python 3.11$([ "$STACK" = current ] && echo " to 3.13" || echo " or 3.12")" \
    "install it (Debian/Ubuntu: apt-get install python3.11 python3.11-venv python3.11-dev, or pyenv install 3.11), or point to one: make setup PYTHON=/path/to/python3.11"
fi
version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
machine="$(uname -s)-$(uname -m)"
if [ "$STACK" = current ]; then
  case "$version" in
    3.11 | 3.12 | 3.13) LOCK=requirements/lock-current.txt NODEPS=(requirements/data.txt) ;;
    *) echo "make setup: $PYTHON is Python $version; the current profile supports 3.11 to 3.13: make setup STACK=current PYTHON=python3.13" >&2
       exit 1 ;;
  esac
  case "$machine" in
    Linux-x86_64 | Linux-aarch64) ;;
    *) fail "this is $(uname -s) $(uname -m); the current profile supports Linux x86_64 and aarch64" \
         "use a Linux machine (or container)" ;;
  esac
else
  case "$version" in
    3.11) LOCK=requirements/lock.txt NODEPS=(requirements/data.txt) ;;
    3.12) LOCK=requirements/lock-py312.txt NODEPS=(requirements/data.txt requirements/torch-ort.txt) ;;
    *) echo "make setup: $PYTHON is Python $version; the ort profile supports 3.11 and 3.12 (ORT training has wheels for those only): make setup PYTHON=python3.11, or make setup STACK=current PYTHON=python$version (no ORT training)" >&2
       exit 1 ;;
  esac
  if [ "$machine" != "Linux-x86_64" ]; then
    fail "this is $(uname -s) $(uname -m); onnxruntime-training 1.19.2 has wheels for Linux x86_64 only" \
      "use a Linux x86_64 machine (or container), or make setup STACK=current (no ORT training)"
  fi
fi
REQS=("$LOCK" requirements/dev.txt "${NODEPS[@]}" requirements/deepspeed.txt pyproject.toml)
if [ "$want_gpu" = 1 ] && [ "$STACK" = current ]; then
  case "${GPU:-}" in
    "") want_gpu=0 ;;  # the CUDA 11.8 libraries serve ORT training's CUDA provider only
    *) fail "GPU=$GPU: the GPU profile (CUDA 11.8 libraries for ORT training's CUDA provider) is the ort profile's" \
         "make setup GPU=$GPU (the ort profile), or make setup STACK=current without GPU=" ;;
  esac
fi
if [ "$want_gpu" = 1 ] && [ "$version" != 3.11 ]; then
  case "${GPU:-}" in
    "") step "a GPU is visible, but Python $version has only ORT training's CPU build: no GPU profile (make setup PYTHON=python3.11 for it)"
        want_gpu=0 ;;
    *) fail "GPU=$GPU: the GPU profile needs Python 3.11 (ORT training's CUDA build has no wheel for $version)" \
         "make setup PYTHON=python3.11 GPU=1" ;;
  esac
fi

# 2. The virtual environment; recreated when it is broken, of another Python or of the other
#    stack (onnxruntime and onnxruntime-training install the same onnxruntime/ folder: one
#    venv never holds both). A venv from before STACK has no mark: it is the ort stack's.
if [ -e "$VENV" ] && [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$version" ]; then
  step "$VENV is broken or not Python $version: recreating it"
  rm -rf "$VENV"
fi
if [ -e "$VENV" ] && [ "$(cat "$VENV/.ortft-stack" 2>/dev/null || echo ort)" != "$STACK" ]; then
  step "$VENV holds the other stack: recreating it for STACK=$STACK"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV with $PYTHON ($("$PYTHON" -c 'import sys; print(sys.executable)'))"
  "$PYTHON" -m venv "$VENV" ||
    fail "could not create $VENV with $PYTHON" \
      "install the venv module (Debian/Ubuntu: apt-get install python$version-venv), then run make setup again"
  echo "$STACK" >"$VENV/.ortft-stack"
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
lock_hash=$(cat "$LOCK" requirements/dev.txt "${NODEPS[@]}" requirements/deepspeed.txt | sha256sum | cut -c1-16)
wheels="${ORTFT_CACHE:-$HOME/.cache/ortft}/wheels"
# DeepSpeed's sdist and the wheel built from it, apart from the wheelhouse's other sdists (the
# loop below would build it with build isolation, where torch is missing); keyed like the
# wheelhouse, since the wheel records the torch it was built against
ds_dir="$wheels/deepspeed-$lock_hash"
ds_version=$(sed -n 's/^deepspeed==//p' requirements/deepspeed.txt)
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
pip_fix="read pip's error above (network, or disk space: ~10 GB with the wheelhouse), then run make setup again"
if [ -f "$stamp" ]; then
  step "packages up to date (requirements hash $hash)"
else
  if [ ! -f "$wheels/.complete-$lock_hash" ]; then
    step "downloading the pinned wheels into $wheels (first time: a few minutes; the ort stack ~3 GB)"
    mkdir -p "$wheels"
    # what an sdist's build may fetch (requirements/build-constraints.txt says why)
    export PIP_CONSTRAINT="$PWD/requirements/build-constraints.txt"
    "${pip[@]}" download -d "$wheels" -r "$LOCK" -r requirements/dev.txt ||
      fail "pip could not download $LOCK + requirements/dev.txt" "$pip_fix"
    for f in "${NODEPS[@]}"; do
      "${pip[@]}" download --no-deps -d "$wheels" -r "$f" ||
        fail "pip could not download $f" "$pip_fix"
    done
    # every lock keeps its own DeepSpeed folder (a few MB): the two stacks share this
    # wheelhouse, and pruning the others' would leave the ort stack's set-up without its sdist
    "${pip[@]}" download --no-deps -d "$ds_dir" -r requirements/deepspeed.txt ||
      fail "pip could not download requirements/deepspeed.txt" "$pip_fix"
    # A pin with no wheel on PyPI (seqeval 1.2.2) arrives as an sdist, which the offline
    # install below could not build: its build backend (setuptools) would come from the index.
    # Build its wheel now, while the index is reachable; pip prefers the wheel offline.
    for sdist in "$wheels"/*.tar.gz "$wheels"/*.zip; do
      [ -e "$sdist" ] || continue
      "${pip[@]}" wheel --no-deps -w "$wheels" "$sdist" ||
        fail "pip could not build a wheel from $sdist" "$pip_fix"
    done
    unset PIP_CONSTRAINT
    touch "$wheels/.complete-$lock_hash"
  fi
  offline=(--no-index --find-links "$wheels")
  step "installing the pinned stack from $wheels"
  "${pip[@]}" install "${offline[@]}" -r "$LOCK" -r requirements/dev.txt ||
    fail "pip could not install $LOCK + requirements/dev.txt" \
      "read pip's error above; if the wheelhouse is damaged: rm -rf $wheels, then make setup again"
  # 3b. DeepSpeed's wheel, built once per wheelhouse (~20 s on 2 cores): no build isolation (its
  #     setup.py imports the torch just installed), no ops compiled (DS_BUILD_OPS=0: a CPU
  #     machine has no CUDA toolkit; on a GPU DeepSpeed compiles the ops it uses when first used).
  #     DS_ACCELERATOR=cpu makes the wheel the same on every machine: built where a GPU is
  #     visible, its metadata would add nvidia-ml-py, which is not pinned (DeepSpeed's CUDA
  #     accelerator imports it only if present); the accelerator is chosen again at run time.
  if [ ! -f "$ds_dir/deepspeed-$ds_version-py3-none-any.whl" ] && [ ! -f "$ds_dir/deepspeed-$ds_version.tar.gz" ]; then
    # a wheelhouse whose DeepSpeed folder an older set-up pruned (it pruned every lock's)
    step "downloading DeepSpeed $ds_version's sdist into $ds_dir again"
    "${pip[@]}" download --no-deps -d "$ds_dir" -r requirements/deepspeed.txt ||
      fail "pip could not download requirements/deepspeed.txt" "$pip_fix"
  fi
  if [ ! -f "$ds_dir/deepspeed-$ds_version-py3-none-any.whl" ]; then
    step "building DeepSpeed $ds_version's wheel into $ds_dir (no ops compiled)"
    DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "${pip[@]}" wheel --no-deps --no-build-isolation --no-index -w "$ds_dir" \
      "$ds_dir/deepspeed-$ds_version.tar.gz" ||
      fail "pip could not build DeepSpeed's wheel from $ds_dir/deepspeed-$ds_version.tar.gz" \
        "read pip's error above; if the sdist is missing or damaged: rm -rf $wheels, then make setup again"
  fi
  step "installing DeepSpeed $ds_version (requirements/deepspeed.txt)"
  "${pip[@]}" install "${offline[@]}" --find-links "$ds_dir" -r requirements/deepspeed.txt ||
    fail "pip could not install requirements/deepspeed.txt" "rm -rf $wheels and run make setup again"
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

# 4. The GPU profile (CUDA 11.8 libraries for ORT's CUDA provider): see gpu_profile below.
if [ "$want_gpu" = 1 ]; then
  gpu_profile
fi

# 5. ORTModule's C++ extensions (the ort stack): kept, restored from ~/.cache/ortft, or built
#    (~5 min, 2 cores).
if [ "$STACK" = ort ]; then
  step "ORTModule's C++ extensions"
  "$VENV/bin/python" -m ortft.env.extensions >/dev/null ||
    fail "ORTModule's C++ extensions are not in place (the line starting with 'error:' above says why)" \
      "fix that, then run make setup again (or $VENV/bin/ortft doctor --fix)"
fi

step "ready: $VENV, the $STACK stack (check it with: $VENV/bin/ortft doctor)"
