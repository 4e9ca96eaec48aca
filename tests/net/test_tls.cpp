// TLS under net::connection (connection_options::tls): round trips with and
// without client certificates, the errors of an expired, a wrong-CA and a
// missing certificate (each naming OpenSSL's reason), a plain client refused
// by a TLS listener that goes on serving its TLS clients, and a 64 MiB
// payload through the TLS records. Certificates: scripts/make_test_certs.sh.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/net/listener.hpp>
#include <corodist/net/tls.hpp>

#include "support/coro_test.hpp"
#include "support/log_capture.hpp"
#include "support/loop_helpers.hpp"
#include "support/test_certs.hpp"

#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <future>
#include <memory>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace net = corodist::net;
using asio::ip::tcp;
using corodist::event_loop;
using corodist::test::run_coro;
using corodist::test::test_certs;

namespace {

constexpr std::uint16_t kind_echo = 1;

// A listener on its own loop thread whose connections echo every request.
struct echo_server {
  explicit echo_server(net::connection_options opts) {
    std::promise<tcp::endpoint> ready;
    asio::post(loop.get_executor(), [&] {
      auto [ec, l] = net::listener::listen(loop.get_executor(), {asio::ip::make_address("127.0.0.1"), 0}, opts,
                                           [this](std::shared_ptr<net::connection> c) {
                                             accepted_tls.push_back(c->is_tls());
                                             c->start([](const std::shared_ptr<net::connection>& conn,
                                                         net::message&& m) {
                                               conn->respond(m.header.request_id, m.header.kind, std::move(m.payload));
                                             });
                                           });
      BOOST_REQUIRE_MESSAGE(!ec, "listen: " << ec.message());
      listener = l;
      listener->start();
      ready.set_value(listener->local_endpoint());
    });
    loop.start();
    endpoint = ready.get_future().get();
  }
  ~echo_server() {
    asio::post(loop.get_executor(), [l = listener] { l->close(); });
    loop.stop();
  }
  std::vector<bool> accepted_tls; // (loop thread) is_tls() of each accepted connection
  event_loop loop;
  std::shared_ptr<net::listener> listener;
  tcp::endpoint endpoint;
};

net::connection_options over_tls(const net::tls_options& o) {
  net::connection_options c;
  c.tls = net::tls_context::make(o);
  return c;
}

asio::awaitable<std::pair<std::error_code, std::shared_ptr<net::connection>>> dial(tcp::endpoint ep,
                                                                                   net::connection_options o) {
  co_return co_await net::connection::connect(co_await asio::this_coro::executor, ep, o);
}

// Connects with `o`, echoes `payload` once and returns what came back.
asio::awaitable<net::bytes> echo_once(tcp::endpoint ep, net::connection_options o, net::bytes payload) {
  auto [ec, c] = co_await dial(ep, o);
  BOOST_REQUIRE_MESSAGE(!ec, "connect: " << ec.message());
  BOOST_TEST(c->is_tls() == (o.tls != nullptr));
  c->start();
  auto r = co_await c->request(kind_echo, std::move(payload), {}, corodist::deadline::after(20s));
  BOOST_REQUIRE_MESSAGE(!r.ec, "request: " << r.ec.message());
  c->close();
  co_return std::move(r.msg.payload);
}

// The error of connecting with `o` to `ep` (which must fail).
std::error_code failed_connect(tcp::endpoint ep, net::connection_options o) {
  asio::io_context ctx;
  auto [ec, c] = run_coro(ctx, dial(ep, o));
  BOOST_TEST(!c);
  return ec;
}

} // namespace

BOOST_AUTO_TEST_SUITE(net_tls, *utf::precondition(corodist::test::needs_openssl{}))

