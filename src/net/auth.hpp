#pragma once
// Mutual challenge-response authentication of the native hello (libsodium).
//
// Both sides send a fresh 32-byte nonce; each proves it holds the token with
// HMAC-SHA-256(key = SHA-256(token), role || own-side nonce order), the role
// label keeping a server's proof from ever serving as a client's and the two
// nonces keeping any proof from serving in another connection.
#include <corodist/net/connection.hpp>

#include <array>
#include <string>

namespace corodist::net {

inline constexpr std::size_t auth_nonce_size = 32;
inline constexpr std::size_t auth_proof_size = 32;

using auth_proof = std::array<std::byte, auth_proof_size>;

/// Who proves: the role is part of what the proof covers.
enum class auth_role { client, server };

/// A fresh random nonce.
bytes auth_nonce();

/// The proof `role` sends: HMAC over the role's label, the client's nonce and the server's.
auth_proof make_auth_proof(const std::string& token, auth_role role, const bytes& client_nonce,
                           const bytes& server_nonce);

/// Constant-time check of a peer's proof.
bool check_auth_proof(const std::string& token, auth_role role, const bytes& client_nonce, const bytes& server_nonce,
                      const auth_proof& proof);

} // namespace corodist::net
