#include "net/auth.hpp"

#include <sodium.h>

#include <stdexcept>
#include <string_view>

namespace corodist::net {

namespace {
void init_sodium() {
  static const int rc = sodium_init();
  if (rc < 0)
    throw std::runtime_error("libsodium failed to initialise");
}

std::array<unsigned char, crypto_auth_hmacsha256_KEYBYTES> derive_key(const std::string& token) {
  std::array<unsigned char, crypto_auth_hmacsha256_KEYBYTES> key;
  static_assert(crypto_hash_sha256_BYTES == crypto_auth_hmacsha256_KEYBYTES);
  crypto_hash_sha256(key.data(), reinterpret_cast<const unsigned char*>(token.data()), token.size());
  return key;
}

std::string_view label(auth_role role) {
  return role == auth_role::client ? std::string_view("corodist-auth-v2 client") : "corodist-auth-v2 server";
}
} // namespace

bytes auth_nonce() {
  init_sodium();
  bytes c(auth_nonce_size);
  randombytes_buf(c.data(), c.size());
  return c;
}

auth_proof make_auth_proof(const std::string& token, auth_role role, const bytes& client_nonce,
                           const bytes& server_nonce) {
  init_sodium();
  static_assert(crypto_auth_hmacsha256_BYTES == auth_proof_size);
  auto key = derive_key(token);
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key.data(), key.size());
  const auto l = label(role);
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(l.data()), l.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(client_nonce.data()), client_nonce.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(server_nonce.data()), server_nonce.size());
  auth_proof mac;
  crypto_auth_hmacsha256_final(&st, reinterpret_cast<unsigned char*>(mac.data()));
  sodium_memzero(key.data(), key.size());
  sodium_memzero(&st, sizeof st);
  return mac;
}

bool check_auth_proof(const std::string& token, auth_role role, const bytes& client_nonce, const bytes& server_nonce,
                      const auth_proof& proof) {
  const auto expected = make_auth_proof(token, role, client_nonce, server_nonce);
  return sodium_memcmp(expected.data(), proof.data(), auth_proof_size) == 0; // constant time
}

} // namespace corodist::net
