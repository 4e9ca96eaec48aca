#pragma once
// Helpers for multi-process tests: a forked child process that is always
// reaped, a pipe, whole-buffer pipe I/O, and running a coroutine in a child.
// Free of Boost.Test (failures throw std::system_error, which fails the test
// case that meets them), so that corodist-bench can use it with the host bed.

#include <asio/any_io_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>
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

/// Event loops of this test process that park their thread while a child is
/// forked (a store server's loop, which allocates as earlier children
/// connect). Under AddressSanitizer (GCC 12's libsanitizer) an allocator lock
/// that another thread holds at fork() stays locked in the child, whose
/// first allocation of that size then hangs; a thread parked in a condition
/// wait holds none. Loops register for their lifetime (loop_parking).
class fork_parking {
public:
  static fork_parking& instance() {
    static fork_parking p;
    return p;
  }
  void add(asio::any_io_executor ex) {
    std::lock_guard lk(m_);
    loops_.push_back(std::move(ex));
  }
  void remove(const asio::any_io_executor& ex) {
    std::lock_guard lk(m_);
    std::erase(loops_, ex);
  }
  /// Parks every registered loop's thread (each waits at most 2 s for its turn).
  void park() {
    m_.lock(); // held until unpark(): no loop comes or goes meanwhile
    gate_ = std::make_shared<gate>();
    for (auto& ex : loops_) {
      asio::post(ex, [g = gate_] {
        std::unique_lock lk(g->m);
        ++g->parked;
        g->cv.notify_all();
        g->cv.wait_for(lk, std::chrono::seconds(10), [&] { return g->released; });
      });
    }
    std::unique_lock lk(gate_->m);
    gate_->cv.wait_for(lk, std::chrono::seconds(2), [&] { return gate_->parked == loops_.size(); });
  }
  /// In a new child: none of the registered loops' threads exist here;
  /// forget them, and the lock park() took.
  void forget_in_child() {
    gate_.reset();
    loops_.clear();
    m_.unlock();
  }
  void unpark() {
    {
      std::lock_guard lk(gate_->m);
      gate_->released = true;
    }
    gate_->cv.notify_all();
    gate_.reset();
    m_.unlock();
  }

private:
  struct gate {
    std::mutex m;
    std::condition_variable cv;
    std::size_t parked = 0;
    bool released = false;
  };
  std::mutex m_;
  std::vector<asio::any_io_executor> loops_;
  std::shared_ptr<gate> gate_;
};

/// Registers a loop's executor with fork_parking for this object's lifetime
/// (destroy it before the loop stops).
class loop_parking {
public:
  explicit loop_parking(asio::any_io_executor ex) : ex_(std::move(ex)) { fork_parking::instance().add(ex_); }
  ~loop_parking() { fork_parking::instance().remove(ex_); }
  loop_parking(const loop_parking&) = delete;
  loop_parking& operator=(const loop_parking&) = delete;

private:
  asio::any_io_executor ex_;
};

/// A forked child process, killed and reaped at scope exit if still running.
/// The child runs `body` (which must create its own asio objects) and exits
/// with its return value, or 1 if it throws; it never returns into Boost.Test.
class child_process {
public:
  /// Forks; the child runs `body`. Throws std::system_error when fork() fails.
  explicit child_process(std::function<int()> body) {
    std::fflush(nullptr);
    fork_parking::instance().park();
    pid_ = ::fork();
    if (pid_ != 0)
      fork_parking::instance().unpark();
    else
      fork_parking::instance().forget_in_child();
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
