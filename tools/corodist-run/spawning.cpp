#include "launcher.hpp"
#include "output.hpp"
#include "rank_output.hpp"
#include "signals.hpp"

#include <corodist/store/launch_generation.hpp>

namespace corodist::tools::launch {

namespace cs = corodist::store;

namespace {

/// Lines of each rank's stderr kept for the report of its failure.
constexpr std::size_t stderr_tail_lines = 20;

} // namespace

std::vector<std::pair<std::string, std::string>> launcher::worker_env(const rank_process& r) const {
  std::vector<std::pair<std::string, std::string>> env{{"RANK", std::to_string(r.rank)},
          {"WORLD_SIZE", std::to_string(assignment_.world)},
          {"LOCAL_RANK", std::to_string(r.local)},
          {"LOCAL_WORLD_SIZE", std::to_string(s_.nproc)},
          {"GROUP_RANK", std::to_string(assignment_.node_rank)},
          {"GROUP_WORLD_SIZE", std::to_string(assignment_.nodes)},
          {"MASTER_ADDR", s_.master_addr},
          {"MASTER_PORT", std::to_string(s_.master_port)},
          {"TORCHELASTIC_RESTART_COUNT", std::to_string(r.restarts)},
          {"TORCHELASTIC_MAX_RESTARTS", std::to_string(s_.max_restarts)},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {corodist::store::generation_variable, std::to_string(generation_)},
          {"CORODIST_HANG_AFTER_MS", std::to_string(static_cast<long long>(s_.hang_after_s * 1000.0))}};
  if (metrics_)
    for (auto& v : metrics_->rank_env(r.rank))
      env.push_back(std::move(v));
  return env;
}

// Starts (or restarts) one rank; false when it could not be started (then a failure is recorded).
bool launcher::spawn_rank(rank_process& r) {
  // stdout on a pseudo-terminal: C stdio line-buffers it, so what a rank
  // printed has left it when it is killed; stderr (unbuffered) on a pipe.
  output_channel out(true), err(false);
  int out_log = -1, err_log = -1;
  if (!s_.log_dir.empty()) {
    out_log = open_rank_log(s_.log_dir, generation_, r.rank, "stdout.log");
    try {
      err_log = open_rank_log(s_.log_dir, generation_, r.rank, "stderr.log");
    } catch (...) {
      ::close(out_log);
      throw;
    }
  }
  corodist::tools::spawn_options o;
  o.argv = s_.command;
  o.env = worker_env(r);
  o.stdin_fd = devnull_;
  o.stdout_fd = out.write_end();
  o.stderr_fd = err.write_end();
  o.new_process_group = true;
  o.die_with_parent = true;
  o.close_other_fds = true; // the store's sockets stay ours
  const std::string prefix = "[" + std::to_string(r.rank) + "] ";
  // The streams exist before the spawn: a rank that cannot start still has its log files closed.
  auto out_stream = std::make_unique<prefixed_stream>(out.release_read_end(), 1, prefix, 0, out_log);
  auto err_stream = std::make_unique<prefixed_stream>(err.release_read_end(), 2, prefix, stderr_tail_lines, err_log);
  try {
    r.pid = corodist::tools::spawn(o);
  } catch (const std::system_error& e) {
    say("rank " + std::to_string(r.rank) + ": " + e.what());
    r.pid = -1;
    on_failure(r, "could not be started", 127);
    return false;
  }
  r.running = true;
  r.out = std::move(out_stream);
  r.err = std::move(err_stream);
  return true;
}

void launcher::start_ranks() {
  if (s_.metrics_port >= 0 && !metrics_) {
    metrics_ = std::make_unique<node_metrics>(static_cast<std::uint16_t>(s_.metrics_port), s_.metrics_bind);
    say("metrics: every local rank's at http://" + s_.metrics_bind + ":" + std::to_string(metrics_->port()) +
        "/metrics");
  }
  ranks_.clear();
  ranks_.resize(static_cast<std::size_t>(s_.nproc));
  for (int local = 0; local < s_.nproc; ++local) {
    auto& r = ranks_[static_cast<std::size_t>(local)];
    r.rank = assignment_.rank_base + local;
    r.local = local;
    r.restarts = restart_count_;
  }
  for (auto& r : ranks_)
    if (!spawn_rank(r))
      return;
}
} // namespace corodist::tools::launch
