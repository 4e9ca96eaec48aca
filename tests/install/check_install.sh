#!/usr/bin/env bash
# Installs the build into a temporary DESTDIR and uses it as a separate project
# would: the soname and the files installed, the installed corodist-store run
# without LD_LIBRARY_PATH, tests/install/consumer.cpp built with pkg-config
# exactly as docs/install.md says for a prefix outside the system's paths
# (g++, and clang++ when present) and with CMake's find_package, each run; no
# CUDA library needed by the library or the programs (the CUDA plugin, when
# built, is installed beside the library and found there); a translation unit
# without the library's flags fails with corodist's #error; and before all that,
# the consumer built against the build tree with meson-uninstalled/'s .pc.
# Usage: check_install.sh BUILD_DIR SOURCE_DIR PREFIX LIBDIR BINDIR   (run by `meson test`)
set -euo pipefail
build=$1 src=$2 prefix=$3 libdir=$4 bindir=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step() { echo "== $*"; }
if [[ -n ${CORODIST_SANITIZED:-} ]]; then
  # A sanitized build: the consumers here are built without the sanitizers and
  # get their run-time as the library's dependency, not first in the list of
  # libraries loaded, which AddressSanitizer refuses unless told.
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
fi
fail() { echo "FAIL: $*" >&2; exit 1; }

