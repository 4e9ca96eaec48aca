// corodist-run: start the local ranks of a job, like torchrun's static rendezvous.
//
//   corodist-run --nproc 4 -- ./train --epochs 3
//   corodist-run --nnodes 2 --node-rank K --nproc 8 --master-addr HOST --master-port 29500 -- ./train
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT (what `env://` rendezvous reads), stdin from /dev/null, and a
// process group of its own; every line it writes comes out prefixed "[RANK] "
// on our stdout or stderr. SIGINT/SIGTERM/SIGHUP are passed on to every rank;
// when a rank fails, the others get SIGTERM and, after --grace-period, SIGKILL.

#include "subprocess.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using clock_type = std::chrono::steady_clock;
using corodist::tools::describe_wait_status;

constexpr std::size_t max_line_bytes = 64 * 1024; // a longer line is cut into pieces of this size
constexpr auto drain_time = std::chrono::seconds(2); // output still read after the last rank ended
constexpr int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP};

int signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] auto n = ::write(signal_pipe[1], &b, 1);
  errno = saved;
}

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    auto w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return; // our own output is gone (EPIPE): keep supervising the ranks
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void say(const std::string& text) {
  std::string line = "corodist-run: " + text + "\n";
  write_all(2, line.data(), line.size());
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

/// One output stream of a rank: reads what the rank wrote and copies it to
/// `dest_fd` line by line, each line prefixed.
class prefixed_stream {
public:
  prefixed_stream(int fd, int dest_fd, std::string prefix) : fd_(fd), dest_fd_(dest_fd), prefix_(std::move(prefix)) {
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  }
  prefixed_stream(const prefixed_stream&) = delete;
  prefixed_stream& operator=(const prefixed_stream&) = delete;
  ~prefixed_stream() { close(); }

  int fd() const noexcept { return fd_; }
  bool open() const noexcept { return fd_ >= 0; }

  /// Reads what is there; at end of stream emits the partial last line and closes.
  void on_readable() {
    char chunk[16384];
    for (;;) {
      auto n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        break;
      if (n <= 0) {
        finish();
        return;
      }
      pending_.append(chunk, static_cast<std::size_t>(n));
      emit_lines();
    }
  }

  /// Emits the partial last line (with a newline added) and closes the stream.
  void finish() {
    if (!pending_.empty()) {
      pending_ += '\n';
      emit_lines();
    }
    close();
  }

private:
  void emit_lines() {
    std::string out;
    std::size_t start = 0;
    for (;;) {
      auto nl = pending_.find('\n', start);
      if (nl == std::string::npos) {
        if (pending_.size() - start < max_line_bytes)
          break;
        nl = start + max_line_bytes - 1; // an overlong line: pass this piece on as a line of its own
        out += prefix_;
        out.append(pending_, start, nl + 1 - start);
        out += '\n';
        start = nl + 1;
        continue;
      }
      out += prefix_;
      out.append(pending_, start, nl + 1 - start);
      start = nl + 1;
    }
    pending_.erase(0, start);
    write_all(dest_fd_, out.data(), out.size());
  }

  void close() {
    if (fd_ >= 0)
      ::close(std::exchange(fd_, -1));
  }

  int fd_;
  int dest_fd_;
  std::string prefix_;
  std::string pending_;
};

struct rank_process {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  std::unique_ptr<prefixed_stream> out;
  std::unique_ptr<prefixed_stream> err;
};

/// A free TCP port: bind 127.0.0.1:0 and read back what the kernel chose.
std::uint16_t free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int e = errno;
    ::close(s);
    throw std::system_error(e, std::generic_category(), "choosing a free port");
  }
  ::close(s);
  return ntohs(a.sin_port);
}

struct settings {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  double grace_s = 5.0;
  std::vector<std::string> command;
};

class launcher {
public:
  explicit launcher(settings s) : s_(std::move(s)) {}

  int run() {
    if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw std::system_error(errno, std::generic_category(), "pipe2");
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    ::sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    ::sigaction(SIGCHLD, &sa, nullptr);
    for (int sig : forwarded_signals)
      ::sigaction(sig, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    start_ranks();
    supervise();
    return report();
  }

private:
  void start_ranks() {
    const int world = s_.nnodes * s_.nproc;
    const std::string port = std::to_string(s_.master_port);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0)
      throw std::system_error(errno, std::generic_category(), "/dev/null");
    ranks_.resize(static_cast<std::size_t>(s_.nproc));
    for (int local = 0; local < s_.nproc; ++local) {
      auto& r = ranks_[static_cast<std::size_t>(local)];
      r.rank = s_.node_rank * s_.nproc + local;
      corodist::tools::pipe_fds out, err;
      corodist::tools::spawn_options o;
      o.argv = s_.command;
      o.env = {{"RANK", std::to_string(r.rank)},
               {"WORLD_SIZE", std::to_string(world)},
               {"LOCAL_RANK", std::to_string(local)},
               {"LOCAL_WORLD_SIZE", std::to_string(s_.nproc)},
               {"MASTER_ADDR", s_.master_addr},
               {"MASTER_PORT", port}};
      o.stdin_fd = devnull;
      o.stdout_fd = out.write_end();
      o.stderr_fd = err.write_end();
      o.new_process_group = true;
      o.die_with_parent = true;
      try {
        r.pid = corodist::tools::spawn(o);
      } catch (const std::system_error& e) {
        ::close(devnull);
        say("rank " + std::to_string(r.rank) + ": " + e.what());
        failed_rank_ = r.rank;
        failure_ = "could not be started";
        failed_code_ = 127;
        start_teardown(SIGTERM);
        return;
      }
      r.running = true;
      const std::string prefix = "[" + std::to_string(r.rank) + "] ";
      r.out = std::make_unique<prefixed_stream>(dup_read(out), 1, prefix);
      r.err = std::make_unique<prefixed_stream>(dup_read(err), 2, prefix);
    }
    ::close(devnull);
  }

