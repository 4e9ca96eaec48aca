#pragma once
/// \file
/// Running the peers of corodist-bench (PyTorch scripts under /usr/bin/python3,
/// the gRPC C++ program) as child processes of the benchmark, so they inherit
/// its CPU pinning, and reading back the JSON lines they print.

#include "harness.hpp"

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace corodist::bench {

/// One flat JSON object a peer printed: its number fields and its string fields.
struct peer_line {
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> strings;

  /// The number `key`, or NaN.
  double number(const std::string& key) const;
  /// The string `key`, or "".
  std::string string(const std::string& key) const;
};

/// What a peer run produced: its JSON lines, or why there are none.
struct peer_output {
  std::vector<peer_line> lines;
  std::string failure; ///< empty on success; else "not installed" or "failed: ..."

  /// The first line whose string fields match all of `match`, or null.
  const peer_line* find(const std::map<std::string, std::string>& match) const;
};

/// Why PyTorch cannot be a peer here ("not installed" when /usr/bin/python3
/// cannot `import torch`), or nullopt when it can. Checked once per process.
std::optional<std::string> torch_unavailable();

/// Whether `argv` (argv[0] looked up in PATH) runs and exits 0; its output is
/// discarded. Blocks until it exits.
bool command_succeeds(const std::vector<std::string>& argv);

/// The path of a peer script in bench/ ($CORODIST_BENCH_DIR, else the source
/// tree this binary was built from); "" when it is not there.
std::string bench_script(const std::string& name);

/// The path of a program built beside corodist-bench, relative to the build
/// directory (e.g. "tools/corodist-run"); "" when it is not there.
std::string built_program(const std::string& relative);

/// Removes `path` and everything under it (a suite's temporary directory); ignores errors.
void remove_tree(const std::string& path);

/// Runs `argv` (its own process group, killed if it outlives `timeout`) and
/// collects the lines of its stdout that are JSON objects, also after a
/// corodist-run "[R] " prefix. On a non-zero exit or timeout, `failure` says
/// so with the end of its stderr. Tells `ctx.status` what runs meanwhile.
peer_output run_peer(context& ctx, const std::string& what, const std::vector<std::string>& argv,
                     std::chrono::seconds timeout);

/// A peer_result named `name` from `out`: `fill` sets its figures from the
/// matching line; a failed run or a missing line gives a missing peer.
peer_result peer_from(const std::string& name, const peer_output& out,
                      const std::map<std::string, std::string>& match, const char* p50_key,
                      const char* ops_key = nullptr, const char* gbytes_key = nullptr);

/// gRPC C++ (Debian's libgrpc++; bench/grpc/grpc_peer.cpp, built only when
/// found) run with `args` (its --cases and sizes). "not installed" only when
/// gRPC is not installed; throws (the suite fails, naming the peer) when it is
/// but its program is not built. Defined in rpc_suite.cpp (the one file that
/// knows whether the build found gRPC); run by the rpc and stream suites.
peer_output grpc_cpp_peer(context& ctx, const std::vector<std::string>& args);

/// PyTorch RPC (TensorPipe; bench/torch_rpc_peer.py, two ranks through
/// corodist-run): rpc_sync_empty p50, rpc_async_x64 ops/s, remote_to_here p50.
/// Run by the rpc suite and by the rref suite (for remote_to_here).
peer_output torch_rpc_peer(context& ctx);

} // namespace corodist::bench
