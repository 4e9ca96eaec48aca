#pragma once
// corodist-run as a test starts it: a real process whose stdout and stderr
// the test reads separately (the tools suite's launcher and hang tests).

#include <boost/test/unit_test.hpp>

#include "subprocess.hpp"

#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corodist::test {

/// corodist-run started with `args`, its stdout and stderr read separately.
class launched {
public:
  launched(const std::string& launcher_path, std::vector<std::string> args) {
    corodist::tools::spawn_options o;
    o.argv = {launcher_path};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.stdout_fd = out_.write_end();
    o.stderr_fd = err_.write_end();
    pid_ = corodist::tools::spawn(o);
    out_.close_write();
    err_.close_write();
    started_ = std::chrono::steady_clock::now();
  }
  ~launched() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }

  pid_t pid() const { return pid_; }

  /// Reads until `count` complete stdout lines (stderr lines with `from_stderr`)
  /// contain `text`; false at the deadline or end of output.
  bool wait_for_lines(const std::string& text, int count, std::chrono::milliseconds timeout = std::chrono::seconds(20),
                      bool from_stderr = false) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int seen = 0;
      for (auto& l : lines(from_stderr ? err_text_ : out_text_))
        seen += l.find(text) != std::string::npos;
      if (seen >= count)
        return true;
      if (!read_some(deadline))
        return false;
    }
  }

  /// Reads all output and reaps the launcher (SIGKILL after `timeout`, failing
  /// the test); returns its waitpid status.
  int finish(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (read_some(deadline)) {
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      BOOST_ERROR("corodist-run did not finish within " << timeout.count() << " ms");
    }
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    ended_ = std::chrono::steady_clock::now();
    BOOST_TEST_MESSAGE("stdout:\n" << out_text_ << "stderr:\n" << err_text_);
    return st;
  }

  const std::string& out() const { return out_text_; }
  const std::string& err() const { return err_text_; }
  std::chrono::duration<double> run_time() const { return ended_ - started_; }

  static std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> v;
    std::size_t pos = 0;
    while (pos < text.size()) {
      auto nl = text.find('\n', pos);
      if (nl == std::string::npos)
        break; // only complete lines
      v.push_back(text.substr(pos, nl - pos));
      pos = nl + 1;
    }
    return v;
  }

private:
  // Reads from whichever stream has data; false once both ended or at the deadline.
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      std::vector<pollfd> fds;
      if (out_.read_end() >= 0)
        fds.push_back({out_.read_end(), POLLIN, 0});
      if (err_.read_end() >= 0)
        fds.push_back({err_.read_end(), POLLIN, 0});
      if (fds.empty())
        return false;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0)
        return false;
      if (::poll(fds.data(), fds.size(), static_cast<int>(left)) <= 0)
        continue;
      for (auto& p : fds) {
        if (p.revents == 0)
          continue;
        char buf[4096];
        auto n = ::read(p.fd, buf, sizeof buf);
        bool is_out = p.fd == out_.read_end();
        if (n <= 0) {
          is_out ? out_.close_read() : err_.close_read();
        } else {
          (is_out ? out_text_ : err_text_).append(buf, static_cast<std::size_t>(n));
        }
      }
      return true;
    }
  }

  corodist::tools::pipe_fds out_, err_;
  pid_t pid_ = -1;
  std::string out_text_, err_text_;
  std::chrono::steady_clock::time_point started_, ended_;
};

} // namespace corodist::test
