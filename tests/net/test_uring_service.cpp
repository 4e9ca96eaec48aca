// The liburing-native socket service (src/net/uring_service.hpp): sockets
// adopted into rings' registered-file tables echo over loopback, gathered
// sends, end of file, cancellation (by file, by cancellation slot, by close),
// slot reuse, shutdown with operations pending, and more sockets than the
// RLIMIT_NOFILE soft limit allows descriptors. Completions reach the loop
// through the rings' eventfd, also with DEFER_TASKRUN.
#include <boost/test/unit_test.hpp>

#include <corodist/core/config.hpp>

#if CORODIST_IO_URING

#include "net/uring_service.hpp"
#include "support/coro_test.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <liburing.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;
using asio::ip::tcp;
using corodist::net::detail::uring_file;
using uring_svc = corodist::net::detail::uring_service;
using corodist::test::run_coro;
namespace ex = asio::experimental;

namespace {

/// A fresh io_context, its uring_service and a loopback acceptor to make
/// socket pairs from.
struct uring_fixture {
  uring_fixture() {
    std::string why;
    BOOST_REQUIRE_MESSAGE(uring_svc::available(&why), "io_uring unavailable here: " + why);
    BOOST_TEST_MESSAGE("uring_service::available: " << why);
  }

  /// A connected loopback pair, as plain descriptors {client, server}.
  std::pair<int, int> tcp_pair() {
    tcp::socket client(ctx);
    client.connect(acceptor.local_endpoint());
    tcp::socket server = acceptor.accept();
    return {client.release(), server.release()};
  }

  uring_file adopt(int fd) {
    std::error_code ec;
    uring_file f = svc.adopt(fd, ec);
    BOOST_REQUIRE_MESSAGE(!ec, "adopt: " << ec.message());
    BOOST_REQUIRE(f.valid());
    return f;
  }

  /// A connected pair, both ends adopted {client, server}.
  std::pair<uring_file, uring_file> adopted_pair() {
    auto [c, s] = tcp_pair();
    uring_file fc = adopt(c);
    uring_file fs = adopt(s);
    return {fc, fs};
  }

  asio::io_context ctx;
  uring_svc& svc = asio::use_service<uring_svc>(ctx);
  tcp::acceptor acceptor{ctx, tcp::endpoint(asio::ip::address_v4::loopback(), 0)};
};

bool fd_is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

std::size_t open_descriptors() {
  std::size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.')
        ++n;
    ::closedir(d);
  }
  return n;
}

asio::awaitable<std::string> recv_exact(uring_svc& svc, uring_file f, std::size_t n) {
  std::string out(n, '\0');
  std::size_t got = 0;
  while (got < n)
    got += co_await svc.async_recv(f, asio::buffer(out.data() + got, n - got), asio::use_awaitable);
  co_return out;
}

asio::awaitable<void> send_text(uring_svc& svc, uring_file f, std::string_view text) {
  std::size_t done = 0;
  while (done < text.size()) {
    std::array<asio::const_buffer, 1> one{asio::buffer(text.substr(done))};
    done += co_await svc.async_send(f, one, asio::use_awaitable);
  }
}

std::string pattern(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i)
    s[i] = static_cast<char>((i * 131 + seed) & 0xff);
  return s;
}

/// Lowers the RLIMIT_NOFILE soft limit for its lifetime.
struct nofile_limit {
  explicit nofile_limit(rlim_t soft) {
    BOOST_REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved_) == 0);
    rlimit lower = saved_;
    lower.rlim_cur = soft;
    BOOST_REQUIRE(::setrlimit(RLIMIT_NOFILE, &lower) == 0);
  }
  ~nofile_limit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  rlimit saved_{};
};

} // namespace

BOOST_AUTO_TEST_SUITE(uring_service)

