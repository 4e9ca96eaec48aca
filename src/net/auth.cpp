#include "net/auth.hpp"

#include <sodium.h>

#include <stdexcept>

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
} // namespace

bytes auth_challenge() {
  init_sodium();
  bytes c(auth_challenge_size);
  randombytes_buf(c.data(), c.size());
  return c;
}

std::array<std::byte, auth_response_size> auth_response(const std::string& token, const bytes& challenge) {
  init_sodium();
  static_assert(crypto_auth_hmacsha256_BYTES == auth_response_size);
  auto key = derive_key(token);
  std::array<std::byte, auth_response_size> mac;
  crypto_auth_hmacsha256(reinterpret_cast<unsigned char*>(mac.data()),
                         reinterpret_cast<const unsigned char*>(challenge.data()), challenge.size(), key.data());
  sodium_memzero(key.data(), key.size());
  return mac;
}

bool auth_verify(const std::string& token, const bytes& challenge,
                 const std::array<std::byte, auth_response_size>& response) {
  init_sodium();
  auto key = derive_key(token);
  // crypto_auth_hmacsha256_verify compares in constant time.
  const bool ok = crypto_auth_hmacsha256_verify(reinterpret_cast<const unsigned char*>(response.data()),
                                                reinterpret_cast<const unsigned char*>(challenge.data()),
                                                challenge.size(), key.data()) == 0;
  sodium_memzero(key.data(), key.size());
  return ok;
}

} // namespace corodist::net
