#include "launcher.hpp"
#include "output.hpp"
#include "signals.hpp"

#include <corodist/store/launch_generation.hpp>

namespace corodist::tools::launch {

namespace cs = corodist::store;

namespace {

/// Lines of each rank's stderr kept for the report of its failure.
constexpr std::size_t stderr_tail_lines = 20;

} // namespace

std::vector<std::pair<std::string, std::string>> launcher::worker_env(const rank_process& r) const {
  return {{"RANK", std::to_string(r.rank)},
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
          {corodist::store::generation_variable, std::to_string(generation_)}};
}

// Starts (or restarts) one rank; false when it could not be started (then a failure is recorded).
bool launcher::spawn_rank(rank_process& r) {
  corodist::tools::pipe_fds out, err;
  corodist::tools::spawn_options o;
  o.argv = s_.command;
  o.env = worker_env(r);
  o.stdin_fd = devnull_;
  o.stdout_fd = out.write_end();
  o.stderr_fd = err.write_end();
  o.new_process_group = true;
  o.die_with_parent = true;
  o.close_other_fds = true; // the store's sockets stay ours
  try {
    r.pid = corodist::tools::spawn(o);
  } catch (const std::system_error& e) {
    say("rank " + std::to_string(r.rank) + ": " + e.what());
    r.pid = -1;
    on_failure(r, "could not be started", 127);
    return false;
  }
  r.running = true;
  const std::string prefix = "[" + std::to_string(r.rank) + "] ";
  r.out = std::make_unique<prefixed_stream>(dup_read(out), 1, prefix);
  r.err = std::make_unique<prefixed_stream>(dup_read(err), 2, prefix, stderr_tail_lines);
  return true;
}

void launcher::start_ranks() {
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

int launcher::dup_read(corodist::tools::pipe_fds& p) {
  int fd = ::fcntl(p.read_end(), F_DUPFD_CLOEXEC, 3);
  if (fd < 0)
    throw std::system_error(errno, std::generic_category(), "fcntl");
  return fd;
}
} // namespace corodist::tools::launch