BOOST_FIXTURE_TEST_CASE(echo_through_adopted_sockets, uring_fixture) {
  auto [c, s] = tcp_pair();
  uring_file fc = adopt(c);
  BOOST_TEST(!fd_is_open(c)); // the table holds the socket, the descriptor is gone
  uring_file fs = adopt(s);
  BOOST_TEST(!fd_is_open(s));
  BOOST_TEST(svc.adopted_count() == 2u);
  BOOST_TEST_MESSAGE("ring setup: " << uring_svc::describe_flags(svc.setup_flags()));
  BOOST_WARN_MESSAGE((svc.setup_flags() & IORING_SETUP_DEFER_TASKRUN) != 0,
                     "rings fell back to " << uring_svc::describe_flags(svc.setup_flags()));
  const std::string msg = pattern(1000, 7);
  std::string back = run_coro(ctx, [&]() -> asio::awaitable<std::string> {
    for (int round = 0; round < 20; ++round) {
      co_await send_text(svc, fc, msg);
      std::string got = co_await recv_exact(svc, fs, msg.size());
      co_await send_text(svc, fs, got);
      std::string echoed = co_await recv_exact(svc, fc, msg.size());
      if (echoed != msg)
        co_return echoed;
    }
    co_return msg;
  }());
  BOOST_TEST(back == msg);
}

// The peer writes from another thread while the loop waits: the completion
// can only come in through the eventfd (with DEFER_TASKRUN, as deferred task
// work that the service runs when the eventfd fires). The socket is in
// non-blocking mode, as Asio may leave one.
BOOST_FIXTURE_TEST_CASE(completion_arrives_through_eventfd, uring_fixture) {
  auto [c, s] = tcp_pair();
  // A non-blocking socket: the receive still waits for the data (no EAGAIN).
  BOOST_REQUIRE(::fcntl(s, F_SETFL, ::fcntl(s, F_GETFL) | O_NONBLOCK) == 0);
  uring_file fs = adopt(s);
  std::promise<void> pending;
  std::thread writer([c = c, f = pending.get_future()]() mutable {
    if (f.wait_for(20s) != std::future_status::ready)
      return;
    const char text[] = "from another thread";
    (void)::send(c, text, sizeof text, MSG_NOSIGNAL);
  });
  std::string got = run_coro(ctx, [&]() -> asio::awaitable<std::string> {
    auto exec = co_await asio::this_coro::executor;
    auto reading = [&]() -> asio::awaitable<std::string> { co_return co_await recv_exact(svc, fs, 20); };
    auto release_writer = [&]() -> asio::awaitable<void> {
      // Twice round the loop: the batch with the receive is in the kernel.
      co_await asio::post(exec, asio::use_awaitable);
      co_await asio::post(exec, asio::use_awaitable);
      pending.set_value();
    };
    std::string text = co_await (reading() && release_writer());
    co_return text;
  }());
  writer.join();
  ::close(c);
  BOOST_TEST(got == std::string("from another thread", 20));
  BOOST_TEST(svc.eventfd_wakes() >= 1u);
  BOOST_TEST_MESSAGE("setup " << uring_svc::describe_flags(svc.setup_flags()) << ", eventfd wakes "
                              << svc.eventfd_wakes());
}

