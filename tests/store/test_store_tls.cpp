// The store over TLS (server_options::tls, tcp_store_options::tls and their
// CORODIST_TLS_* defaults): set/get and waits through TLS; a TLS-only port
// refuses plain native and PyTorch clients with one line each and goes on
// serving its TLS clients; a client's TLS failure names the server and
// OpenSSL's reason at once (no retries). Certificates: scripts/make_test_certs.sh.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>
#include <corodist/store/tcp_store.hpp>

#include "support/log_capture.hpp"
#include "support/loop_helpers.hpp"
#include "support/test_certs.hpp"

#include <cstdlib>
#include <string>
#include <thread>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cs = corodist::store;
namespace net = corodist::net;
using asio::ip::tcp;
using corodist::event_loop;
using corodist::test::test_certs;

namespace {

std::shared_ptr<cs::store_server> tls_server(event_loop& loop, const net::tls_options& t) {
  cs::server_options so;
  so.auth_token = std::string();
  so.tls = t;
  return cs::store_server::start(loop.get_executor(), so);
}

cs::tcp_store_options tls_client(std::uint16_t port, std::optional<net::tls_options> t) {
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = std::string();
  o.timeout = 10s;
  o.tls = std::move(t);
  return o;
}

// Sets an environment variable for the scope (then removes it).
struct scoped_env {
  scoped_env(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~scoped_env() { ::unsetenv(name_); }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  const char* name_;
};

} // namespace

BOOST_AUTO_TEST_SUITE(store_tls, *utf::precondition(corodist::test::needs_openssl{}))

// A TLS store: set, get, add and a wait that another client satisfies.
BOOST_AUTO_TEST_CASE(set_get_and_wait_over_tls, *utf::timeout(60)) {
  test_certs certs;
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto server = tls_server(server_loop, certs.server());
  const auto port = server->local_endpoint().port();
  auto a = cs::tcp_store::connect_sync(loop.get_executor(), tls_client(port, certs.anonymous_client()));
  auto b = cs::tcp_store::connect_sync(loop.get_executor(), tls_client(port, certs.client()));
  cs::sync_store(a).set("k", "v");
  BOOST_TEST(cs::sync_store(b).get("k") == "v");
  BOOST_TEST(cs::sync_store(a).add("n", 2) == 2);
  std::thread setter([&] { cs::sync_store(b).set("later", "x"); });
  cs::sync_store(a).wait({"later"});
  setter.join();
  BOOST_TEST(cs::sync_store(a).get("later") == "x");
}

// The options' defaults come from CORODIST_TLS_*: a server and a client made
// with tls = nullopt speak TLS, and a client told not to (tls = {}) is refused.
BOOST_AUTO_TEST_CASE(tls_from_the_environment, *utf::timeout(60)) {
  test_certs certs;
  corodist::test::log_capture log;
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  std::shared_ptr<cs::store_server> server;
  {
    scoped_env cert("CORODIST_TLS_CERT", certs.path("server.pem"));
    scoped_env key("CORODIST_TLS_KEY", certs.path("server.key"));
    scoped_env ca("CORODIST_TLS_CA", certs.path("ca.pem"));
    cs::server_options so;
    so.auth_token = std::string();
    server = cs::store_server::start(server_loop.get_executor(), so);
    auto s = cs::tcp_store::connect_sync(loop.get_executor(), tls_client(server->local_endpoint().port(), std::nullopt));
    cs::sync_store(s).set("env", "yes");
    BOOST_TEST(cs::sync_store(s).get("env") == "yes");
  }
  auto plain = tls_client(server->local_endpoint().port(), net::tls_options{});
  BOOST_CHECK_THROW(cs::tcp_store::connect_sync(loop.get_executor(), plain), corodist::connection_error);
  BOOST_TEST(!log.wait_for("refused a plain (non-TLS) connection from 127.0.0.1:").empty());
}

// A plain native client and a PyTorch TCPStore client on a TLS-only port:
// each is refused with one line and its socket closed; the TLS client
// connected before them is served throughout.
BOOST_AUTO_TEST_CASE(plain_and_pytorch_clients_are_refused, *utf::timeout(60)) {
  test_certs certs;
  corodist::test::log_capture log;
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto server = tls_server(server_loop, certs.server());
  const auto port = server->local_endpoint().port();
  auto good = cs::tcp_store::connect_sync(loop.get_executor(), tls_client(port, certs.anonymous_client()));
  cs::sync_store(good).set("before", "1");
  asio::io_context ctx;
  tcp::socket native(ctx);
  native.connect({asio::ip::make_address("127.0.0.1"), port});
  const auto hello = net::encode(net::hello{});
  corodist::test::send_all(native, std::string_view(reinterpret_cast<const char*>(hello.data()), hello.size()));
  BOOST_TEST(corodist::test::closed_by_peer(native), "the plain native client was not disconnected");
  tcp::socket torch(ctx);
  torch.connect({asio::ip::make_address("127.0.0.1"), port});
  const char query[] = {'\x03', '\x01', 0, 0, 0, 0, 0, 0, 0, 'k'}; // PyTorch 1.13: GET, a key of 1 byte
  corodist::test::send_all(torch, std::string_view(query, sizeof query));
  BOOST_TEST(corodist::test::closed_by_peer(torch), "the PyTorch client was not disconnected");
  auto lines = log.wait_for("refused a plain (non-TLS) connection from 127.0.0.1:", 2);
  BOOST_TEST(lines.size() == 2u);
  cs::sync_store(good).set("after", "2");
  BOOST_TEST(cs::sync_store(good).get("before") == "1");
  BOOST_TEST(cs::sync_store(good).get("after") == "2");
}

// A native client without TLS to a TLS-only store: the server answers its
// hello with a TLS alert, and connect fails at once saying why (no retries
// until the timeout, as for a busy server).
BOOST_AUTO_TEST_CASE(a_plain_native_client_is_told_the_store_requires_tls, *utf::timeout(60)) {
  test_certs certs;
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto server = tls_server(server_loop, certs.server());
  const auto port = server->local_endpoint().port();
  auto o = tls_client(port, net::tls_options{}); // not enabled(): plain TCP
  o.timeout = 300s; // a retried failure would hit the test's own timeout
  try {
    cs::tcp_store::connect_sync(loop.get_executor(), o);
    BOOST_FAIL("a plain client connected to a TLS-only store");
  } catch (const corodist::connection_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("127.0.0.1:" + std::to_string(port)) != std::string::npos, what);
    BOOST_TEST(what.find("accepts TLS connections only") != std::string::npos, what);
  }
}

// A server with an expired certificate: connect fails at once (no retries
// until the timeout) with a connection_error naming the server and the reason.
BOOST_AUTO_TEST_CASE(expired_server_certificate_fails_connect_naming_the_server, *utf::timeout(60)) {
  test_certs certs;
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto server = tls_server(server_loop, certs.with("expired"));
  const auto port = server->local_endpoint().port();
  auto o = tls_client(port, certs.anonymous_client());
  o.timeout = 300s; // a retried failure would hit the test's own timeout
  try {
    cs::tcp_store::connect_sync(loop.get_executor(), o);
    BOOST_FAIL("connected to a server whose certificate has expired");
  } catch (const corodist::connection_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("127.0.0.1:" + std::to_string(port)) != std::string::npos, what);
    BOOST_TEST(what.find("certificate has expired") != std::string::npos, what);
  }
}

BOOST_AUTO_TEST_SUITE_END()