// A TLS server, a client that trusts its CA: the echo round trip works and
// both ends say they are on TLS.
BOOST_AUTO_TEST_CASE(round_trip_over_tls, *utf::timeout(60)) {
  test_certs certs;
  echo_server srv(over_tls(certs.server()));
  asio::io_context ctx;
  const net::bytes p{std::byte{1}, std::byte{2}, std::byte{3}};
  BOOST_TEST((run_coro(ctx, echo_once(srv.endpoint, over_tls(certs.anonymous_client()), p)) == p));
  auto seen = corodist::test::on_loop(srv.loop, [&] { return srv.accepted_tls; });
  BOOST_TEST(seen == std::vector<bool>{true});
}

// Mutual TLS: the server requires a client certificate; a client with one
// signed by the CA is served.
BOOST_AUTO_TEST_CASE(mutual_tls_round_trip, *utf::timeout(60)) {
  test_certs certs;
  echo_server srv(over_tls(certs.mutual_server()));
  asio::io_context ctx;
  const net::bytes p(100, std::byte{7});
  BOOST_TEST((run_coro(ctx, echo_once(srv.endpoint, over_tls(certs.client()), p)) == p));
}

// A server whose certificate has expired: the client's error is a
// verification failure that says so.
BOOST_AUTO_TEST_CASE(expired_server_certificate_is_refused, *utf::timeout(60)) {
  test_certs certs;
  echo_server srv(over_tls(certs.with("expired")));
  const auto ec = failed_connect(srv.endpoint, over_tls(certs.anonymous_client()));
  BOOST_TEST((ec.category() == net::tls_verify_category()), ec.category().name());
  BOOST_TEST(ec.message() == "certificate verify failed: certificate has expired");
}

// A server certificate of another CA: the client cannot chain it to its CA.
BOOST_AUTO_TEST_CASE(wrong_ca_server_certificate_is_refused, *utf::timeout(60)) {
  test_certs certs;
  echo_server srv(over_tls(certs.with("wrong_ca")));
  const auto ec = failed_connect(srv.endpoint, over_tls(certs.anonymous_client()));
  BOOST_TEST((ec.category() == net::tls_verify_category()), ec.category().name());
  BOOST_TEST(ec.message().find("certificate verify failed: unable to get local issuer certificate") == 0,
             ec.message());
}

// A client certificate of another CA against a mutual-TLS server: the server
// refuses it ("unknown ca" alert), the client reports the alert, and the
// server logs whom it rejected.
BOOST_AUTO_TEST_CASE(client_certificate_of_another_ca_is_refused, *utf::timeout(60)) {
  test_certs certs;
  corodist::test::log_capture log;
  echo_server srv(over_tls(certs.mutual_server()));
  auto o = certs.with("wrong_ca");
  const auto ec = failed_connect(srv.endpoint, over_tls(o));
  BOOST_TEST(ec.message().find("unknown ca") != std::string::npos, ec.message());
  auto lines = log.wait_for("rejected connection from 127.0.0.1:");
  BOOST_REQUIRE(!lines.empty());
  BOOST_TEST(lines[0].find("certificate verify failed") != std::string::npos, lines[0]);
}

// A client without a certificate against a server that requires one.
BOOST_AUTO_TEST_CASE(client_without_certificate_is_refused_by_mutual_tls, *utf::timeout(60)) {
  test_certs certs;
  echo_server srv(over_tls(certs.mutual_server()));
  const auto ec = failed_connect(srv.endpoint, over_tls(certs.anonymous_client()));
  BOOST_TEST(ec.message().find("certificate required") != std::string::npos, ec.message());
}

// The name the client checks: a server_name the certificate does not carry is
// refused; "localhost" (a DNS name of the certificate) is served.
BOOST_AUTO_TEST_CASE(server_name_is_checked, *utf::timeout(60)) {
  test_certs certs;
  echo_server srv(over_tls(certs.server()));
  auto wrong = certs.anonymous_client();
  wrong.server_name = "elsewhere.example";
  const auto ec = failed_connect(srv.endpoint, over_tls(wrong));
  BOOST_TEST(ec.message() == "certificate verify failed: hostname mismatch");
  auto right = certs.anonymous_client();
  right.server_name = "localhost";
  asio::io_context ctx;
  const net::bytes p{std::byte{9}};
  BOOST_TEST((run_coro(ctx, echo_once(srv.endpoint, over_tls(right), p)) == p));
}

