#pragma once
/// \file
/// corodist::store::resolve_auth_token: where a server's or client's shared
/// secret comes from (the option, else CORODIST_AUTH_TOKEN). The store server,
/// its clients and the RPC agent read their `auth_token` options through it.

#include <corodist/core/config.hpp>

#include <optional>
#include <string>

namespace corodist::store {

/// Returns `token` if set, else the value of CORODIST_AUTH_TOKEN, else "" (no
/// authentication). Reads the environment; any thread; never throws except bad_alloc.
std::string resolve_auth_token(const std::optional<std::string>& token);

} // namespace corodist::store