BOOST_FIXTURE_TEST_CASE(gathered_send, uring_fixture) {
  auto [fc, fs] = adopted_pair();
  // Three buffers (one empty), then 20 (more than the inline iovecs) of 4 MiB in all.
  const std::string a = "header:", b, d = pattern(300, 3);
  const std::string small = a + b + d;
  std::vector<std::string> parts;
  for (int i = 0; i < 20; ++i)
    parts.push_back(pattern(200 * 1024 + static_cast<std::size_t>(i), static_cast<unsigned>(i)));
  std::string large;
  for (auto& p : parts)
    large += p;
  auto [got_small, got_large, sent_large] = run_coro(ctx, [&]() -> asio::awaitable<std::tuple<std::string, std::string, std::size_t>> {
    std::array<asio::const_buffer, 3> three{asio::buffer(a), asio::buffer(b), asio::buffer(d)};
    std::size_t n = co_await svc.async_send(fs, three, asio::use_awaitable);
    if (n != small.size()) // a short write of 307 bytes on loopback would be a bug here
      co_return std::tuple{std::string("short send ") + std::to_string(n), std::string(), std::size_t{0}};
    std::string s1 = co_await recv_exact(svc, fc, small.size());
    std::vector<asio::const_buffer> many;
    for (auto& p : parts)
      many.push_back(asio::buffer(p));
    auto sending = [&]() -> asio::awaitable<std::size_t> {
      co_return co_await svc.async_send_all(fs, many, asio::use_awaitable);
    };
    auto [sent, s2] = co_await (sending() && recv_exact(svc, fc, large.size()));
    co_return std::tuple{s1, s2, sent};
  }());
  BOOST_TEST(got_small == small);
  BOOST_TEST(sent_large == large.size());
  BOOST_TEST((got_large == large));
}

BOOST_FIXTURE_TEST_CASE(end_of_file_when_the_peer_closes, uring_fixture) {
  auto [fc, fs] = adopted_pair();
  auto [ec, n, ec_after] = run_coro(ctx, [&]() -> asio::awaitable<std::tuple<std::error_code, std::size_t, std::error_code>> {
    co_await send_text(svc, fc, "last words");
    svc.close(fc);
    std::string words = co_await recv_exact(svc, fs, 10);
    if (words != "last words")
      co_return std::tuple{std::error_code(), std::size_t{1}, std::error_code()};
    std::array<char, 16> buf{};
    auto [e, k] = co_await svc.async_recv(fs, asio::buffer(buf), ex::as_tuple(asio::use_awaitable));
    auto [e2, k2] = co_await svc.async_recv(fs, asio::buffer(buf), ex::as_tuple(asio::use_awaitable));
    co_return std::tuple{e, k + k2, e2};
  }());
  BOOST_TEST(ec == asio::error::eof);
  BOOST_TEST(ec_after == asio::error::eof);
  BOOST_TEST(n == 0u);
}

// One receive for a whole 1 MiB frame that arrives in three sends, each
// sent only when the receive has seen none of the frame complete; then a
// frame cut short by the peer's close: end of file with the bytes received.
BOOST_FIXTURE_TEST_CASE(receive_all, uring_fixture) {
  auto [fc, fs] = adopted_pair();
  const std::string frame = pattern(1 << 20, 11);
  auto [got, ec_short, n_short] = run_coro(ctx, [&]() -> asio::awaitable<std::tuple<std::string, std::error_code, std::size_t>> {
    auto exec = co_await asio::this_coro::executor;
    std::string in(frame.size(), '\0');
    bool received = false;
    auto receiving = [&]() -> asio::awaitable<std::size_t> {
      std::size_t n = co_await svc.async_recv_all(fs, asio::buffer(in), asio::use_awaitable);
      received = true;
      co_return n;
    };
    auto sending = [&]() -> asio::awaitable<bool> {
      bool early = false;
      for (std::size_t part = 0; part < 3; ++part) {
        const std::size_t from = part * frame.size() / 3, to = (part + 1) * frame.size() / 3;
        early = early || received;
        co_await send_text(svc, fc, std::string_view(frame).substr(from, to - from));
        for (int i = 0; i < 4; ++i) // a few turns of the loop between the parts
          co_await asio::post(exec, asio::use_awaitable);
      }
      co_return early;
    };
    auto [n, early] = co_await (receiving() && sending());
    if (n != frame.size() || early)
      co_return std::tuple{std::string("received ") + std::to_string(n) + (early ? " early" : ""), std::error_code(), std::size_t{0}};
    co_await send_text(svc, fc, "0123456789");
    svc.close(fc);
    std::array<char, 100> buf{};
    auto [e, k] = co_await svc.async_recv_all(fs, asio::buffer(buf), ex::as_tuple(asio::use_awaitable));
    co_return std::tuple{in, e, k};
  }());
  BOOST_TEST((got == frame));
  BOOST_TEST(ec_short == asio::error::eof);
  BOOST_TEST(n_short == 10u);
}

