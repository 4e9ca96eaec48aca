// RPC channels over TLS (agent_options::tls): a mutual-TLS job calls across
// (values and an attachment), and an agent whose certificate another CA
// signed cannot reach the job's workers: its call fails naming the reason.
// Linked into test_rpc (BOOST_TEST_MODULE is in test_rpc.cpp).
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/rpc/errors.hpp>

#include "rpc/rpc_fixtures.hpp"
#include "support/test_certs.hpp"

#include <string>

namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
using namespace std::chrono_literals;
using corodist::test::cluster;
using corodist::test::test_certs;

BOOST_AUTO_TEST_SUITE(rpc_tls, *utf::precondition(corodist::test::needs_openssl{}))

// Every worker presents a certificate of the job's CA and requires one of
// its peers: calls both ways work (both ends dial and accept over TLS).
BOOST_AUTO_TEST_CASE(mutual_tls_calls_round_trip, *utf::timeout(60)) {
  test_certs certs;
  cluster c(2, [&](rpc::agent_options& o) {
    auto t = certs.client(); // (its SAN: 127.0.0.1, where the agents listen)
    t.require_client_certificate = true;
    o.tls = t;
  });
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 2, 3) == 5);
  BOOST_TEST(c[1].rpc_sync<int>("w0", "add", 4, 5) == 9);
  const std::string big(3 << 20, 'x');
  BOOST_TEST(c[0].rpc_sync<std::string>("w1", "concat", big, std::string("y")) == big + "y");
  std::vector<std::byte> bytes(std::size_t{8} << 20);
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<std::byte>(i * 7);
  rpc::attachment a(std::move(bytes));
  auto back = c[1].rpc_sync<rpc::attachment>("w0", "echo_att", a);
  BOOST_REQUIRE_EQUAL(back.size(), a.size());
  BOOST_TEST(std::equal(back.data(), back.data() + back.size(), a.data()));
}

// Worker 1's certificate comes from another CA: worker 0's call to it fails
// with a connection_error that names the verification failure, and worker 0
// goes on calling itself.
BOOST_AUTO_TEST_CASE(peer_of_another_ca_is_refused, *utf::timeout(60)) {
  test_certs certs;
  cluster c(2, [&](rpc::agent_options& o) {
    auto t = o.rank == 1 ? certs.with("wrong_ca") : certs.client();
    t.require_client_certificate = true;
    o.tls = t;
  });
  try {
    c[0].rpc_sync<int>("w1", "add", 1, 1);
    BOOST_FAIL("a call reached a peer whose certificate another CA signed");
  } catch (const corodist::connection_error& e) {
    BOOST_TEST(std::string(e.what()).find("certificate verify failed") != std::string::npos, e.what());
  }
  BOOST_TEST(c[0].rpc_sync<int>("w0", "add", 1, 1) == 2);
}

BOOST_AUTO_TEST_SUITE_END()
