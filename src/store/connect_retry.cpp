#include "store/connect_retry.hpp"

#include <corodist/core/error.hpp>
#include <corodist/net/errors.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"

#include <asio/steady_timer.hpp>

#include <algorithm>
#include <random>

namespace corodist::store::detail {

namespace {
using corodist::detail::use_tuple;
using ms = std::chrono::milliseconds;
constexpr ms first_backoff{10};
constexpr ms max_backoff{1000};

bool permanent(std::error_code ec) {
  return ec == net::errc::bad_magic || ec == net::errc::unsupported_version || ec == net::errc::auth_required ||
         ec == net::errc::auth_failed || ec == net::errc::auth_not_offered || ec == net::errc::bad_hello;
}
} // namespace

std::string where(const tcp_store_options& opts) {
  const bool v6 = opts.host.find(':') != std::string::npos;
  return (v6 ? "[" + opts.host + "]" : opts.host) + ":" + std::to_string(opts.port);
}

asio::awaitable<void> connect_with_retry(asio::any_io_executor ex, const tcp_store_options& opts, const char* what,
                                         const connect_attempt& attempt_fn) {
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  thread_local std::mt19937_64 rng(std::random_device{}()); // jitter only: no need to reseed per connect
  auto backoff = first_backoff;
  std::error_code last;
  asio::ip::tcp::resolver resolver(ex);
  for (int attempt = 1;; ++attempt) {
    auto [rec, results] = co_await resolver.async_resolve(opts.host, std::to_string(opts.port), use_tuple);
    if (rec) {
      last = rec;
    } else {
      for (const auto& entry : results) {
        auto left = std::chrono::duration_cast<ms>(deadline - std::chrono::steady_clock::now());
        auto ec = co_await attempt_fn(entry.endpoint(), std::max(ms(1), left));
        if (!ec) {
          if (attempt > 1)
            CORODIST_LOG_INFO("store: connected to the {} at {} after {} attempts", what, where(opts), attempt);
          co_return;
        }
        if (permanent(ec))
          net::throw_net_error(ec, "store: connecting to " + where(opts));
        last = ec;
      }
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      throw timeout_error("store: could not connect to " + where(opts) + " within " +
                          std::to_string(opts.timeout.count()) + " ms (" + std::to_string(attempt) +
                          " attempts; last error: " + last.message() + ")");
    // Exponential backoff with +-25 % jitter, never past the deadline.
    std::uniform_real_distribution<double> jitter(0.75, 1.25);
    auto pause = std::chrono::duration_cast<ms>(backoff * jitter(rng));
    pause = std::min(pause, std::chrono::duration_cast<ms>(deadline - now));
    asio::steady_timer t(ex, pause);
    co_await t.async_wait(use_tuple);
    backoff = std::min(backoff * 2, max_backoff);
  }
}

} // namespace corodist::store::detail
