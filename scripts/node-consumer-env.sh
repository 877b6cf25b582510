#!/usr/bin/env bash
# The Node consumer of the consumer tier (tests/test_consumer.py, test_transformers_js):
# transformers.js as tests/node/package-lock.json pins it, installed with `npm ci` outside the
# clone and keyed on the lock's hash, so a second run reuses it. Prints its node_modules on stdout.
#
# --ignore-scripts: onnxruntime-node's install script downloads GPU binaries from a host
# outside the npm registry; its CPU binary ships in the package (bin/napi-v6/linux/x64), which
# is all the check runs. First time: ~470 MB, ~15 s here (npm's own cache makes a rebuild faster).
set -euo pipefail

cd "$(dirname "$0")/.."
src=tests/node
die() { echo "node-consumer-env: $*" >&2; exit 1; }
command -v node >/dev/null || die "node not found: install Node 20 (or set ORTFT_NO_NODE=1 to skip the check)"
command -v npm >/dev/null || die "npm not found: install Node 20's npm (or set ORTFT_NO_NODE=1 to skip the check)"
cache="${ORTFT_CACHE:-$HOME/.cache/ortft}"
hash=$(sha256sum "$src/package-lock.json" | cut -c1-16)
dir="$cache/node-$hash"

if [ ! -f "$dir/.complete" ]; then
  echo "==> installing transformers.js ($src/package-lock.json) into $dir (first time: ~470 MB)" >&2
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.node-$hash.tmp-XXXXXX")
  chmod 755 "$tmp"  # mktemp makes it 700
  trap 'rm -rf "$tmp"' EXIT
  cp "$src/package.json" "$src/package-lock.json" "$tmp/"
  if ! (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) >"$tmp/npm.log" 2>&1; then
    die "npm ci failed: $(grep -m1 -i 'err' "$tmp/npm.log" || tail -n1 "$tmp/npm.log")"
  fi
  touch "$tmp/.complete"
  rm -rf "$dir"
  # the rename is the commit: a reader sees the whole folder or none; a concurrent installer
  # that renamed first wins (mv -T refuses a non-empty target), and this copy is dropped
  mv -T "$tmp" "$dir" 2>/dev/null || [ -f "$dir/.complete" ] || die "cannot move $tmp to $dir"
fi
echo "$dir/node_modules"
