#pragma once
// Opening a client socket from a chosen source address (connection_options::
// local_address), for net's connect and for the store's PyTorch client.

#include <asio/ip/tcp.hpp>

#include <optional>
#include <system_error>

namespace corodist::net::detail {

/// Opens `s` for `ep` and, with a `local` address, binds it to {local, 0}
/// with IP_BIND_ADDRESS_NO_PORT: the port is picked at connect, for the
/// 4-tuple, so one source address serves as many connections per destination
/// as it has ports. Returns the error of open or bind;
/// address_family_not_supported when `local` and `ep` are of different families.
std::error_code open_from(asio::ip::tcp::socket& s, const asio::ip::tcp::endpoint& ep,
                          const std::optional<asio::ip::address>& local);

} // namespace corodist::net::detail