BOOST_FIXTURE_TEST_CASE(cancel_aborts_what_is_pending, uring_fixture) {
  auto [fc, fs] = adopted_pair();
  auto [ec1, ec2, after] = run_coro(ctx, [&]() -> asio::awaitable<std::tuple<std::error_code, std::error_code, std::string>> {
    auto exec = co_await asio::this_coro::executor;
    std::array<char, 8> b1{}, b2{};
    auto reading = [&](std::array<char, 8>& b) -> asio::awaitable<std::error_code> {
      auto [e, n] = co_await svc.async_recv(fs, asio::buffer(b), ex::as_tuple(asio::use_awaitable));
      co_return e;
    };
    auto cancelling = [&]() -> asio::awaitable<void> {
      co_await asio::post(exec, asio::use_awaitable);
      co_await asio::post(exec, asio::use_awaitable);
      svc.cancel(fs);
    };
    auto [e1, e2] = co_await (cancelling() && reading(b1) && reading(b2));
    // Still usable afterwards.
    co_await send_text(svc, fc, "again");
    std::string text = co_await recv_exact(svc, fs, 5);
    co_return std::tuple{e1, e2, text};
  }());
  BOOST_TEST(ec1 == asio::error::operation_aborted);
  BOOST_TEST(ec2 == asio::error::operation_aborted);
  BOOST_TEST(after == "again");
}

BOOST_FIXTURE_TEST_CASE(cancellation_slot_cancels_a_receive, uring_fixture) {
  auto [fc, fs] = adopted_pair();
  auto [winner, in_flight_after, after] = run_coro(ctx, [&]() -> asio::awaitable<std::tuple<std::size_t, std::size_t, std::string>> {
    std::array<char, 8> buf{};
    asio::steady_timer timer(co_await asio::this_coro::executor, 1ms);
    // Nothing is sent: only the timer can finish first; the receive is then cancelled.
    auto result = co_await (svc.async_recv(fs, asio::buffer(buf), asio::use_awaitable) ||
                            timer.async_wait(asio::use_awaitable));
    std::size_t left = svc.in_flight();
    co_await send_text(svc, fc, "still here");
    std::string text = co_await recv_exact(svc, fs, 10);
    co_return std::tuple{result.index(), left, text};
  }());
  BOOST_TEST(winner == 1u);
  BOOST_TEST_MESSAGE("submissions in flight after the cancelled receive: " << in_flight_after);
  BOOST_TEST(after == "still here");
}

BOOST_FIXTURE_TEST_CASE(close_frees_the_slot, uring_fixture) {
  auto [fc, fs] = adopted_pair();
  auto [aborted, peer_eof] = run_coro(ctx, [&]() -> asio::awaitable<std::pair<std::error_code, std::error_code>> {
    auto exec = co_await asio::this_coro::executor;
    std::array<char, 8> b1{}, b2{};
    auto reading = [&](uring_file f, std::array<char, 8>& b) -> asio::awaitable<std::error_code> {
      auto [e, n] = co_await svc.async_recv(f, asio::buffer(b), ex::as_tuple(asio::use_awaitable));
      co_return e;
    };
    auto closing = [&]() -> asio::awaitable<void> {
      co_await asio::post(exec, asio::use_awaitable);
      co_await asio::post(exec, asio::use_awaitable);
      svc.close(fs);
    };
    // The pending receive is aborted; the socket closes, so the peer reads end of file.
    auto [e_server, e_client] = co_await (closing() && reading(fs, b1) && reading(fc, b2));
    co_return std::pair{e_server, e_client};
  }());
  BOOST_TEST(aborted == asio::error::operation_aborted);
  BOOST_TEST(peer_eof == asio::error::eof);
  BOOST_TEST(svc.adopted_count() == 1u);
  auto [c2, s2] = tcp_pair();
  uring_file again = adopt(s2);
  BOOST_TEST((again == fs)); // the same ring and slot, reused
  uring_file fc2 = adopt(c2);
  std::string got = run_coro(ctx, [&]() -> asio::awaitable<std::string> {
    co_await send_text(svc, fc2, "reused");
    co_return co_await recv_exact(svc, again, 6);
  }());
  BOOST_TEST(got == "reused");
}

