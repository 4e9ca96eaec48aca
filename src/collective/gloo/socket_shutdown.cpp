#include "collective/gloo/socket_shutdown.hpp"

#include <cstdlib>
#include <cstring>

#include <dirent.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

namespace corodist::collective::detail {

namespace {

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) noexcept {
  if (a.ss_family != b.ss_family)
    return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

bool any_of(const std::vector<sockaddr_storage>& set, const sockaddr_storage& s) noexcept {
  for (const auto& e : set)
    if (same_endpoint(e, s))
      return true;
  return false;
}

} // namespace

std::size_t shutdown_sockets(const std::vector<sockaddr_storage>& locals,
                             const std::vector<sockaddr_storage>& remotes) noexcept {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr)
    return 0;
  std::size_t n = 0;
  const int dir_fd = ::dirfd(dir);
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dir_fd)
      continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode))
      continue;
    sockaddr_storage local{}, peer{};
    socklen_t len = sizeof local;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &len) != 0)
      continue;
    if (local.ss_family != AF_INET && local.ss_family != AF_INET6)
      continue;
    len = sizeof peer;
    const bool connected = ::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &len) == 0;
    if (!connected)
      continue; // a listener: nothing waits on it once connected
    if (any_of(locals, local) || any_of(remotes, peer)) {
      ::shutdown(static_cast<int>(fd), SHUT_RDWR);
      ++n;
    }
  }
  ::closedir(dir);
  return n;
}

} // namespace corodist::collective::detail
