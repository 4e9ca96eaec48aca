#pragma once
// Test helper: runs a program as a child process with its stdout and stderr
// captured, reads its output line by line or to the end, and kills and reaps
// it at scope exit if it is still running. Every wait has a deadline.

#include "subprocess.hpp"

#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corodist::test {

/// A program started as a child process (tools/subprocess.hpp, the code
/// corodist-run uses), with its output on a pipe.
class program {
public:
  /// Starts `argv[0]` (looked up in PATH) with `argv`, and `env` added to
  /// the environment; stdout and stderr go to the same pipe. Fails the test
  /// if it cannot be executed.
  explicit program(const std::vector<std::string>& argv,
                   const std::vector<std::pair<std::string, std::string>>& env = {}) {
    tools::spawn_options o;
    o.argv = argv;
    o.env = env;
    o.stdin_fd = input_.read_end();
    o.stdout_fd = pipe_.write_end();
    o.stderr_fd = pipe_.write_end();
    try {
      pid_ = tools::spawn(o);
    } catch (const std::exception& e) {
      BOOST_FAIL(e.what());
    }
    pipe_.close_write();
    input_.close_read();
  }
  ~program() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      reap();
    }
  }
  program(const program&) = delete;
  program& operator=(const program&) = delete;

  /// The process id.
  pid_t pid() const noexcept { return pid_; }

  /// The next line of output (without the newline), or nullopt at end of
  /// output or after `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        auto line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        output_ += line + "\n";
        return line;
      }
      if (!fill(deadline))
        return std::nullopt;
    }
  }

  /// Writes `line` and a newline to the program's stdin; returns false if it
  /// could not (the program has closed it or exited).
  bool write_line(const std::string& line) {
    const std::string text = line + "\n";
    std::size_t done = 0;
    while (done < text.size()) {
      ssize_t n = ::write(input_.write_end(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }

  /// Waits for the process to exit (killing it after `timeout`); returns its
  /// exit status (-1 if killed or crashed). All its output is in output().
  int wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (fill(deadline)) {
    }
    output_ += buf_;
    buf_.clear();
    if (std::chrono::steady_clock::now() >= deadline)
      ::kill(pid_, SIGKILL);
    int status = reap();
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  /// Everything read so far.
  const std::string& output() const { return output_; }

  /// Reads what output has arrived, without waiting; returns all of it.
  const std::string& drain() {
    while (fill(std::chrono::steady_clock::now() + std::chrono::milliseconds(20))) {
    }
    output_ += buf_;
    buf_.clear();
    return output_;
  }

private:
  // Reads more output; false at end of output or at the deadline.
  bool fill(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        return false;
      pollfd p{pipe_.read_end(), POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 200)));
      if (r <= 0)
        continue;
      char chunk[4096];
      ssize_t n = ::read(pipe_.read_end(), chunk, sizeof chunk);
      if (n <= 0)
        return false;
      buf_.append(chunk, static_cast<std::size_t>(n));
      return true;
    }
  }

  int reap() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0)
      if (errno != EINTR)
        return -1;
    return status;
  }

  tools::pipe_fds input_; // the child's stdin (declared first: closes last, after the child is reaped)
  tools::pipe_fds pipe_; // closes after the child is reaped
  pid_t pid_ = -1;
  std::string buf_;
  std::string output_;
};

} // namespace corodist::test
