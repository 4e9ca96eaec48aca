// corodist-run: start the local ranks of a job, like torchrun.
//
//   corodist-run --nproc 4 -- ./train --epochs 3
//   corodist-run --nnodes 2 --node-rank K --nproc 8 --master-addr HOST --master-port 29500 -- ./train
//   corodist-run --nnodes 1:4 --max-restarts 3 --nproc 8 --master-addr HOST --master-port 29500 -- ./train
//
// The launcher of node 0 hosts the job's store (a store_server in this
// process, on --master-addr:--master-port); the launchers of all nodes meet
// in it for each generation of workers (a rendezvous round), and every rank,
// rank 0 included, connects to it as a client (TORCHELASTIC_USE_AGENT_STORE).
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE=True and
// CORODIST_GENERATION; stdin from /dev/null and a process group of its own;
// every line it writes comes out prefixed "[RANK] " on our stdout or stderr
// (its stdout is a pseudo-terminal, so C stdio line-buffers it and a killed
// rank's printed lines still come out; --log-dir DIR also keeps each rank's
// stdout and stderr in files).
// SIGINT/SIGTERM/SIGHUP are passed on to every rank; when a rank fails, the
// others get SIGTERM and, after --grace-period, SIGKILL; with --max-restarts
// the workers of every node are then started again under a new generation.
//
// One file per job: options (the settings), output and prefixed_stream (what
// ranks write, line by line, prefixed), rank_output (the pseudo-terminal and
// pipe a rank writes to, the log files), signals (the self-pipe), launcher
// (generations), store_host (the job's store), rendezvous_round (the rounds),
// spawning (starting ranks), supervision (watching them, teardown).

#include "launcher.hpp"
#include "options.hpp"
#include "output.hpp"

#include <corodist/metrics/metrics_server.hpp>

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <system_error>
#include <string>
#include <utility>

using namespace corodist::tools::launch;

