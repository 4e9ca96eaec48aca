#pragma once
// Helpers for multi-process tests: a forked child process that is always
// reaped, a pipe, whole-buffer pipe I/O, and running a coroutine in a child.
// Free of Boost.Test (failures throw std::system_error, which fails the test
// case that meets them), so that corodist-bench can use it with the host bed.

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cerrno>
#include <chrono>
#include <system_error>
#include <cstdio>
#include <exception>
#include <functional>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utility>

namespace corodist::test {

/// A pipe whose ends close at scope exit.
struct pipe_pair {
  /// Throws std::system_error when pipe() fails.
  pipe_pair() {
    if (::pipe(fds) != 0)
      throw std::system_error(errno, std::generic_category(), "pipe");
  }
  ~pipe_pair() {
    close_read();
    close_write();
  }
  void close_read() {
    if (fds[0] >= 0)
      ::close(std::exchange(fds[0], -1));
  }
  void close_write() {
    if (fds[1] >= 0)
      ::close(std::exchange(fds[1], -1));
  }
  int read_end() const { return fds[0]; }
  int write_end() const { return fds[1]; }
  int fds[2] = {-1, -1};
};

inline bool write_all(int fd, const void* data, std::size_t n) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    auto w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

inline bool read_all(int fd, void* data, std::size_t n) {
  auto p = static_cast<char*>(data);
  while (n > 0) {
    auto r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

/// A forked child process, killed and reaped at scope exit if still running.
/// The child runs `body` (which must create its own asio objects) and exits
/// with its return value, or 1 if it throws; it never returns into Boost.Test.
class child_process {
public:
  /// Forks; the child runs `body`. Throws std::system_error when fork() fails.
  explicit child_process(std::function<int()> body) {
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0)
      throw std::system_error(errno, std::generic_category(), "fork");
    if (pid_ == 0) {
      int rc = 1;
      try {
        rc = body();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
      } catch (...) {
        std::fprintf(stderr, "child %d: unknown exception\n", static_cast<int>(::getpid()));
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
  }
  ~child_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      reap();
    }
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  /// The child's process id.
  pid_t pid() const noexcept { return pid_; }

  /// Waits for the child; returns its exit code (128 + signal if killed).
  int wait() {
    int rc = reap();
    pid_ = -1;
    return rc;
  }

  /// Waits for the child at most `limit` (on its pidfd: no polling); returns
  /// its exit code (128 + signal if killed), or -1 after killing a child that
  /// was still running at the limit. Throws std::system_error when
  /// pidfd_open() fails.
  int wait_for(std::chrono::milliseconds limit) {
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)); // (glibc 2.36's pidfd_open lacks extern "C")
    if (fd < 0)
      throw std::system_error(errno, std::generic_category(), "pidfd_open");
    pollfd p{fd, POLLIN, 0};
    int r;
    do {
      r = ::poll(&p, 1, static_cast<int>(limit.count()));
    } while (r < 0 && errno == EINTR);
    ::close(fd);
    if (r == 0)
      ::kill(pid_, SIGKILL);
    int rc = reap();
    pid_ = -1;
    return r == 0 ? -1 : rc;
  }

private:
  int reap() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0) {
      if (errno != EINTR)
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  pid_t pid_ = -1;
};

/// Runs `a` to completion on `ctx` (for child processes: no Boost.Test there).
template <typename T>
T run_in_child(asio::io_context& ctx, asio::awaitable<T> a) {
  std::exception_ptr error;
  asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e, auto&&...) { error = e; });
  ctx.run();
  if (error)
    std::rethrow_exception(error);
  return T();
}

} // namespace corodist::test
