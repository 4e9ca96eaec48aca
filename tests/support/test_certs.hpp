#pragma once
// Test helper: the TLS tests' certificates, made by scripts/make_test_certs.sh
// (the openssl command-line tool) into a fresh temporary directory that goes
// with the helper; and the TLS options that use them.

#include <corodist/net/tls.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <stdlib.h>

namespace corodist::test {

/// Whether the openssl command-line tool is on PATH (the TLS tests' precondition).
inline bool openssl_available() { return std::system("command -v openssl >/dev/null 2>&1") == 0; }

/// Boost.Test precondition: the TLS cases are skipped, with this message, without openssl.
struct needs_openssl {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(openssl_available());
    if (!r)
      r.message() << "skipped: the openssl command-line tool is not on PATH (it makes the test certificates)";
    return r;
  }
};

/// A CA, a server and a client certificate it signed, an expired one, and a
/// server certificate of another CA (see scripts/make_test_certs.sh).
struct test_certs {
  test_certs() {
    char name[] = "/tmp/corodist_tls_XXXXXX";
    BOOST_REQUIRE_MESSAGE(::mkdtemp(name) != nullptr, "mkdtemp failed");
    dir = name;
    const std::string cmd = std::string("bash " CORODIST_SOURCE_DIR "/scripts/make_test_certs.sh ") + dir;
    BOOST_REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "scripts/make_test_certs.sh failed");
  }
  ~test_certs() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  test_certs(const test_certs&) = delete;
  test_certs& operator=(const test_certs&) = delete;

  std::string path(const std::string& file) const { return dir + "/" + file; }

  /// A side that presents `name`.pem/.key and trusts the test CA.
  net::tls_options with(const std::string& name) const {
    net::tls_options o;
    o.certificate_chain_file = path(name + ".pem");
    o.private_key_file = path(name + ".key");
    o.ca_file = path("ca.pem");
    return o;
  }
  /// The server (its certificate: 127.0.0.1, ::1, localhost).
  net::tls_options server() const { return with("server"); }
  /// A server that requires a client certificate (mutual TLS).
  net::tls_options mutual_server() const {
    auto o = server();
    o.require_client_certificate = true;
    return o;
  }
  /// A client with a certificate of its own.
  net::tls_options client() const { return with("client"); }
  /// A client that verifies the server but has no certificate.
  net::tls_options anonymous_client() const {
    net::tls_options o;
    o.ca_file = path("ca.pem");
    return o;
  }

  std::string dir;
};

} // namespace corodist::test
