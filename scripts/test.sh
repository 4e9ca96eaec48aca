#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test suite.
# Usage: scripts/test.sh            every check under AddressSanitizer + UBSan, in build-asan/ (the suites'
#                                   own code: AddressSanitizer only, tests/meson.build): what CI runs
#        scripts/test.sh --plain    the same checks on a plain -O1 build in build/ (no sanitizers;
#                                   about two thirds of the build time)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --python  # python3-torch: the real peer of the PyTorch compatibility tests
if [[ "${1:-}" == "--plain" ]]; then
  dir=build
  # The tests do not need -O3 (the benchmarks do: scripts/bench.sh builds build/ at -O3):
  # -O1 compiles in about two thirds of the time. Only when build/ is configured here.
  opts=(-Doptimization=1)
else
  # (--sanitize: the same, as this script's option was before it became the default.)
  dir=build-asan
  # -O1 with line tables (-g1): about half the compile time of -O2 -g under the
  # sanitizers, with file:line in every report. UBSan without its null and
  # alignment checks, which are most of its compile time (src/ft/quorum_round.cpp:
  # 34 s of CPU with them, 20 s without, 15 s without UBSan): AddressSanitizer
  # reports a null dereference itself, and the fuzz stage (scripts/fuzz.sh)
  # keeps every UBSan check on the wire parsers.
  opts=(-Doptimization=1 -Ddebug=false "-Dcpp_args=['-g1','-fno-sanitize=null,alignment']"
        -Db_sanitize=address,undefined -Db_lundef=false -Dbenchmarks=disabled)
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  # The randomized fault runs (suite ft_random) and the RRef simulator's
  # schedules, fewer than a plain build's 30 and 10,000 (the sanitizers slow
  # them several times: 5,000 schedules took 47 s here).
  export CORODIST_FT_RUNS=${CORODIST_FT_RUNS:-10}
  export CORODIST_RREF_SEEDS=${CORODIST_RREF_SEEDS:-2000}
fi
bash scripts/build.sh "$dir" "${opts[@]}"
rc=0
meson test -C "$dir" --print-errorlogs || rc=$?
python3 scripts/test_summary.py "$dir/meson-logs/testlog.json" || true
exit $rc
