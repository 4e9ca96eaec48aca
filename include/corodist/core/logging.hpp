#pragma once
/// \file
/// Logging control. corodist logs through spdlog to stderr under the logger
/// name "corodist"; the level comes from the CORODIST_LOG environment variable
/// (trace, debug, info, warn, error, critical, off; default warn).

#include <corodist/core/config.hpp>

#include <string_view>

namespace corodist {

/// Sets corodist's log level by name ("trace" ... "off").
/// Throws std::invalid_argument for an unknown name. Thread-safe.
void set_log_level(std::string_view level);

/// Returns the current log level's name. Thread-safe.
std::string_view log_level();

} // namespace corodist
