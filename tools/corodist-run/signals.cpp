#include "signals.hpp"

#include <cstring>
#include <system_error>

#include <fcntl.h>

namespace corodist::tools::launch {

namespace {

int signal_pipe[2] = {-1, -1};
int wake_pipe[2] = {-1, -1}; // the store watcher (on the loop thread) wakes the supervisor

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] auto n = ::write(signal_pipe[1], &b, 1);
  errno = saved;
}

} // namespace

int signal_pipe_read_end() noexcept { return signal_pipe[0]; }
int wake_pipe_read_end() noexcept { return wake_pipe[0]; }

void install_signal_handlers() {
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0 || ::pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::system_error(errno, std::generic_category(), "pipe2");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, nullptr);
  for (int sig : forwarded_signals)
    ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

void wake_supervisor() noexcept {
  const char b = 'w';
  [[maybe_unused]] auto n = ::write(wake_pipe[1], &b, 1);
}

void drain_wake_pipe() noexcept {
  char buf[64];
  while (::read(wake_pipe[0], buf, sizeof buf) > 0) {
  }
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

} // namespace corodist::tools::launch
