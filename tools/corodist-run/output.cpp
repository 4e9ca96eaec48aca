#include "output.hpp"

#include <cerrno>
#include <cstdio>

#include <unistd.h>

namespace corodist::tools::launch {

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    auto w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return; // our own output is gone (EPIPE): keep supervising the ranks
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void say(const std::string& text) {
  std::string line = "corodist-run: " + text + "\n";
  write_all(2, line.data(), line.size());
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}
} // namespace corodist::tools::launch