// A plain client on a TLS port is refused with one line naming it; a TLS
// client connected before goes on being served, and so is one that comes after.
BOOST_AUTO_TEST_CASE(plain_client_is_refused_and_tls_clients_are_served, *utf::timeout(60)) {
  test_certs certs;
  corodist::test::log_capture log;
  echo_server srv(over_tls(certs.server()));
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    auto [ec, before] = co_await dial(srv.endpoint, over_tls(certs.anonymous_client()));
    BOOST_REQUIRE_MESSAGE(!ec, ec.message());
    before->start();
    const net::connection_options plain_options; // (named: GCC 12 destroys a braced temporary twice in co_await)
    auto [pec, plain] = co_await dial(srv.endpoint, plain_options);
    BOOST_TEST(pec, "a plain client connected to a TLS port");
    const net::bytes p{std::byte{5}};
    auto r = co_await before->request(kind_echo, p, {}, corodist::deadline::after(20s));
    BOOST_TEST(!r.ec, r.ec.message());
    BOOST_TEST((r.msg.payload == p));
    BOOST_TEST((co_await echo_once(srv.endpoint, over_tls(certs.anonymous_client()), p) == p));
    before->close();
  }());
  auto lines = log.wait_for("refused a plain (non-TLS) connection from 127.0.0.1:");
  BOOST_REQUIRE_EQUAL(lines.size(), 1u);
  BOOST_TEST(lines[0].find("this port requires TLS") != std::string::npos, lines[0]);
}

// 64 MiB out and back through TLS records, as one frame's segment.
BOOST_AUTO_TEST_CASE(echo_64_mib_over_tls, *utf::timeout(120)) {
  test_certs certs;
  echo_server srv(over_tls(certs.server()));
  asio::io_context ctx;
  run_coro(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto [ec, c] = co_await dial(srv.endpoint, over_tls(certs.anonymous_client()));
        BOOST_REQUIRE_MESSAGE(!ec, ec.message());
        c->start();
        auto big = std::make_shared<std::vector<std::byte>>(std::size_t{64} << 20);
        for (std::size_t i = 0; i < big->size(); ++i)
          (*big)[i] = static_cast<std::byte>(i * 131 + (i >> 20));
        std::vector<net::segment> segs{net::segment{big, asio::buffer(*big)}};
        auto r = co_await c->request(kind_echo, {}, std::move(segs), corodist::deadline::after(60s));
        BOOST_REQUIRE_MESSAGE(!r.ec, r.ec.message());
        BOOST_REQUIRE_EQUAL(r.msg.payload.size(), big->size());
        BOOST_TEST((std::equal(r.msg.payload.begin(), r.msg.payload.end(), big->begin())));
        c->close();
      }(),
      100s);
}

// Files that cannot be loaded are usage errors naming the file.
BOOST_AUTO_TEST_CASE(unloadable_files_are_usage_errors, *utf::timeout(60)) {
  test_certs certs;
  auto o = certs.server();
  o.private_key_file = certs.path("client.key"); // not the certificate's key
  BOOST_CHECK_EXCEPTION(net::tls_context::make(o), corodist::usage_error, [&](const corodist::usage_error& e) {
    return std::string(e.what()).find("client.key") != std::string::npos &&
           std::string(e.what()).find("mismatch") != std::string::npos;
  });
  o = certs.server();
  o.ca_file = certs.path("missing.pem");
  BOOST_CHECK_EXCEPTION(net::tls_context::make(o), corodist::usage_error, [&](const corodist::usage_error& e) {
    return std::string(e.what()).find("missing.pem") != std::string::npos;
  });
}

BOOST_AUTO_TEST_SUITE_END()
