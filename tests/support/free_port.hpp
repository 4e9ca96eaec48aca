#pragma once
// Test helper: a loopback TCP port that was free a moment ago, for the tests
// that must name a port before anything listens on it (a rendezvous URL, a
// launcher's MASTER_PORT, a client that retries until its server appears).
// Servers that can report their port bind port 0 instead.

#include <boost/test/unit_test.hpp>

#include <cstdint>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace corodist::test {

/// Binds 127.0.0.1 port 0, reads the port the kernel chose, and closes the socket.
inline std::uint16_t free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  BOOST_REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(s);
  BOOST_REQUIRE(ok);
  return ntohs(a.sin_port);
}

} // namespace corodist::test