BOOST_FIXTURE_TEST_CASE(immediate_completions_and_bad_files, uring_fixture) {
  auto [fc, fs] = adopted_pair();
  std::error_code ec;
  const std::size_t before = svc.adopted_count();
  int fds[2];
  BOOST_REQUIRE(::pipe(fds) == 0);
  ::close(fds[1]);
  ::close(fds[0]);
  const int closed_fd = fds[0];
  uring_file bad = svc.adopt(closed_fd, ec);
  BOOST_TEST(!bad.valid());
  BOOST_TEST(ec == std::error_code(EBADF, asio::error::get_system_category()));
  BOOST_TEST(svc.adopted_count() == before);
  (void)svc.adopt(-1, ec);
  BOOST_TEST(ec == asio::error::bad_descriptor);
  auto [e_empty, n_empty, e_bad, e_send_empty] = run_coro(ctx, [&]() -> asio::awaitable<std::tuple<std::error_code, std::size_t, std::error_code, std::error_code>> {
    std::array<char, 4> buf{};
    auto [e1, n1] = co_await svc.async_recv(fs, asio::buffer(buf, 0), ex::as_tuple(asio::use_awaitable));
    auto [e2, n2] = co_await svc.async_recv(uring_file{}, asio::buffer(buf), ex::as_tuple(asio::use_awaitable));
    std::array<asio::const_buffer, 1> nothing{asio::const_buffer()};
    auto [e3, n3] = co_await svc.async_send(fc, nothing, ex::as_tuple(asio::use_awaitable));
    co_return std::tuple{e1, n1, e2, e3};
  }());
  BOOST_TEST(!e_empty);
  BOOST_TEST(n_empty == 0u);
  BOOST_TEST(e_bad == asio::error::bad_descriptor);
  BOOST_TEST(!e_send_empty);
}

