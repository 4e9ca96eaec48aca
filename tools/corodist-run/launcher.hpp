#pragma once
/// \file
/// The launcher of one node: hosts or joins the job's store, meets the other
/// nodes' launchers in a rendezvous round per generation, starts this node's
/// ranks and supervises them. Its member functions live in one file per job:
/// launcher.cpp (generations and their end), store_host.cpp (the job's store),
/// rendezvous_round.cpp (the rounds), spawning.cpp (starting ranks),
/// supervision.cpp (watching ranks, signals, teardown), hang_watch.cpp
/// (the hang verdict) and timeline_file.cpp (--timeline).

#include "node_metrics.hpp"
#include "options.hpp"
#include "prefixed_stream.hpp"
#include "subprocess.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/store/store.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>

#include <asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

namespace corodist::tools::launch {

using clock_type = std::chrono::steady_clock;

/// The launcher was stopped by a signal while no worker ran.
struct stopped_by_signal {
  int sig;
};

/// A job-level fault of the launch itself (two nodes claiming one rank, ...).
class launch_error : public corodist::error {
public:
  using corodist::error::error;
};

/// One local rank and its output streams.
struct rank_process {
  int rank = 0;
  int local = 0;
  int restarts = 0; ///< TORCHELASTIC_RESTART_COUNT it was started with
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  std::unique_ptr<prefixed_stream> out;
  std::unique_ptr<prefixed_stream> err;
};

/// This node's place in a generation, as node 0's launcher decided it.
struct assignment {
  int nodes = 1;
  int world = 1;
  int node_rank = 0;
  int rank_base = 0;
  int restart_count = 0;
};

/// What a watcher of a generation's end key hands the supervisor.
struct watch_state {
  std::mutex m;
  std::optional<std::string> value;
  std::atomic<bool> closing{false};
};

/// --timeline's latest dump of each rank (timeline_file.cpp).
struct timeline_snapshots;

/// The key prefix of generation `generation`'s rendezvous round.
std::string round_key(std::int64_t generation);
/// The first word of `s` and the rest after one space.
std::pair<std::string, std::string> split_word(const std::string& s);
/// A decimal int read from the store; throws launch_error when it is not one.
int to_int(const std::string& s);
/// Waits (on the loop) for a generation's end key and wakes the supervisor
/// with its value, or with "lost <why>" when the store is gone.
asio::awaitable<void> watch_end(std::shared_ptr<corodist::store::store> store, std::string key,
                                std::shared_ptr<watch_state> w);

/// One node's launcher; used from the thread that calls run().
class launcher {
public:
  explicit launcher(settings s) : s_(std::move(s)) {}
  launcher(const launcher&) = delete;
  launcher& operator=(const launcher&) = delete;
  ~launcher() {
    if (devnull_ >= 0)
      ::close(devnull_);
  }

  /// Runs the job on this node until it ends; returns the launcher's exit
  /// status (0, the failed rank's status, 128+signal, or 1 for a launch fault).
  int run();

private:
  // store_host.cpp
  std::string store_address() const;
  void open_store();
  void close_store();
  void check_signals();
  std::optional<std::string> wait_key(const std::string& key, std::chrono::milliseconds limit);
  std::string must_wait_key(const std::string& key, const std::string& what);

  // rendezvous_round.cpp
  bool join_round();
  void close_round(const std::string& base);

  // launcher.cpp
  int run_generations();
  std::string end_key() const { return round_key(generation_) + "end"; }
  void set_end(const std::string& value);
  std::string node_name() const { return "node " + std::to_string(assignment_.node_rank); }
  std::optional<int> decide(const std::string& end);
  void report_failure();

  // spawning.cpp
  std::vector<std::pair<std::string, std::string>> worker_env(const rank_process& r) const;
  bool spawn_rank(rank_process& r);
  void start_ranks();

  // hang_watch.cpp
  void start_hang_watch();
  void verdict_on_failure(const rank_process& failed, const std::string& what);

  // timeline_file.cpp
  void start_timeline();
  void write_timeline();

  // supervision.cpp
  bool any_running() const;
  void signal_ranks(int sig);
  void start_teardown(int sig);
  void on_failure(rank_process& r, const std::string& what, int code);
  void reap();
  void on_signals();
  void on_wake();
  void report_finished();
  std::string supervise_generation();

  struct failure_record {
    int rank = 0;
    pid_t pid = -1;
    std::string what;
    int code = 1;
    std::deque<std::string> tail;
    bool tail_taken = false;
  };

  settings s_;
  corodist::event_loop loop_; // first: destroyed last, after the store objects that post to it
  std::shared_ptr<corodist::store::store_server> server_;
  std::shared_ptr<corodist::store::store> store_;
  std::unique_ptr<corodist::store::sync_store> sync_;
  bool host_ = false;
  int devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);

  std::int64_t generation_ = 0;
  int restart_count_ = 0;
  assignment assignment_;

  std::vector<rank_process> ranks_;
  std::vector<std::unique_ptr<prefixed_stream>> retired_; // streams of ranks restarted in place
  std::shared_ptr<watch_state> watch_;
  std::shared_ptr<timeline_snapshots> timeline_; // --timeline: the ranks' latest dumps
  std::optional<std::string> end_;
  std::optional<failure_record> failure_;
  rank_process* failed_ = nullptr;
  bool tearing_down_ = false;
  bool finished_reported_ = false;
  int worker_restarts_ = 0;
  std::optional<clock_type::time_point> kill_deadline_;
  std::optional<int> stop_signal_;
  std::set<int> signals_seen_; // passed on to the ranks already
  std::unique_ptr<node_metrics> metrics_; // --metrics-port
};
} // namespace corodist::tools::launch