int main(int argc, char** argv) {
  CLI::App app{"corodist-run: start the local ranks of a job with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
               "MASTER_ADDR and MASTER_PORT set, like torchrun; the launcher of node 0 hosts the job's store; output "
               "lines are prefixed with the rank; a failing rank stops the others, and with --max-restarts every "
               "node's workers are started again under a new generation.",
               "corodist-run"};
  settings s;
  std::string nnodes = "1";
  std::string policy = "all";
  app.add_option("--nproc,--nproc-per-node", s.nproc, "processes to start on this node")
      ->required()
      ->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", nnodes,
                 "nodes in the job (each runs corodist-run): N, or MIN:MAX to start once MIN are in and take up to "
                 "MAX that come within --join-window")
      ->capture_default_str();
  auto* node_rank = app.add_option("--node-rank", s.node_rank, "this node's index, 0 <= K < nnodes (--nnodes N only)")
                        ->capture_default_str();
  auto* addr = app.add_option("--master-addr", s.master_addr,
                              "address of the job's store, hosted by the launcher of node 0")
                   ->capture_default_str();
  auto* port = app.add_option("--master-port", s.master_port, "port of the job's store (default: a free port)")
                   ->check(CLI::Range(0, 65535));
  app.add_option("--grace-period", s.grace_s, "seconds between SIGTERM and SIGKILL when stopping the ranks")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--max-restarts", s.max_restarts,
                 "times the workers are started again after a failure before the job fails")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--restart-policy", policy,
                 "all: stop every node's workers and start them again under a new generation; worker: restart only "
                 "the failed worker, same rank, same generation")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "worker"}));
  app.add_option("--join-window", s.join_window_s,
                 "with --nnodes MIN:MAX, seconds node 0 waits for more nodes once MIN are in")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--join-timeout", s.join_timeout_s,
                 "seconds a launcher waits for the store and for a rendezvous round to close")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  app.add_option("--log-dir", s.log_dir,
                 "also write each rank's stdout and stderr, unprefixed, to DIR/attempt_GENERATION/RANK/stdout.log "
                 "and stderr.log (appended when a rank restarts in place)");
  app.add_option("--metrics-port", s.metrics_port,
                 "serve every local rank's metrics (Prometheus text format, a rank label on each series) at "
                 "http://BIND:PORT/metrics; 0: a free port, printed at start (docs/metrics.md)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-bind", s.metrics_bind, "the address --metrics-port listens on")->capture_default_str();
  app.add_option("--hang-after", s.hang_after_s,
                 "seconds a rank's collective or RPC call may wait before the launcher gathers every rank's flight "
                 "recorder and prints who is behind and where (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--hang-dump-dir", s.hang_dump_dir,
                 "directory for the ranks' flight recorders written with a hang verdict (default: --log-dir, else "
                 "$CORODIST_RECORDER_DUMP_DIR, else the temporary directory)");
  app.add_option("--timeline", s.timeline,
                 "write a Chrome trace / Perfetto JSON of the job to FILE when it ends: every rank's flight "
                 "recorders, asked for every --timeline-every seconds while the ranks run, clocks aligned on this "
                 "launcher's (node 0 only)");
  app.add_option("--timeline-every", s.timeline_every_s,
                 "seconds between --timeline's snapshots (what a rank did after its last one is not in the file)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  app.add_option("--tls-cert", s.tls_cert,
                 "PEM certificate chain for TLS on the job's store and RPC channels (with --tls-key and --tls-ca; "
                 "the ranks get CORODIST_TLS_CERT/KEY/CA and require one another's certificates: mutual TLS)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", s.tls_key, "the private key of --tls-cert (PEM)")->check(CLI::ExistingFile);
  app.add_option("--tls-ca", s.tls_ca, "the CA file (PEM) that every certificate of the job must chain to")
      ->check(CLI::ExistingFile);
  app.add_option("command", s.command, "the program and its arguments, after --")->required();
  CLI11_PARSE(app, argc, argv);

  if (auto why = parse_nnodes(nnodes, s); !why.empty()) {
    say(why);
    return 2;
  }
  s.policy = policy == "worker" ? restart_policy::worker : restart_policy::all;
  if (s.elastic && *node_rank) {
    say("with --nnodes MIN:MAX the rendezvous assigns the node ranks: drop --node-rank");
    return 2;
  }
  if (!s.elastic && (s.node_rank < 0 || s.node_rank >= s.max_nodes)) {
    say("--node-rank " + std::to_string(s.node_rank) + " is outside 0.." + std::to_string(s.max_nodes - 1));
    return 2;
  }
  if (s.max_nodes > 1 && (!*addr || !*port || s.master_port == 0)) {
    say("with more than one node every node needs the same --master-addr and --master-port");
    return 2;
  }
  if (!s.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(s.log_dir, ec);
    if (ec || !std::filesystem::is_directory(s.log_dir)) {
      say("--log-dir '" + s.log_dir + "' cannot be created: " + (ec ? ec.message() : "not a directory"));
      return 2;
    }
  }
  if (s.tls_cert.empty() != s.tls_key.empty() || (!s.tls_cert.empty() && s.tls_ca.empty())) {
    say("--tls-cert, --tls-key and --tls-ca go together");
    return 2;
  }
  for (auto* f : {&s.tls_cert, &s.tls_key, &s.tls_ca}) // the ranks may run elsewhere in the tree
    if (!f->empty())
      *f = std::filesystem::absolute(*f).string();
  // This launcher's store, and every rank (they inherit it), use the same CORODIST_TLS_*.
  for (auto& [name, value] : tls_env(s))
    ::setenv(name.c_str(), value.c_str(), 1);
  // The ranks get their own CORODIST_METRICS_PORT; the launcher serves none of its own.
  if (s.metrics_port >= 0)
    ::unsetenv(corodist::metrics::port_variable);
  try {
    return launcher(std::move(s)).run();
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}
