#pragma once
/// \file
/// Forks a suite's rank processes and collects what they write to a shared
/// pipe, with one deadline for all of them.

#include <fmt/core.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corodist::bench {

/// Forks `n` processes, each running `body(rank, out_fd)` and exiting with its
/// return value (1 if it throws: the error goes to stderr); reads everything
/// they write to `out_fd` until they all close it or `deadline` passes (then
/// they are killed). Returns the text. Throws std::runtime_error naming `what`
/// when a process failed.
inline std::string run_forked(const char* what, int n, const std::function<int(int rank, int out_fd)>& body,
                              std::chrono::seconds deadline_after) {
  int pipefd[2];
  if (::pipe(pipefd) != 0)
    throw std::runtime_error(fmt::format("{}: pipe failed", what));
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0)
      throw std::runtime_error(fmt::format("{}: fork failed", what));
    if (pid == 0) {
      ::close(pipefd[0]);
      int rc = 1;
      try {
        rc = body(r, pipefd[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: rank %d: %s\n", what, r, e.what());
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  ::close(pipefd[1]);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + deadline_after;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0)
      break;
    pollfd p{pipefd[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long>(left, 1000))) <= 0)
      continue;
    char buf[1024];
    const auto got = ::read(pipefd[0], buf, sizeof buf);
    if (got <= 0)
      break;
    text.append(buf, static_cast<std::size_t>(got));
  }
  ::close(pipefd[0]);
  int failed = 0;
  for (auto pid : pids) {
    ::kill(pid, std::chrono::steady_clock::now() >= deadline ? SIGKILL : 0);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  if (failed)
    throw std::runtime_error(fmt::format("{}: {} of {} rank processes failed", what, failed, n));
  return text;
}

} // namespace corodist::bench
