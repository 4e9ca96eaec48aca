#pragma once
// Gloo writes to its sockets with plain writev, so a peer that died can raise
// SIGPIPE in the writing thread, whose default action ends the process
// (PyTorch's processes ignore SIGPIPE: Python does). corodist leaves the
// process's signal handling alone: the threads it makes for Gloo block
// SIGPIPE (a blocked SIGPIPE just makes the write fail with EPIPE), and a
// caller's thread that posts to Gloo does so under a sigpipe_guard.

#include <signal.h>

namespace corodist::collective::detail {

/// Blocks SIGPIPE in the calling thread for its lifetime; a SIGPIPE raised
/// meanwhile is consumed before the previous mask comes back.
class sigpipe_guard {
public:
  sigpipe_guard() noexcept {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~sigpipe_guard() {
    if (!was_pending_ && sigismember(&old_, SIGPIPE) != 1) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      timespec zero{0, 0};
      while (sigtimedwait(&pipe, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  sigpipe_guard(const sigpipe_guard&) = delete;
  sigpipe_guard& operator=(const sigpipe_guard&) = delete;

private:
  sigset_t old_;
  bool was_pending_ = false;
};

} // namespace corodist::collective::detail
