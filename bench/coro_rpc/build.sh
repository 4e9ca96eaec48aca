#!/usr/bin/env bash
# Builds bench/coro_rpc/coro_rpc_peer (yalantinglibs' coro_rpc measured as
# corodist-bench's rpc suite measures corodist) against a yalantinglibs source
# tree (header-only; it bundles standalone Asio and async_simple under
# include/ylt/thirdparty). Not part of the Meson build or CI: coro_rpc is not a
# Debian package.
#
# usage: bash bench/coro_rpc/build.sh YLT_DIR [OUT]
#   YLT_DIR  a yalantinglibs checkout or export (0.6.1: YLT_VERSION 601)
#   OUT      the program to write (default: build-coro_rpc/coro_rpc_peer)
# CXX (default g++) and NICE (default "nice -n 15") may be set.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: bash bench/coro_rpc/build.sh YLT_DIR [OUT]" >&2
  exit 2
fi
ylt=$(cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${2:-build-coro_rpc/coro_rpc_peer}
cxx=${CXX:-g++}
nice_cmd=${NICE-nice -n 15}

for need in include/ylt/coro_rpc/coro_rpc_client.hpp include/ylt/version.hpp include/ylt/thirdparty/asio.hpp \
            include/ylt/thirdparty/async_simple; do
  if [[ ! -e "$ylt/$need" ]]; then
    echo "build.sh: $ylt/$need not found: is $ylt a yalantinglibs source tree?" >&2
    exit 1
  fi
done
version=$(sed -n 's/^#define YLT_VERSION \([0-9]*\).*/\1/p' "$ylt/include/ylt/version.hpp")
if [[ "$version" != 601 ]]; then
  echo "build.sh: warning: YLT_VERSION is ${version:-unknown}, not 601 (0.6.1)" >&2
fi

mkdir -p "$(dirname "$out")"
# The include directories of ylt's CMake target (cmake/install.cmake); Asio
# on its default reactor (epoll), as ylt's build without YLT_ENABLE_IO_URING.
# -fno-tree-slp-vectorize: what ylt's own CMake adds for GCC release builds
# of its coro_rpc examples ("-ftree-slp-vectorize with coroutine cause link
# error").
start=$(date +%s)
$nice_cmd "$cxx" -O3 -DNDEBUG -std=c++20 -pthread -fno-tree-slp-vectorize \
  -I "$ylt/include" -I "$ylt/include/ylt/thirdparty" -I "$ylt/include/ylt/standalone" \
  "$here/coro_rpc_peer.cpp" -o "$out"
echo "build.sh: built $out (YLT_VERSION $version) in $(( $(date +%s) - start )) s"
