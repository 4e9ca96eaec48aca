#include "options.hpp"

#include <charconv>
#include <cmath>
#include <system_error>

namespace corodist::tools::launch {

std::vector<std::pair<std::string, std::string>> tls_env(const settings& s) {
  std::vector<std::pair<std::string, std::string>> env;
  if (!s.tls_cert.empty())
    env.emplace_back("CORODIST_TLS_CERT", s.tls_cert);
  if (!s.tls_key.empty())
    env.emplace_back("CORODIST_TLS_KEY", s.tls_key);
  if (!s.tls_ca.empty())
    env.emplace_back("CORODIST_TLS_CA", s.tls_ca);
  if (!s.tls_cert.empty() && !s.tls_ca.empty()) // every rank holds a certificate: its servers require one
    env.emplace_back("CORODIST_TLS_REQUIRE_CLIENT_CERT", "1");
  return env;
}

std::chrono::milliseconds to_ms(double s) {
  return std::chrono::milliseconds(static_cast<long long>(std::llround(s * 1000.0)));
}

// "N" or "MIN:MAX" into `s`; an error text, empty when it parsed.
std::string parse_nnodes(const std::string& text, settings& s) {
  auto colon = text.find(':');
  auto number = [](const std::string& t, int& v) {
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc{} && p == t.data() + t.size() && v >= 1 && v <= (1 << 20);
  };
  if (colon == std::string::npos) {
    if (!number(text, s.min_nodes))
      return "--nnodes '" + text + "' is not N or MIN:MAX with 1 <= MIN <= MAX";
    s.max_nodes = s.min_nodes;
    return {};
  }
  if (!number(text.substr(0, colon), s.min_nodes) || !number(text.substr(colon + 1), s.max_nodes) ||
      s.min_nodes > s.max_nodes)
    return "--nnodes '" + text + "' is not N or MIN:MAX with 1 <= MIN <= MAX";
  s.elastic = true;
  return {};
}

} // namespace corodist::tools::launch
