#!/usr/bin/env bash
# The GPU path in one command, on a machine with CUDA, NCCL and a GPU:
#
#   bash scripts/gpu_check.sh
#
# Runs from a clean checkout with this repository alone; installs nothing. It
# uses Meson, ninja, the CUDA toolkit and NCCL in /usr/local/cuda (CUDA_HOME
# elsewhere), and PyTorch in /usr/bin/python3 when it has CUDA. It builds
# corodist with CUDA and NCCL into build-gpu (release; only the targets the
# checks need), then runs the checks, each ending with one line
# `check N <name>: passed|failed|skipped (<why>)`, and prints `N passed, N failed`:
#   1 nccl         test_collective --run_test=nccl,cuda_stream (NCCL collectives
#                  at every world size the GPUs allow, abort, deadlines, shrink;
#                  send/recv and batches, all_to_all_single/all_to_all, gather,
#                  scatter, reduce, allgatherv, monitored_barrier, split: the
#                  cases of two ranks or more need 2 GPUs; streams)
#   2 reducer      test_ddp --run_test=reducer_cuda and test_collective
#                  --run_test=gloo_cuda (the CUDA reducer on NCCL and on the staged Gloo group)
#   3 ddp-torch    tests/gpu/ddp_equivalence.py: the reducer vs a replay and vs
#                  PyTorch DDP on CUDA (skipped when PyTorch has no CUDA)
#   4 bench        corodist-bench --suite gpu --json build-gpu/gpu_check/gpu.jsonl:
#                  NCCL allreduce busbw, split (ncclCommSplit) time, the reducer;
#                  with 2 GPUs or more also send/recv latency and bandwidth and
#                  all_to_all_single busbw (their rows must be there)
# Logs go to build-gpu/gpu_check/. GPU_CHECK_NO_BUILD=1 runs the checks on the
# targets already in the build directory (built on another machine and copied
# here, their libraries on LD_LIBRARY_PATH); GPU_CHECK_TIMEOUT bounds each check
# (600 s unless set); GPU_CHECK_PYTHON names the Python with PyTorch for check 3.
# Exit 0 when every check passed or was
# skipped for a stated reason with at least one passing, 1 when any failed, 2
# when no GPU is visible (nothing could be proven; the build still runs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${GPU_CHECK_BUILD_DIR:-build-gpu} # another directory: for trying the script out
logs=$build/gpu_check
cuda_home=${CUDA_HOME:-/usr/local/cuda}
export PATH="$cuda_home/bin:$PATH" CUDA_PATH="${CUDA_PATH:-$cuda_home}"
py=${GPU_CHECK_PYTHON:-/usr/bin/python3}
[[ -x $py ]] || py=$(command -v python3 || echo python3)
limit=${GPU_CHECK_TIMEOUT:-600}
jobs=$(nproc 2>/dev/null || echo 4)
start=$(date +%s)

# ---- what this machine has ---------------------------------------------------
echo "== gpu_check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $jobs cores"
gpu_problem=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  gpu_problem="nvidia-smi not found (no NVIDIA driver here)"
elif ! gpus=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$gpus"; then
  gpu_problem="nvidia-smi lists no GPU: $(head -n 1 <<<"$gpus")"
else
  echo "$gpus"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
  echo "driver CUDA version: $(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)"
fi
if command -v nvcc >/dev/null 2>&1; then
  echo "CUDA toolkit: $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') ($(command -v nvcc))"
else
  echo "CUDA toolkit: nvcc not found in $cuda_home/bin"
fi
nccl_h=""
for h in "$cuda_home/include/nccl.h" /usr/include/nccl.h; do [[ -f $h ]] && { nccl_h=$h; break; }; done
if [[ -n $nccl_h ]]; then
  echo "NCCL: $(awk '/define NCCL_MAJOR/{a=$3} /define NCCL_MINOR/{b=$3} /define NCCL_PATCH/{c=$3} END{print a"."b"."c}' "$nccl_h") ($nccl_h)"
else
  echo "NCCL: nccl.h not found"
fi
if torch_line=$("$py" -c 'import torch; print(torch.__version__, "CUDA" if torch.cuda.is_available() else "no CUDA", torch.version.cuda or "")' 2>/dev/null); then
  echo "PyTorch ($py): $torch_line"
else
  echo "PyTorch ($py): not installed"
fi
[[ -n $gpu_problem ]] && echo "NO GPU: $gpu_problem"

