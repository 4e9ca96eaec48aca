#pragma once
// The reducer's wake-up from any thread: an eventfd that the loop's
// coroutine reads while it sleeps. Writers write only when the reader said it
// sleeps (`waiting`), so a busy loop costs them one atomic exchange.

#include <corodist/core/error.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <sys/eventfd.h>
#include <unistd.h>

namespace corodist::ddp::detail {

class wake_event {
public:
  explicit wake_event(const asio::any_io_executor& ex) : fd_(make_fd()), desc_(ex, fd_) {}
  wake_event(const wake_event&) = delete;
  wake_event& operator=(const wake_event&) = delete;

  /// Any thread, after publishing its change: wakes the reader if it sleeps.
  void notify() noexcept {
    if (waiting_.exchange(false, std::memory_order_seq_cst)) {
      const std::uint64_t one = 1;
      ssize_t r;
      do {
        r = ::write(fd_, &one, sizeof one);
      } while (r < 0 && errno == EINTR);
    }
  }

  /// The reader (on the loop): sleeps until notified, unless `ready()` (its
  /// check of the published state) is already true after announcing the sleep.
  template <typename Ready>
  asio::awaitable<void> wait(Ready&& ready) {
    waiting_.store(true, std::memory_order_seq_cst);
    if (ready()) {
      waiting_.store(false, std::memory_order_relaxed);
      co_return;
    }
    std::uint64_t count = 0;
    co_await desc_.async_read_some(asio::buffer(&count, sizeof count), asio::use_awaitable);
    waiting_.store(false, std::memory_order_relaxed);
  }

private:
  static int make_fd() {
    const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0)
      throw error(std::string("ddp::reducer: eventfd failed: ") + std::strerror(errno));
    return fd;
  }

  int fd_;
  asio::posix::stream_descriptor desc_; // owns fd_
  std::atomic<bool> waiting_{false};
};

} // namespace corodist::ddp::detail
