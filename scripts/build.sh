#!/usr/bin/env bash
# Configures (once) and builds corodist into a build directory.
# Usage: scripts/build.sh [BUILD_DIR] [extra meson setup options...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Cache hits across checkouts in other directories (a fresh clone, a worktree):
# paths relative to the checkout, and the -g builds' working directory unhashed.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
if command -v ccache >/dev/null; then export CXX=${CXX:-"ccache g++"}; fi
if [[ ! -f "$dir/build.ninja" ]]; then
  # The tests are off in a plain `meson setup` (an install builds no tests): on here.
  [[ " $* " == *" -Dtests="* ]] || set -- -Dtests=enabled "$@"
  # The CUDA plugin (NCCL backend) is off in a plain `meson setup` too (an install
  # builds it only when asked): here, whenever CUDA and NCCL are found.
  [[ " $* " == *" -Dcuda="* ]] || set -- -Dcuda=auto "$@"
  [[ " $* " == *" -Dnccl="* ]] || set -- -Dnccl=auto "$@"
  meson setup "$dir" "$@" >/dev/null
fi
ninja -C "$dir" >/dev/null || ninja -C "$dir"
