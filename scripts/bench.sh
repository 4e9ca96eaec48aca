#!/usr/bin/env bash
# The main job: installs what it needs (with the peers: python3-torch, gRPC C++,
# matplotlib), builds, runs corodist-bench, and writes the results into
# build/bench-results/: bench-STAMP.txt (the table), bench-STAMP.jsonl (one
# JSON object per case and peer), bench-STAMP.png (the plot) and, when the run
# measured several rank counts, bench-STAMP-scaling.png; latest.* and
# latest-scaling.png link to the newest run. Arguments go to corodist-bench (e.g. --quick,
# --suite store,rpc, --pin, --no-peers); --list and --help just ask it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --bench
# A build/ configured before the set-up installed a peer (scripts/test.sh --plain first,
# then this) would build without it: Meson looks dependencies up only when it
# configures, so reconfigure an existing build/ (a few seconds) before building.
# The numbers need -O3: a build/ configured by scripts/test.sh --plain (-O1) is switched
# over, which rebuilds it.
if [[ -f build/build.ninja ]]; then
  meson setup --reconfigure build -Doptimization=3 >/dev/null
fi
bash scripts/build.sh build
ninja -C build benchmarks >/dev/null   # not built by default (meson_options.txt: benchmarks)
for a in "$@"; do
  case "$a" in
    --list|--help|-h) exec build/bench/corodist-bench "$@" ;;
    --json|--json=*) echo "bench.sh: the JSON goes to build/bench-results/; run build/bench/corodist-bench for --json" >&2; exit 2 ;;
  esac
done
out=build/bench-results
mkdir -p "$out"
stamp=$(date +%Y%m%d-%H%M%S)
rc=0
build/bench/corodist-bench --json "$out/bench-$stamp.jsonl" "$@" | tee "$out/bench-$stamp.txt" || rc=$?
for ext in txt jsonl; do ln -sfn "bench-$stamp.$ext" "$out/latest.$ext"; done
if [[ -s "$out/bench-$stamp.jsonl" ]]; then
  /usr/bin/python3 scripts/bench_plot.py "$out/bench-$stamp.jsonl" -o "$out/bench-$stamp.png" && \
    ln -sfn "bench-$stamp.png" "$out/latest.png"
  # The scaling plot, when the run had cases at several rank counts.
  [[ -f $out/bench-$stamp-scaling.png ]] && ln -sfn "bench-$stamp-scaling.png" "$out/latest-scaling.png"
fi
echo "bench.sh: results in $out/bench-$stamp.{txt,jsonl,png}" >&2
exit $rc
