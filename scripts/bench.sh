#!/usr/bin/env bash
# Installs dependencies, builds, and runs the latency benchmark suites.
# Arguments go to corodist-bench (e.g. --quick, --suite net, --json -, --pin).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
exec build/bench/corodist-bench "$@"
