#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang, ASan and UBSan into
# build-fuzz/ and runs each for a bounded time from its committed corpus and the
# inputs kept from earlier crashes. A crash (or a leak, a timeout, a memory blow-up
# past the limits) fails the run; its input is copied to
# tests/fuzz/regressions/<target>/, where the normal test suite replays it from
# then on -- commit it with the fix.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
bash scripts/setup.sh --fuzz
targets=(net_connection net_hello store_native store_torch rpc_payload)
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
if [[ ! -f build-fuzz/build.ninja ]]; then
  CXX="ccache clang++" meson setup build-fuzz -Dfuzzing=enabled -Db_sanitize=address,undefined \
    -Db_lundef=false -Doptimization=1 -Ddebug=false -Dcpp_args=-g1 -Dtests=disabled -Dbenchmarks=disabled \
    -Dexamples=disabled >/dev/null
fi
# The fuzz targets alone (and the layers they link), not the whole library.
ninja -C build-fuzz "${targets[@]/#/tests/fuzz/fuzz_}" >/dev/null || ninja -C build-fuzz "${targets[@]/#/tests/fuzz/fuzz_}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
failed=()
for t in "${targets[@]}"; do
  work=$(mktemp -d)            # the run's corpus grows here; the committed one stays as it is
  artifacts=$(mktemp -d)
  cp -r "tests/fuzz/corpus/$t/." "$work/"
  echo "fuzz: $t for ${secs}s"
  if ! build-fuzz/tests/fuzz/fuzz_$t -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
       -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$artifacts/" \
       "$work" "tests/fuzz/regressions/$t" >"$artifacts/log" 2>&1; then
    tail -n 60 "$artifacts/log"
    for f in "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*; do
      [[ -e "$f" ]] && cp "$f" "tests/fuzz/regressions/$t/" && echo "fuzz: $t: kept $(basename "$f") in tests/fuzz/regressions/$t/"
    done
    failed+=("$t")
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$artifacts/log" | sed "s/^/fuzz: $t: /"
  fi
  rm -rf "$work"
done
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all targets ran ${secs}s without a finding"
