#pragma once
/// \file
/// corodist-run's settings, as its command line gives them.

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace corodist::tools::launch {

/// Once MIN nodes are in, how long node 0's launcher waits for more (torchrun's last call).
inline constexpr double default_join_window_s = 30.0;
/// How long a launcher waits for a rendezvous round to close (torchrun's join timeout).
inline constexpr double default_join_timeout_s = 600.0;

/// A rank's collective or RPC call waiting longer than this wakes the hang watch.
inline constexpr double default_hang_after_s = 30.0;

/// How often --timeline asks the ranks for their flight recorders.
inline constexpr double default_timeline_every_s = 1.0;

/// all: every node's workers start again under a new generation; worker: only the failed one, in place.
enum class restart_policy { all, worker };

/// What the command line asked for.
struct settings {
  int nproc = 1;
  int min_nodes = 1;
  int max_nodes = 1;
  bool elastic = false; ///< --nnodes MIN:MAX: node ranks come from the rendezvous
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  double grace_s = 5.0;
  int max_restarts = 0;
  restart_policy policy = restart_policy::all;
  double join_window_s = default_join_window_s;
  double join_timeout_s = default_join_timeout_s;
  std::string log_dir; ///< --log-dir: per-rank stdout/stderr files under it (empty: none)
  int metrics_port = -1;                  ///< --metrics-port: the node's metrics endpoint (-1: none, 0: a free port)
  std::string metrics_bind = "127.0.0.1"; ///< --metrics-bind: its address
  double hang_after_s = default_hang_after_s; ///< --hang-after (0: no hang watch)
  std::string hang_dump_dir; ///< --hang-dump-dir: where verdict dumps go (empty: --log-dir, else the temp directory)
  std::string timeline; ///< --timeline: the trace-event file written at each generation's end (empty: none)
  double timeline_every_s = default_timeline_every_s; ///< --timeline-every: seconds between the ranks' snapshots
  std::string tls_cert; ///< --tls-cert: the job's certificate chain (absolute; empty: no TLS flags)
  std::string tls_key;  ///< --tls-key: its private key
  std::string tls_ca;   ///< --tls-ca: the CA every certificate of the job must chain to
  std::vector<std::string> command;
};

/// Parses "N" or "MIN:MAX" into `s` (min_nodes, max_nodes, elastic); returns
/// an error text, empty when it parsed.
std::string parse_nnodes(const std::string& text, settings& s);

/// The CORODIST_TLS_* variables the --tls-* flags give the ranks (and this
/// launcher's own store): none when no flag is set.
std::vector<std::pair<std::string, std::string>> tls_env(const settings& s);

/// Seconds as milliseconds, rounded.
std::chrono::milliseconds to_ms(double s);

} // namespace corodist::tools::launch
