#pragma once
// Test helper: runs a program as a child process with its stdout and stderr
// captured, reads its output line by line or to the end, and kills and reaps
// it at scope exit if it is still running. Every wait has a deadline.

#include "support/child_process.hpp"

#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include <poll.h>
#include <unistd.h>

namespace corodist::test {

/// A child_process that execs a program, with its output on a pipe.
class program {
public:
  /// Starts `argv[0]` (looked up in PATH) with `argv`.
  explicit program(const std::vector<std::string>& argv)
      : child_([this, argv] {
          ::dup2(pipe_.write_end(), 1);
          ::dup2(pipe_.write_end(), 2);
          pipe_.close_read();
          pipe_.close_write();
          std::vector<char*> args;
          for (auto& a : argv)
            args.push_back(const_cast<char*>(a.c_str()));
          args.push_back(nullptr);
          ::execvp(args[0], args.data());
          return 127;
        }) {
    pipe_.close_write();
  }

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

  /// Waits for the process to exit (killing it after `timeout`); returns its
  /// exit status (-1 if killed or crashed). All its output is in output().
  int wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (fill(deadline)) {
    }
    output_ += buf_;
    buf_.clear();
    if (std::chrono::steady_clock::now() >= deadline)
      ::kill(child_.pid(), SIGKILL);
    int rc = child_.wait();
    return rc >= 128 ? -1 : rc;
  }

  /// Everything read so far.
  const std::string& output() const { return output_; }

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

  pipe_pair pipe_; // before child_: the child uses it, and it closes after the child is reaped
  child_process child_;
  std::string buf_;
  std::string output_;
};

} // namespace corodist::test