step "the build tree through meson-uninstalled/corodist-uninstalled.pc, before any install"
# Its flags name the folder the library is built in and the source headers: the
# consumer compiles, links and runs from the build tree (the library found
# through the -L folder of pkg-config's --libs, nothing installed).
uninstalled_libs=$(PKG_CONFIG_PATH=$build/meson-uninstalled pkg-config --libs corodist)
uninstalled_cflags=$(PKG_CONFIG_PATH=$build/meson-uninstalled pkg-config --cflags corodist)
echo "cflags: $uninstalled_cflags"
echo "libs:   $uninstalled_libs"
uninstalled_dir=
for f in $uninstalled_libs; do [[ $f == -L* ]] && uninstalled_dir=${f#-L}; done
[[ -n $uninstalled_dir && -e $uninstalled_dir/libcorodist.so ]] ||
  fail "corodist-uninstalled.pc names no folder that holds libcorodist.so: $uninstalled_libs"
# shellcheck disable=SC2086
g++ -std=c++20 "$src/tests/install/consumer.cpp" $uninstalled_cflags $uninstalled_libs \
  -Wl,-rpath,"$uninstalled_dir" -o "$tmp/consumer-uninstalled" ||
  fail "g++ could not build a program with corodist-uninstalled.pc's flags"
env -u LD_LIBRARY_PATH "$tmp/consumer-uninstalled" || fail "the consumer built against the build tree failed"

step "meson install --destdir"
meson install -C "$build" --no-rebuild --destdir "$tmp/root" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "meson install"; }
root=$tmp/root$prefix
[[ $libdir = /* ]] && lib=$tmp/root$libdir || lib=$root/$libdir
[[ $bindir = /* ]] && bin=$tmp/root$bindir || bin=$root/$bindir
for f in "$lib/libcorodist.so" "$lib/libcorodist.so.0" "$lib/pkgconfig/corodist.pc" \
         "$lib/cmake/corodist/corodistConfig.cmake" "$lib/cmake/corodist/corodistConfigVersion.cmake" \
         "$root/include/corodist/core/config.hpp" "$root/include/corodist/rpc/agent.hpp" \
         "$bin/corodist-store" "$bin/corodist-run"; do
  [[ -e $f ]] || fail "not installed: ${f#$tmp/root}"
done
soname=$(objdump -p "$lib/libcorodist.so.0" | awk '$1 == "SONAME" {print $2}')
[[ $soname == libcorodist.so.0 ]] || fail "soname is '$soname', not libcorodist.so.0"
for t in test_core corodist-bench corodist-test-rank; do
  [[ -z $(find "$tmp/root" -name "$t") ]] || fail "installed a test or benchmark program: $t"
done

step "no CUDA in the library; the CUDA plugin beside it when built"
no_cuda() { # FILE: fails if FILE needs a CUDA library
  local needed
  needed=$(objdump -p "$1" | awk '$1 == "NEEDED" {print $2}')
  ! grep -qE 'libcuda|libnccl' <<<"$needed" || fail "${1#$tmp/root} needs CUDA: $(tr '\n' ' ' <<<"$needed")"
}
no_cuda "$lib/libcorodist.so.0"
plugin=
if [[ -e $build/src/libcorodist-cuda.so ]]; then
  plugin=$lib/libcorodist-cuda.so
  [[ -e $plugin ]] || fail "the CUDA plugin was built but not installed beside the library"
fi

step "installed corodist-store runs without LD_LIBRARY_PATH"
env -u LD_LIBRARY_PATH "$bin/corodist-store" --version
found=$(env -u LD_LIBRARY_PATH ldd "$bin/corodist-store" | awk '$1 == "libcorodist.so.0" {print $3}')
[[ -n $found && $(realpath "$found") == $(realpath "$lib/libcorodist.so.0") ]] ||
  fail "corodist-store does not find the installed libcorodist (it finds '$found')"

step "pkg-config, as docs/install.md says for a prefix outside the system's paths"
export PKG_CONFIG_PATH=$lib/pkgconfig
pc() { pkg-config --define-variable=prefix="$root" "$@" corodist; }
echo "cflags: $(pc --cflags)"
echo "libs:   $(pc --libs)"
[[ $(pc --libs --static | tr ' ' '\n' | sort | uniq -d) == "" ]] || fail "pkg-config repeats flags: $(pc --libs --static)"
compilers=(g++)
command -v clang++-14 >/dev/null && compilers+=(clang++-14)
for cxx in "${compilers[@]}"; do
  # shellcheck disable=SC2046
  "$cxx" -std=c++20 "$src/tests/install/consumer.cpp" $(pc --cflags --libs) -Wl,-rpath,"$(pc --variable=libdir)" \
    -o "$tmp/consumer-$cxx" || fail "$cxx could not build a program with pkg-config's flags"
  env -u LD_LIBRARY_PATH "$tmp/consumer-$cxx" || fail "the $cxx consumer failed"
  no_cuda "$tmp/consumer-$cxx"
done
if [[ -n $plugin ]]; then
  reason=$(env -u LD_LIBRARY_PATH "$tmp/consumer-g++" --nccl)
  echo "$reason"
  [[ $reason != *"could not be loaded"* ]] || fail "the installed CUDA plugin was not found: $reason"
fi

step "a translation unit without the flags fails at compile time, saying what to add"
check_error() {
  local expect=$1; shift
  if g++ -fsyntax-only -Wfatal-errors -I"$root/include" "$@" -x c++ - <<<'#include <corodist/core/event_loop.hpp>' \
       >"$tmp/err.log" 2>&1; then
    fail "compiled without the flags: $*"
  fi
  grep -q -- "$expect" "$tmp/err.log" || { cat "$tmp/err.log"; fail "the error does not say '$expect'"; }
  grep -m1 "#error" "$tmp/err.log"
}
check_error "corodist needs C++20" -std=c++17 $(pc --cflags)
check_error "pkg-config --cflags corodist" -std=c++20
[[ $(pc --cflags) == *ASIO_HAS_IO_URING* ]] &&
  check_error "compile with -DASIO_HAS_IO_URING" -std=c++20 $(pc --cflags | sed 's/-DASIO_HAS_IO_URING//')

if command -v cmake >/dev/null; then
  step "CMake find_package(corodist)"
  cmake -S "$src/tests/install" -B "$tmp/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$root" \
    -DCMAKE_BUILD_TYPE=Release >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "cmake configure"; }
  cmake --build "$tmp/cmake" >"$tmp/cmake-build.log" 2>&1 || { cat "$tmp/cmake-build.log"; fail "cmake build"; }
  "$tmp/cmake/consumer" || fail "the CMake consumer failed"
else
  fail "cmake not found (scripts/setup.sh installs it)"
fi
step "as a Meson subproject: dependency('corodist'), and none of corodist's tests or benchmarks"
mkdir -p "$tmp/parent/subprojects"
ln -s "$src" "$tmp/parent/subprojects/corodist"
cp "$src/tests/install/consumer.cpp" "$tmp/parent/"
cat >"$tmp/parent/meson.build" <<'MESON'
project('parent', 'cpp', default_options: ['cpp_std=c++20'])
exe = executable('consumer', 'consumer.cpp', dependencies: dependency('corodist'))
test('parent', exe)
MESON
env -u PKG_CONFIG_PATH meson setup --force-fallback-for=corodist "$tmp/parent/build" "$tmp/parent" >"$tmp/parent.log" 2>&1 || { cat "$tmp/parent.log"; fail "meson setup of the parent"; }
tests=$(meson introspect --tests "$tmp/parent/build" | python3 -c 'import json,sys; print(" ".join(t["name"] for t in json.load(sys.stdin)))')
[[ $tests == parent ]] || fail "the parent's meson test runs more than its own test: $tests"
targets=$(meson introspect --targets "$tmp/parent/build" | python3 -c 'import json,sys; print(" ".join(t["name"] for t in json.load(sys.stdin)))')
for t in $targets; do
  [[ $t == test_* || $t == corodist-bench || $t == header_check || $t == replay_* ]] &&
    fail "corodist as a subproject configures $t"
done
[[ " $targets " == *" corodist "* ]] || fail "the parent did not build corodist as its subproject: $targets"
echo "targets: $targets"
echo "install check passed"
