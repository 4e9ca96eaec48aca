#pragma once
/// \file
/// The launcher's signal handling: SIGCHLD and the signals passed on to the
/// ranks are written, one byte each, to a self-pipe that the supervisor polls;
/// a second pipe lets the store watcher (on the event loop's thread) wake it.

#include <cerrno>
#include <csignal>
#include <string>

#include <unistd.h>

namespace corodist::tools::launch {

/// The signals passed on to every rank.
inline constexpr int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP};

/// The read ends of the two pipes (valid after install_signal_handlers()).
int signal_pipe_read_end() noexcept;
int wake_pipe_read_end() noexcept;

/// Creates the pipes, installs the handler for SIGCHLD and
/// forwarded_signals, and ignores SIGPIPE. Throws std::system_error when a
/// pipe cannot be created. Call once, before any rank starts.
void install_signal_handlers();

/// Wakes the supervisor (async-signal-safe; any thread).
void wake_supervisor() noexcept;

/// Empties the wake pipe.
void drain_wake_pipe() noexcept;

/// "SIGTERM" for SIGTERM; "signal N" when the number has no name.
std::string signal_name(int sig);

/// Hands each signal number waiting in the signal pipe to `on`, oldest first.
template <typename F>
void drain_signals(F&& on) {
  unsigned char buf[64];
  for (;;) {
    auto n = ::read(signal_pipe_read_end(), buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    for (ssize_t i = 0; i < n; ++i)
      on(static_cast<int>(buf[i]));
  }
}

} // namespace corodist::tools::launch