# ---- build -------------------------------------------------------------------
echo "== build ($build: -Dcuda=enabled -Dnccl=enabled -Dtests=enabled -Dbenchmarks=enabled, release)"
mkdir -p "$logs"
# Nothing from the network: a dependency missing here fails the setup, saying which.
opts=(--wrap-mode=nodownload -Dbuildtype=release -Dcuda=enabled -Dnccl=enabled -Dbenchmarks=enabled)
# Boost.Test runs checks 1 and 2; without it the rest is still built and run.
tests_missing=""
if [[ -f /usr/include/boost/test/unit_test.hpp ]] || [[ -n $(ls /usr/lib/*/libboost_unit_test_framework.so 2>/dev/null) ]]; then
  opts+=(-Dtests=enabled)
else
  tests_missing="Boost.Test is missing here (Debian: libboost-test-dev)"
  opts+=(-Dtests=auto)
  echo "NOTE: $tests_missing: checks 1 and 2 cannot be built"
fi
if [[ -f $build/build.ninja ]]; then
  setup=(meson setup --reconfigure "$build" "${opts[@]}")
else
  setup=(meson setup "$build" "${opts[@]}")
fi
built=1
if [[ ${GPU_CHECK_NO_BUILD:-0} == 1 ]]; then
  echo "not building (GPU_CHECK_NO_BUILD=1): using what $build holds"
  tests_missing=""
  for t in bench/corodist-bench src/libcorodist-cuda.so tests/test_collective tests/test_ddp; do
    [[ -e $build/$t ]] || { echo "missing: $build/$t"; built=0; }
  done
elif ! "${setup[@]}" >"$logs/setup.log" 2>&1; then
  echo "meson setup failed (the end of $logs/setup.log):"
  tail -n 25 "$logs/setup.log"
  built=0
else
  targets=(bench/corodist-bench src/libcorodist-cuda.so)
  [[ -z $tests_missing ]] && targets+=(tests/test_collective tests/test_ddp)
  if ninja -C "$build" -t targets all 2>/dev/null | grep -q '^tests/gpu/corodist-gpu-ddp-check:'; then
    targets+=(tests/gpu/corodist-gpu-ddp-check)
  fi
  if ! ninja -C "$build" -j "$jobs" "${targets[@]}" >"$logs/build.log" 2>&1; then
    echo "build failed (the end of $logs/build.log):"
    grep -E 'error|FAILED' "$logs/build.log" | head -n 30
    built=0
  else
    echo "built ${targets[*]} in $(($(date +%s) - start)) s"
  fi
fi

# ---- checks ------------------------------------------------------------------
passed=0 failed=0 skipped=0
result() { # N NAME passed|failed|skipped WHY
  echo "check $1 $2: $3${4:+ ($4)}"
  case $3 in passed) passed=$((passed + 1)) ;; failed) failed=$((failed + 1)) ;; *) skipped=$((skipped + 1)) ;; esac
}

# Runs one Boost.Test command (log: $logs/$1.log); sets bt_status and bt_why.
boost_run() {
  local name=$1
  shift
  local log=$logs/$name.log rc=0
  timeout "$limit" "$@" --log_level=test_suite --report_level=short --color_output=no >"$log" 2>&1 || rc=$?
  local ok skip
  ok=$(sed -n 's/^ *\([0-9]*\) test cases\? out of [0-9]* passed.*/\1/p' "$log" | head -n 1)
  skip=$(sed -n 's/^ *\([0-9]*\) test cases\? out of [0-9]* skipped.*/\1/p' "$log" | head -n 1)
  # "*** No errors detected" (short report of a run where all passed) has no counts.
  if [[ -z $ok ]] && grep -q 'No errors detected' "$log"; then
    ok=$(grep -c 'Leaving test case' "$log")
  fi
  ok=${ok:-0} skip=${skip:-0}
  # Cases skipped because CUDA or NCCL cannot run: a failure on a machine with
  # a GPU (the cases that run without a GPU would pass all the same).
  local no_cuda
  no_cuda=$(grep 'is skipped because precondition failed' "$log" |
    grep -cE 'no CUDA device|CUDA cannot be used|NCCL cannot run here|could not be loaded|built without (CUDA|NCCL)')
  grep 'is skipped because precondition failed' "$log" |
    sed 's/.*Test case "\([^"]*\)" is skipped because precondition failed: \(skipped: \)\{0,1\}/    skipped \1: /' |
    cut -c1-200 | head -n 12
  if [[ $rc -eq 124 ]]; then
    bt_status=failed bt_why="$* timed out after $limit s, see $log"
  elif [[ $rc -ne 0 ]]; then
    grep -E 'error|fatal|failure' "$log" | head -n 15 | sed 's/^/    /'
    bt_status=failed bt_why="exit $rc, see $log"
  elif [[ $no_cuda -gt 0 ]]; then
    bt_status=failed bt_why="a GPU is visible but $no_cuda test cases skipped for want of CUDA/NCCL, see $log"
  elif [[ $ok -eq 0 ]]; then
    bt_status=failed bt_why="no test case ran: $skip skipped, see $log"
  else
    bt_status=passed bt_why="$ok test cases passed, $skip skipped"
  fi
}

no_gpu_why="no GPU visible: $gpu_problem"

echo "== check 1: nccl_group and cuda_stream"
if [[ $built -eq 0 ]]; then
  result 1 nccl failed "the build failed"
elif [[ -n $tests_missing ]]; then
  result 1 nccl failed "$tests_missing"
elif [[ -n $gpu_problem ]]; then
  result 1 nccl skipped "$no_gpu_why"
else
  boost_run check1_nccl "$build/tests/test_collective" --run_test=nccl,cuda_stream
  result 1 nccl "$bt_status" "$bt_why"
fi

echo "== check 2: the CUDA reducer (NCCL, staged Gloo)"
if [[ $built -eq 0 ]]; then
  result 2 reducer failed "the build failed"
elif [[ -n $tests_missing ]]; then
  result 2 reducer failed "$tests_missing"
elif [[ -n $gpu_problem ]]; then
  result 2 reducer skipped "$no_gpu_why"
else
  boost_run check2_reducer "$build/tests/test_ddp" --run_test=reducer_cuda
  s1=$bt_status w1=$bt_why
  boost_run check2_gloo_cuda "$build/tests/test_collective" --run_test=gloo_cuda
  if [[ $s1 == passed && $bt_status == passed ]]; then
    result 2 reducer passed "reducer_cuda: $w1; gloo_cuda: $bt_why"
  else
    result 2 reducer failed "reducer_cuda: $s1, $w1; gloo_cuda: $bt_status, $bt_why"
  fi
fi

echo "== check 3: DDP equivalence with PyTorch"
prog=$build/tests/gpu/corodist-gpu-ddp-check
if [[ $built -eq 0 ]]; then
  result 3 ddp-torch failed "the build failed"
elif [[ -n $gpu_problem ]]; then
  result 3 ddp-torch skipped "$no_gpu_why"
elif [[ ! -x $prog ]]; then
  result 3 ddp-torch failed "$prog was not built (tests/meson.build lacks subdir('gpu'))"
else
  rc=0
  timeout "$limit" "$py" tests/gpu/ddp_equivalence.py "$prog" >"$logs/check3_ddp_torch.log" 2>&1 || rc=$?
  sed 's/^/    /' "$logs/check3_ddp_torch.log"
  if [[ $rc -eq 0 ]]; then
    result 3 ddp-torch passed "nccl world 1 and staged gloo world 2 equal PyTorch DDP within 1e-6"
  elif [[ $rc -eq 77 ]]; then
    result 3 ddp-torch skipped "$(grep '^skipped' "$logs/check3_ddp_torch.log" | tail -n 1 | sed 's/^skipped: *//')"
  else
    result 3 ddp-torch failed "exit $rc, see $logs/check3_ddp_torch.log"
  fi
fi

echo "== check 4: benchmarks (corodist-bench --suite gpu)"
json=$logs/gpu.jsonl
if [[ $built -eq 0 ]]; then
  result 4 bench failed "the build failed"
elif [[ -n $gpu_problem ]]; then
  result 4 bench skipped "$no_gpu_why"
else
  rc=0
  rm -f "$json"
  timeout "$limit" "$build/bench/corodist-bench" --suite gpu --json "$json" >"$logs/check4_bench.txt" 2>"$logs/check4_bench.err" || rc=$?
  cat "$logs/check4_bench.txt"
  records=$(grep -c '"suite":"gpu"' "$json" 2>/dev/null || true)
  if [[ $rc -ne 0 ]]; then
    tail -n 5 "$logs/check4_bench.err" | sed 's/^/    /'
    result 4 bench failed "exit $rc, see $logs/check4_bench.err"
  elif grep -q 'gpu suite skipped' "$logs/check4_bench.txt"; then
    result 4 bench failed "a GPU is visible but $(grep 'gpu suite skipped' "$logs/check4_bench.txt" | sed 's/^# gpu suite //')"
  elif [[ ${records:-0} -eq 0 ]]; then
    result 4 bench failed "no records in $json"
  else
    # The rows each GPU count must give (sendrecv and all_to_all need a GPU per rank, 2 at least).
    gpu_count=$(grep -c '^GPU ' <<<"$gpus")
    want=(allreduce_ split_r reducer_nccl_r1)
    [[ $gpu_count -ge 2 ]] && want+=(sendrecv_pingpong_ sendrecv_oneway_ all_to_all_single_)
    absent=""
    for w in "${want[@]}"; do
      grep -q "\"case\":\"$w" "$json" || absent+=" $w*"
    done
    if [[ -n $absent ]]; then
      result 4 bench failed "no rows$absent in $json ($gpu_count GPUs)"
    else
      result 4 bench passed "${records} JSON records in $json ($gpu_count GPUs)"
    fi
  fi
fi

echo "== $(($(date +%s) - start)) s"
if [[ $skipped -gt 0 ]]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
if [[ $failed -gt 0 ]]; then
  exit 1
fi
if [[ -n $gpu_problem ]]; then
  echo "gpu_check: NO GPU: $gpu_problem; nothing on the GPU path was run (the build passed)" >&2
  exit 2
fi
if [[ $passed -eq 0 ]]; then
  echo "gpu_check: no check passed" >&2
  exit 1
fi
exit 0
