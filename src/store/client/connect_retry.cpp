#include "store/client/connect_retry.hpp"

#include <corodist/core/error.hpp>
#include <corodist/net/errors.hpp>
#include <corodist/net/tls.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "net/open_from.hpp"
#include "store/wait_log.hpp"

#include <asio/error.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <random>
#include <vector>

namespace corodist::store::detail {

namespace {
using corodist::detail::use_tuple;
using ms = std::chrono::milliseconds;
constexpr ms first_backoff{10};
constexpr ms max_backoff{1000};

// A malformed answer, a wrong version or token: retrying cannot help. Not
// closed_before_hello (EOF before any byte of the server's hello): a server may
// close connections it cannot take yet, and the next attempt may be served.
bool permanent(std::error_code ec) {
  return ec == net::errc::bad_magic || ec == net::errc::unsupported_version || ec == net::errc::auth_required ||
         ec == net::errc::auth_failed || ec == net::errc::auth_not_offered || ec == net::errc::bad_hello ||
         ec == net::errc::tls_required || net::is_tls_error(ec);
}

ms since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - t);
}
} // namespace


std::optional<asio::ip::address> source_address(asio::any_io_executor ex, const tcp_store_options& opts) {
  if (opts.source_address.empty())
    return std::nullopt;
  std::error_code ec;
  auto addr = asio::ip::make_address(opts.source_address, ec);
  if (ec)
    throw usage_error("store: source_address \"" + opts.source_address +
                      "\" is not an IP address (give an IPv4 or IPv6 literal of this host, e.g. 127.0.0.2)");
  asio::ip::tcp::socket probe(ex);
  if (ec = net::detail::open_from(probe, {addr, 0}, addr); ec)
    throw usage_error("store: cannot connect from source_address " + opts.source_address + ": " + ec.message() +
                      " (it must be an address of this host)");
  return addr;
}

std::string where(const tcp_store_options& opts) {
  const bool v6 = opts.host.find(':') != std::string::npos;
  return (v6 ? "[" + opts.host + "]" : opts.host) + ":" + std::to_string(opts.port);
}

asio::awaitable<void> connect_with_retry(asio::any_io_executor ex, const tcp_store_options& opts, const char* what,
                                         const connect_attempt& attempt_fn) {
  const auto start = std::chrono::steady_clock::now();
  const auto limit = opts.timeout.or_else(default_timeout);
  const auto by = limit.from(start);
  const auto limit_text = limit.is_finite() ? duration_text(limit.length()) : std::string("never");
  const auto schedule = warnings();
  auto next_warning = start + schedule.first;
  thread_local std::mt19937_64 rng(std::random_device{}()); // jitter only: no need to reseed per connect
  auto backoff = first_backoff;
  std::error_code last;
  asio::ip::tcp::resolver resolver(ex);
  const auto& source = opts.connection.local_address;
  // An address literal needs no resolver (a thread hop and a getaddrinfo per attempt).
  std::error_code literal_ec;
  const auto literal = asio::ip::make_address(opts.host, literal_ec);
  CORODIST_LOG_DEBUG("store: connecting to the {} at {}{} (gives up after {})", what, where(opts),
                     source ? " from " + source->to_string() : std::string(), limit_text);
  std::vector<asio::ip::tcp::endpoint> endpoints;
  for (int attempt = 1;; ++attempt) {
    bool refused = false; // every address refused: nothing listens there
    endpoints.clear();
    std::error_code rec;
    if (!literal_ec) {
      endpoints.emplace_back(literal, opts.port);
    } else {
      auto [ec, results] = co_await resolver.async_resolve(opts.host, std::to_string(opts.port), use_tuple);
      rec = ec;
      for (const auto& entry : results)
        endpoints.push_back(entry.endpoint());
    }
    if (source && !rec) {
      const bool v4 = source->is_v4();
      std::erase_if(endpoints, [v4](const asio::ip::tcp::endpoint& ep) { return ep.address().is_v4() != v4; });
      if (endpoints.empty())
        throw usage_error("store: " + where(opts) + " has no " + (v4 ? "IPv4" : "IPv6") +
                          " address to connect to from source_address " + source->to_string());
    }
    if (rec) {
      last = rec;
    } else {
      refused = true;
      for (const auto& ep : endpoints) {
        auto ec = co_await attempt_fn(ep, by);
        if (!ec) {
          if (attempt > 1)
            CORODIST_LOG_INFO("store: connected to the {} at {} after {} attempts ({})", what, where(opts), attempt,
                              duration_text(since(start)));
          co_return;
        }
        if (permanent(ec))
          net::throw_net_error(ec, "store: connecting to " + where(opts));
        refused = refused && ec == asio::error::connection_refused;
        last = ec;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    const auto window = opts.refused_retry_window.or_else(corodist::timeout::never());
    if (refused && window.is_finite() && now - start >= window.length())
      throw connection_error("store: nothing is listening on " + where(opts) + " (connection refused; retried for " +
                             duration_text(since(start)) + ", " + std::to_string(attempt) + " attempts)");
    if (by.expired(now))
      throw timeout_error("store: could not connect to the " + std::string(what) + " at " + where(opts) + " within " +
                          limit_text + " (" + std::to_string(attempt) +
                          " attempts; last error: " + last.message() + ")");
    // Exponential backoff with +-25 % jitter, never past the deadline (nor the refused window).
    std::uniform_real_distribution<double> jitter(0.75, 1.25);
    auto pause = std::chrono::duration_cast<ms>(backoff * jitter(rng));
    if (!by.is_never())
      pause = std::min(pause, std::chrono::ceil<ms>(by.remaining(now)));
    if (refused && window.is_finite())
      pause = std::min(pause, std::chrono::ceil<ms>(start + window.length() - now));
    CORODIST_LOG_DEBUG("store: attempt {} to connect to the {} at {} failed: {}; next in {} ms", attempt, what,
                       where(opts), last.message(), pause.count());
    if (now >= next_warning) {
      CORODIST_LOG_WARN("store: still connecting to the {} at {} after {} ({} attempts; last error: {}{}; gives up "
                        "after {})",
                        what, where(opts), duration_text(since(start)), attempt, last.message(),
                        refused ? " (nothing listens there: is the server up, and the address and port right?)" : "",
                        limit_text);
      next_warning += schedule.every;
    }
    asio::steady_timer t(ex, pause);
    co_await t.async_wait(use_tuple);
    backoff = std::min(backoff * 2, max_backoff);
  }
}

} // namespace corodist::store::detail