  static int dup_read(corodist::tools::pipe_fds& p) {
    int fd = ::fcntl(p.read_end(), F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
      throw std::system_error(errno, std::generic_category(), "fcntl");
    return fd;
  }

  bool any_running() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const rank_process& r) { return r.running; });
  }

  // Sends `sig` to the process group of every rank that runs or still has output open.
  void signal_ranks(int sig) {
    for (auto& r : ranks_)
      if (r.pid > 0 && (r.running || (r.out && r.out->open()) || (r.err && r.err->open())))
        ::kill(-r.pid, sig);
  }

  void start_teardown(int sig) {
    signal_ranks(sig);
    if (!kill_deadline_)
      kill_deadline_ = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                               std::chrono::duration<double>(s_.grace_s));
  }

  void reap() {
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid < 0 && errno == EINTR)
        continue;
      if (pid <= 0)
        return;
      for (auto& r : ranks_) {
        if (r.pid != pid)
          continue;
        r.running = false;
        r.status = status;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !failed_rank_ && !stop_signal_) {
          failed_rank_ = r.rank;
          failure_ = describe_wait_status(status);
          failed_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          failed_pid_ = pid;
          start_teardown(SIGTERM);
        }
      }
    }
  }

  void on_signals() {
    unsigned char buf[64];
    for (;;) {
      auto n = ::read(signal_pipe[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return;
      for (ssize_t i = 0; i < n; ++i) {
        const int sig = buf[i];
        if (sig == SIGCHLD) {
          reap();
          continue;
        }
        if (!stop_signal_)
          stop_signal_ = sig;
        // The same signal again (coreutils' timeout sends it to the launcher,
        // then to its process group): the ranks already have it.
        if (!signals_seen_.insert(sig).second)
          continue;
        say("got " + signal_name(sig) + ", passing it to the ranks");
        start_teardown(sig);
      }
    }
  }

  void supervise() {
    std::optional<clock_type::time_point> drain_deadline;
    bool killed = false;
    reap(); // a rank may have ended before the handler was of any use
    for (;;) {
      const auto now = clock_type::now();
      if (!any_running() && !drain_deadline)
        drain_deadline = now + drain_time;
      std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}};
      std::vector<prefixed_stream*> streams;
      for (auto& r : ranks_)
        for (auto* st : {r.out.get(), r.err.get()})
          if (st && st->open()) {
            fds.push_back({st->fd(), POLLIN, 0});
            streams.push_back(st);
          }
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
        for (std::size_t i = 1; i < fds.size(); ++i)
          if (fds[i].revents != 0)
            streams[i - 1]->on_readable();
        if (fds[0].revents != 0)
          on_signals();
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
  }

  static std::string fmt_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g s", s);
    return buf;
  }

  int report() {
    if (failed_rank_) {
      std::string line = "rank " + std::to_string(*failed_rank_);
      if (failed_pid_ > 0)
        line += " (pid " + std::to_string(failed_pid_) + ")";
      line += " failed: " + failure_;
      int others = 0;
      for (auto& r : ranks_)
        others += r.rank != *failed_rank_ && r.pid > 0;
      if (others > 0)
        line += "; the other ranks were stopped";
      say(line);
      return failed_code_ != 0 ? failed_code_ : 1;
    }
    if (stop_signal_) {
      say("stopped by " + signal_name(*stop_signal_));
      return 128 + *stop_signal_;
    }
    return 0;
  }

  settings s_;
  std::vector<rank_process> ranks_;
  std::optional<clock_type::time_point> kill_deadline_;
  std::optional<int> failed_rank_;
  pid_t failed_pid_ = -1;
  std::string failure_;
  int failed_code_ = 1;
  std::optional<int> stop_signal_;
  std::set<int> signals_seen_; // passed on to the ranks already
};

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"corodist-run: start the local ranks of a job with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
               "MASTER_ADDR and MASTER_PORT set (torchrun's static rendezvous); output lines are prefixed "
               "with the rank; a failing rank stops the others.",
               "corodist-run"};
  settings s;
  app.add_option("--nproc,--nproc-per-node", s.nproc, "processes to start on this node")
      ->required()
      ->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", s.nnodes, "nodes in the job (each runs corodist-run)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--node-rank", s.node_rank, "this node's index, 0 <= K < nnodes")->capture_default_str();
  auto* addr = app.add_option("--master-addr", s.master_addr, "address of rank 0 (the store host)")
                   ->capture_default_str();
  auto* port = app.add_option("--master-port", s.master_port, "port of rank 0's store (default: a free port)")
                   ->check(CLI::Range(0, 65535));
  app.add_option("--grace-period", s.grace_s, "seconds between SIGTERM and SIGKILL when stopping the ranks")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("command", s.command, "the program and its arguments, after --")->required();
  CLI11_PARSE(app, argc, argv);

  if (s.node_rank < 0 || s.node_rank >= s.nnodes) {
    say("--node-rank " + std::to_string(s.node_rank) + " is outside 0.." + std::to_string(s.nnodes - 1));
    return 2;
  }
  if (s.nnodes > 1 && (!*addr || !*port || s.master_port == 0)) {
    say("with --nnodes > 1 every node needs the same --master-addr and --master-port");
    return 2;
  }
  try {
    if (s.master_port == 0)
      s.master_port = free_port();
    return launcher(std::move(s)).run();
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}