// Shutdown with operations in flight destroys their handlers without calling them.
BOOST_AUTO_TEST_CASE(shutdown_destroys_pending_handlers) {
  std::string why;
  BOOST_REQUIRE_MESSAGE(uring_svc::available(&why), why);
  auto token = std::make_shared<int>(0);
  bool called = false;
  std::weak_ptr<int> watch = token;
  int peer = -1;
  {
    asio::io_context ctx;
    auto& svc = asio::use_service<uring_svc>(ctx);
    tcp::acceptor acc(ctx, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    tcp::socket client(ctx);
    client.connect(acc.local_endpoint());
    tcp::socket server = acc.accept();
    peer = client.release();
    std::error_code ec;
    uring_file f = svc.adopt(server.release(), ec);
    BOOST_REQUIRE(!ec);
    static char buf[16];
    svc.async_recv(f, asio::buffer(buf), [t = std::move(token), &called](std::error_code, std::size_t) { called = true; });
    // A coroutine parked on a receive too.
    asio::co_spawn(ctx, [&svc, f]() -> asio::awaitable<void> {
      std::array<char, 8> b{};
      co_await svc.async_recv(f, asio::buffer(b), asio::use_awaitable);
    }, asio::detached);
    ctx.poll(); // submitted: both receives are in the kernel
    BOOST_TEST(svc.in_flight() == 2u);
    BOOST_TEST(!watch.expired());
  }
  BOOST_TEST(watch.expired()); // the handler was destroyed
  BOOST_TEST(!called);         // and never invoked
  // The ring is gone, and the adopted socket with it: the peer reads end of file.
  pollfd p{peer, POLLIN, 0};
  BOOST_TEST(::poll(&p, 1, 10000) == 1);
  char c;
  BOOST_TEST(::recv(peer, &c, 1, 0) == 0);
  ::close(peer);
}

// 648 sockets adopted while the soft limit allows 256 descriptors: the tables
// of three rings hold them, each descriptor closed, and all of them echo.
// (A process that has more descriptors open already gets a higher limit and
// proportionally more sockets: still 2.5 times the limit, in three rings.)
BOOST_AUTO_TEST_CASE(more_sockets_than_rlimit_nofile) {
  const std::size_t open_before = open_descriptors();
  const std::size_t soft = std::max<std::size_t>(256, open_before + 64);
  const std::size_t pairs = soft * 5 / 4 + 4; // more than 2.5 x soft sockets
  nofile_limit limit(static_cast<rlim_t>(soft));
  uring_fixture fx;
  std::vector<std::pair<uring_file, uring_file>> files;
  for (std::size_t i = 0; i < pairs; ++i)
    files.push_back(fx.adopted_pair());
  BOOST_TEST(fx.svc.adopted_count() == 2 * pairs);
  BOOST_TEST(fx.svc.ring_count() >= 3u);
  // Rings and the eventfd cost descriptors, the sockets none.
  BOOST_TEST(open_descriptors() < open_before + 16);
  BOOST_TEST_MESSAGE(2 * pairs << " adopted sockets in " << fx.svc.ring_count() << " rings, " << open_descriptors()
                               << " descriptors open (" << open_before << " before), soft limit " << soft);
  std::size_t servers_done = 0;
  std::vector<std::string> errors;
  // Every server end waits for a message and echoes it: 300 receives pending at once.
  for (std::size_t i = 0; i < pairs; ++i)
    asio::co_spawn(fx.ctx, [&, s = files[i].second]() -> asio::awaitable<void> {
      std::string m = co_await recv_exact(fx.svc, s, 16);
      co_await send_text(fx.svc, s, m);
    }, [&](std::exception_ptr e) {
      ++servers_done;
      if (e)
        errors.push_back("server failed");
    });
  std::size_t ok = run_coro(fx.ctx, [&]() -> asio::awaitable<std::size_t> {
    for (std::size_t i = 0; i < pairs; ++i) {
      std::string m = "message " + std::to_string(100000 + i) + "\n";
      m.resize(16, '.');
      co_await send_text(fx.svc, files[i].first, m);
    }
    std::size_t good = 0;
    for (std::size_t i = 0; i < pairs; ++i) {
      std::string m = "message " + std::to_string(100000 + i) + "\n";
      m.resize(16, '.');
      if (co_await recv_exact(fx.svc, files[i].first, 16) == m)
        ++good;
    }
    co_return good;
  }());
  BOOST_TEST(ok == pairs);
  BOOST_TEST(servers_done == pairs);
  BOOST_TEST(errors.empty());
  for (auto& [c, s] : files) {
    fx.svc.close(c);
    fx.svc.close(s);
  }
  BOOST_TEST(fx.svc.adopted_count() == 0u);
}

BOOST_AUTO_TEST_CASE(operation_sizes) {
  using awaitable_handler = asio::detail::awaitable_handler<asio::any_io_executor, std::error_code, std::size_t>;
  const std::size_t recv_op = uring_svc::recv_op_size<awaitable_handler>();
  const std::size_t send_op = uring_svc::send_op_size<awaitable_handler>();
  BOOST_TEST_MESSAGE("bytes of an operation in flight (use_awaitable): receive " << recv_op << ", send " << send_op
                                                                                << "; uring_file " << sizeof(uring_file));
  BOOST_TEST(recv_op <= 128u); // the only per-socket memory of an idle reader
  BOOST_TEST(sizeof(uring_file) == 8u);
}

BOOST_AUTO_TEST_SUITE_END()

#endif // CORODIST_IO_URING
