#include "core/log.hpp"

#include <corodist/core/logging.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cctype>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace corodist {
namespace detail {

namespace {
spdlog::level::level_enum parse_level(std::string_view name) {
  std::string lower(name); // level names in any case: DEBUG, Debug, debug
  for (auto& c : lower)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto lvl = spdlog::level::from_str(lower);
  // from_str maps unknown names to "off"; only accept "off" when asked for.
  if (lvl == spdlog::level::off && lower != "off")
    throw std::invalid_argument("corodist: unknown log level '" + std::string(name) +
                                "' (trace, debug, info, warn, error, critical, off)");
  return lvl;
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto lg = spdlog::stderr_color_mt("corodist");
  lg->set_pattern("[%H:%M:%S.%e] [corodist] [%^%l%$] [%t] %v");
  auto lvl = spdlog::level::warn;
  if (const char* env = std::getenv("CORODIST_LOG"); env && *env) {
    try {
      lvl = parse_level(env);
    } catch (const std::invalid_argument& e) {
      lg->warn("{}; using warn", e.what());
    }
  }
  lg->set_level(lvl);
  return lg;
}
} // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> lg = make_logger();
  return *lg;
}

} // namespace detail

void set_log_level(std::string_view level) { detail::logger().set_level(detail::parse_level(level)); }

std::string_view log_level() {
  auto sv = spdlog::level::to_string_view(detail::logger().level());
  return {sv.data(), sv.size()};
}

} // namespace corodist
