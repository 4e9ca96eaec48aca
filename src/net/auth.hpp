#pragma once
// Challenge-response authentication of the native hello (libsodium).
#include <corodist/net/connection.hpp>

#include <array>
#include <string>

namespace corodist::net {

inline constexpr std::size_t auth_challenge_size = 32;
inline constexpr std::size_t auth_response_size = 32;

/// A fresh random challenge.
bytes auth_challenge();
/// HMAC-SHA-256 of `challenge` keyed with SHA-256(`token`).
std::array<std::byte, auth_response_size> auth_response(const std::string& token, const bytes& challenge);
/// Constant-time check of `response` against the expected one.
bool auth_verify(const std::string& token, const bytes& challenge,
                 const std::array<std::byte, auth_response_size>& response);

} // namespace corodist::net
