#include "net/open_from.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

namespace corodist::net::detail {

std::error_code open_from(asio::ip::tcp::socket& s, const asio::ip::tcp::endpoint& ep,
                          const std::optional<asio::ip::address>& local) {
  std::error_code ec;
  if (local && local->is_v4() != ep.address().is_v4())
    return asio::error::address_family_not_supported;
  if (s.open(ep.protocol(), ec); ec || !local)
    return ec;
#ifdef IP_BIND_ADDRESS_NO_PORT
  const int on = 1; // best effort: without it bind picks the port, per source address only
  (void)::setsockopt(s.native_handle(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &on, sizeof on);
#endif
  s.bind({*local, 0}, ec);
  return ec;
}

} // namespace corodist::net::detail
