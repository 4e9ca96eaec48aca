#!/usr/bin/env bash
# Configures (once) and builds corodist into a build directory.
# Usage: scripts/build.sh [BUILD_DIR] [extra meson setup options...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
if command -v ccache >/dev/null; then export CXX=${CXX:-"ccache g++"}; fi
if [[ ! -f "$dir/build.ninja" ]]; then
  # The tests are off in a plain `meson setup` (an install builds no tests): on here.
  [[ " $* " == *" -Dtests="* ]] || set -- -Dtests=enabled "$@"
  meson setup "$dir" "$@" >/dev/null
fi
ninja -C "$dir" >/dev/null || ninja -C "$dir"
