#include <corodist/store/auth_token.hpp>

#include <cstdlib>

namespace corodist::store {

std::string resolve_auth_token(const std::optional<std::string>& token) {
  if (token)
    return *token;
  const char* env = std::getenv("CORODIST_AUTH_TOKEN");
  return env ? env : "";
}

} // namespace corodist::store
