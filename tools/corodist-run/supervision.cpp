#include "launcher.hpp"
#include "output.hpp"
#include "signals.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <algorithm>
#include <system_error>

#include <poll.h>
#include <sys/wait.h>

namespace corodist::tools::launch {

namespace cs = corodist::store;

namespace {

/// Output still read after the last rank ended.
constexpr auto drain_time = std::chrono::seconds(2);

} // namespace

bool launcher::any_running() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const rank_process& r) { return r.running; });
}

// Sends `sig` to the process group of every rank that runs or still has output open.
void launcher::signal_ranks(int sig) {
  for (auto& r : ranks_)
    if (r.pid > 0 && (r.running || (r.out && r.out->open()) || (r.err && r.err->open())))
      ::kill(-r.pid, sig);
}

void launcher::start_teardown(int sig) {
  tearing_down_ = true;
  signal_ranks(sig);
  if (!kill_deadline_)
    kill_deadline_ = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                             std::chrono::duration<double>(s_.grace_s));
}

// A rank failed: restart it alone (--restart-policy worker), or stop this
// node's ranks and end the generation with a restart or a failure.
void launcher::on_failure(rank_process& r, const std::string& what, int code) {
  const std::string who =
      "rank " + std::to_string(r.rank) + (r.pid > 0 ? " (pid " + std::to_string(r.pid) + ")" : "");
  if (s_.policy == restart_policy::worker && worker_restarts_ < s_.max_restarts && r.pid > 0) {
    ++worker_restarts_;
    say(who + " failed: " + what + "; restarting it (restart " + std::to_string(worker_restarts_) + " of " +
        std::to_string(s_.max_restarts) + ", --restart-policy worker)");
    // Its output may still come: the old streams are read until they close.
    if (r.out)
      retired_.push_back(std::move(r.out));
    if (r.err)
      retired_.push_back(std::move(r.err));
    ++r.restarts;
    spawn_rank(r);
    return;
  }
  failure_ = failure_record{r.rank, r.pid, what, code, {}, false};
  failed_ = &r;
  verdict_on_failure(r, what);
  start_teardown(SIGTERM);
  const bool again = s_.policy == restart_policy::all && restart_count_ < s_.max_restarts;
  const std::string text = node_name() + ": " + who + " failed: " + what;
  set_end(again ? "restart " + text : "failed " + std::to_string(code) + " " + text);
}

void launcher::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR)
      continue;
    if (pid <= 0)
      return;
    for (auto& r : ranks_) {
      if (r.pid != pid || !r.running)
        continue;
      r.running = false;
      r.status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !tearing_down_ && !end_)
        on_failure(r, describe_wait_status(status), WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
  }
}

void launcher::on_signals() {
  drain_signals([this](int sig) {
    if (sig == SIGCHLD) {
      reap();
      return;
    }
    if (!stop_signal_) {
      stop_signal_ = sig;
      set_end("stopped " + std::to_string(128 + sig) + " the launcher of " + node_name() + " got " +
              signal_name(sig));
    }
    // The same signal again (coreutils' timeout sends it to the launcher,
    // then to its process group): the ranks already have it.
    if (!signals_seen_.insert(sig).second)
      return;
    say("got " + signal_name(sig) + ", passing it to the ranks");
    start_teardown(sig);
  });
}

void launcher::on_wake() {
  drain_wake_pipe();
  std::lock_guard lock(watch_->m);
  if (!end_ && watch_->value)
    end_ = *watch_->value;
}

// This node's ranks all ended well: counted; the last node ends the generation.
void launcher::report_finished() {
  finished_reported_ = true;
  try {
    const auto n = sync_->add(round_key(generation_) + "finished", 1);
    if (n >= assignment_.nodes)
      set_end("done");
  } catch (const std::exception& e) {
    if (!end_)
      end_ = std::string("lost ") + e.what();
  }
}

// Runs one generation of this node's workers; returns how it ended (the
// value of its end key).
std::string launcher::supervise_generation() {
  end_.reset();
  failure_.reset();
  failed_ = nullptr;
  tearing_down_ = false;
  finished_reported_ = false;
  kill_deadline_.reset();
  retired_.clear();
  worker_restarts_ = 0;
  watch_ = std::make_shared<watch_state>();
  asio::co_spawn(loop_.get_executor(), watch_end(store_, end_key(), watch_), asio::detached);
  start_ranks();
  start_hang_watch();
  start_timeline();
  std::optional<clock_type::time_point> drain_deadline;
  bool killed = false;
  reap(); // a rank may have ended before the handler was of any use
  for (;;) {
    if (end_ && any_running() && !tearing_down_)
      start_teardown(SIGTERM);
    if (!end_ && !any_running() && !finished_reported_ && !failure_ && !stop_signal_)
      report_finished();
    const auto now = clock_type::now();
    if (end_ && !any_running() && !drain_deadline)
      drain_deadline = now + drain_time;
    std::vector<pollfd> fds{{signal_pipe_read_end(), POLLIN, 0}, {wake_pipe_read_end(), POLLIN, 0}};
    std::vector<prefixed_stream*> streams;
    auto add_stream = [&](prefixed_stream* st) {
      if (st && st->open()) {
        fds.push_back({st->fd(), POLLIN, 0});
        streams.push_back(st);
      }
    };
    for (auto& r : ranks_) {
      add_stream(r.out.get());
      add_stream(r.err.get());
    }
    for (auto& st : retired_)
      add_stream(st.get());
    if (drain_deadline && (streams.empty() || now >= *drain_deadline))
      break;
    auto wake = drain_deadline.value_or(clock_type::time_point::max());
    if (kill_deadline_ && !killed)
      wake = std::min(wake, *kill_deadline_);
    int timeout_ms = -1;
    if (wake != clock_type::time_point::max())
      timeout_ms = static_cast<int>(std::max<long>(
          0, std::chrono::ceil<std::chrono::milliseconds>(wake - now).count()));
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), "poll");
    if (n > 0) {
      for (std::size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents != 0)
          streams[i - 2]->on_readable();
      if (fds[0].revents != 0)
        on_signals();
      if (fds[1].revents != 0)
        on_wake();
    }
    if (kill_deadline_ && !killed && clock_type::now() >= *kill_deadline_) {
      killed = true;
      for (auto& r : ranks_)
        if (r.running)
          say("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") did not stop within " +
              fmt_seconds(s_.grace_s) + ": sending SIGKILL");
      signal_ranks(SIGKILL);
    }
  }
  for (auto& r : ranks_)
    for (auto* st : {r.out.get(), r.err.get()})
      if (st && st->open())
        st->finish(); // a process the rank left behind still holds it: take what came
  for (auto& st : retired_)
    if (st->open())
      st->finish();
  if (failure_ && failed_ && failed_->err)
    failure_->tail = failed_->err->tail();
  watch_->closing = true;
  write_timeline();
  return *end_;
}
} // namespace corodist::tools::launch
