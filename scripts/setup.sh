#!/usr/bin/env bash
# Installs corodist's build and test dependencies from Debian packages
# (iproute2 and nftables: the hosts suite's namespaced test bed; prometheus:
# promtool, which the metrics suite validates the scraped text with).
# Idempotent and quiet: packages already present are skipped; apt runs only
# when something is missing. Usage: scripts/setup.sh [--python] [--bench] [--fuzz]
#   --python   also install python3-torch (PyTorch compatibility tests)
#   --bench    also install the main job's peers and plotting: python3-torch,
#              gRPC C++ (libgrpc++-dev, protobuf), python3-matplotlib
#   --fuzz     also install clang and libFuzzer (scripts/fuzz.sh)
set -euo pipefail

pkgs=(g++ meson ninja-build ccache pkg-config cmake
      liburing-dev libasio-dev libboost-test-dev libmsgpack-cxx-dev
      libspdlog-dev libfmt-dev libcli11-dev libgloo-dev libsodium-dev libssl-dev openssl
      nlohmann-json3-dev prometheus-cpp-dev libcivetweb-dev prometheus
      iproute2 nftables)
[[ " $* " == *" --python "* ]] && pkgs+=(python3 python3-torch)
[[ " $* " == *" --bench "* ]] && pkgs+=(python3 python3-torch python3-matplotlib
                                        libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc)
[[ " $* " == *" --fuzz "* ]] && pkgs+=(clang libclang-rt-14-dev llvm)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
