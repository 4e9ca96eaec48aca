#pragma once
// Shutting down this process's TCP sockets by address: how a Gloo group
// interrupts its own blocked calls. Debian's libgloo-dev lacks a header that
// gloo/transport/tcp/pair.h includes, so the pairs' own abort entry point is
// out of reach; a shut-down socket makes Gloo's event loop see the end of the
// connection, fail every operation waiting on it, and close it, and the peer
// sees the end of the connection too.

#include <sys/socket.h>

#include <cstddef>
#include <vector>

namespace corodist::collective::detail {

/// Shuts down (SHUT_RDWR, without closing) every TCP socket of this process
/// whose local address is one of `locals` or whose peer address is one of
/// `remotes` (address and port compared). Returns how many it shut down.
std::size_t shutdown_sockets(const std::vector<sockaddr_storage>& locals,
                             const std::vector<sockaddr_storage>& remotes) noexcept;

} // namespace corodist::collective::detail
