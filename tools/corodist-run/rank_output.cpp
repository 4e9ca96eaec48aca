#include "rank_output.hpp"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <termios.h>
#include <unistd.h>

namespace corodist::tools::launch {

namespace {

// A pseudo-terminal's master and slave, both close-on-exec, the slave in raw
// mode; false (nothing left open) when the system has none.
bool open_terminal(int& master, int& slave) {
  int m = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (m < 0)
    return false;
  char name[128];
  if (::grantpt(m) != 0 || ::unlockpt(m) != 0 || ::ptsname_r(m, name, sizeof name) != 0) {
    ::close(m);
    return false;
  }
  // O_NOCTTY: the rank (a process group of ours, not a session) never gets it
  // as its controlling terminal, so no SIGHUP/SIGTTOU comes from it.
  int s = ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (s < 0) {
    ::close(m);
    return false;
  }
  termios t{};
  if (::tcgetattr(s, &t) == 0) {
    ::cfmakeraw(&t); // bytes pass as written: no "\n" -> "\r\n", no echo, no signal characters
    ::tcsetattr(s, TCSANOW, &t);
  }
  master = m;
  slave = s;
  return true;
}

} // namespace

output_channel::output_channel(bool terminal) {
  if (terminal && open_terminal(read_, write_)) {
    terminal_ = true;
    return;
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw std::system_error(errno, std::generic_category(), "pipe2");
  read_ = fds[0];
  write_ = fds[1];
}

output_channel::~output_channel() {
  if (read_ >= 0)
    ::close(read_);
  if (write_ >= 0)
    ::close(write_);
}

int output_channel::release_read_end() noexcept { return std::exchange(read_, -1); }

int open_rank_log(const std::string& dir, long long generation, int rank, const std::string& name) {
  const auto folder =
      std::filesystem::path(dir) / ("attempt_" + std::to_string(generation)) / std::to_string(rank);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  const auto path = (folder / name).string();
  if (ec)
    throw std::system_error(ec, "--log-dir: cannot create " + folder.string());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::system_error(errno, std::generic_category(), "--log-dir: cannot open " + path);
  return fd;
}

} // namespace corodist::tools::launch
