#pragma once
// Private logging entry point: every corodist source logs through logger().
#include <spdlog/spdlog.h>

namespace corodist::detail {

/// The "corodist" spdlog logger (stderr), created on first use with the
/// level from CORODIST_LOG. Thread-safe.
spdlog::logger& logger();

} // namespace corodist::detail

// Trace and debug lines (a line per frame or per connection) evaluate their
// arguments only when their level is on.
#define CORODIST_LOG_AT(level, ...)                                                                                    \
  do {                                                                                                                 \
    if (::corodist::detail::logger().should_log(level))                                                                \
      ::corodist::detail::logger().log(level, __VA_ARGS__);                                                            \
  } while (false)
#define CORODIST_LOG_TRACE(...) CORODIST_LOG_AT(::spdlog::level::trace, __VA_ARGS__)
#define CORODIST_LOG_DEBUG(...) CORODIST_LOG_AT(::spdlog::level::debug, __VA_ARGS__)
#define CORODIST_LOG_INFO(...) ::corodist::detail::logger().info(__VA_ARGS__)
#define CORODIST_LOG_WARN(...) ::corodist::detail::logger().warn(__VA_ARGS__)
#define CORODIST_LOG_ERROR(...) ::corodist::detail::logger().error(__VA_ARGS__)
