#pragma once
/// \file
/// corodist::store::default_timeout: the default deadline of the store's
/// waiting operations and of connecting to a store server.

#include <corodist/core/config.hpp>

#include <chrono>

namespace corodist::store {

using namespace std::chrono_literals;

/// Default time limit of waiting store operations and of connecting (c10d's
/// 300 s): what `corodist::timeout::inherit()` means for a store.
inline constexpr std::chrono::milliseconds default_timeout = 300s;

} // namespace corodist::store
