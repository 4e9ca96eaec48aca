#define BOOST_TEST_MODULE corodist_hosts
// Across namespaced hosts (tests/support/host_bed.hpp): the bed's own faults
// (a silent partition, an asymmetric one, signals, a bandwidth limit,
// cleanup), then every multi-process scenario of the layer suites with each
// process on a host of its own: store, rpc, rref, collective and the DDP
// reducer. The test process starts no thread: everything runs in forked
// processes inside the hosts, and the faults are ip, nft and tc commands.
// Skipped, saying why, where namespaces cannot be made (not root).
#include <boost/test/unit_test.hpp>

#include <corodist/collective/gloo_group.hpp>
#include <corodist/ddp/reducer.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>

#include "collective/collective_checks.hpp"
#include "collective/gloo_fixtures.hpp"
#include "ddp/reducer_fixtures.hpp"
#include "rpc/rpc_fixtures.hpp"
#include "rref/rref_jobs.hpp"
#include "support/child_process.hpp"
#include "support/delay_proxy.hpp"
#include "support/host_bed.hpp"
#include "support/loop_helpers.hpp"
#include "support/program.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
namespace cs = corodist::store;
namespace dd = corodist::ddp;
using corodist::event_loop;
using corodist::test::child_process;
using corodist::test::direction;
using corodist::test::host_bed;
using corodist::test::pipe_pair;
using corodist::test::rref_jobs::expect;

namespace {

using kids = std::vector<std::unique_ptr<child_process>>;

/// Waits for every process of `ks` (at most `limit` each); checks each exits 0.
void require_all_zero(kids& ks, const std::string& what, std::chrono::milliseconds limit = 90s) {
  for (std::size_t i = 0; i < ks.size(); ++i) {
    const int code = ks[i]->wait_for(limit);
    BOOST_TEST(code == 0, what << " " << i << " exited with " << code);
  }
}

/// The port a child process wrote to `fd` (0 when it wrote none).
std::uint16_t read_port(int fd) {
  std::uint16_t port = 0;
  if (!corodist::test::read_all(fd, &port, sizeof port))
    return 0;
  return port;
}

/// True once `fd` is readable (or closed), within `limit`.
bool wait_readable(int fd, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, static_cast<int>(limit.count()));
  } while (r < 0 && errno == EINTR);
  return r == 1;
}

/// The IPv4 socket address `address`:`port`.
sockaddr_in ipv4(const std::string& address, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  return a;
}

/// A socket of `type` bound to `address` port 0 (listening, for TCP); then
/// writes the port to `port_fd`. Returns the socket, or -1.
int bound_socket(int type, const std::string& address, int port_fd) {
  const int s = ::socket(AF_INET, type | SOCK_CLOEXEC, 0);
  auto a = ipv4(address, 0);
  socklen_t len = sizeof a;
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0 || (type == SOCK_STREAM && ::listen(s, 64) != 0))
    return -1;
  const std::uint16_t port = ntohs(a.sin_port);
  return corodist::test::write_all(port_fd, &port, sizeof port) ? s : -1;
}

/// A process on a host that serves until killed (the test's end).
struct server_process {
  std::unique_ptr<child_process> process;
  std::uint16_t port = 0;
};

/// A TCP listener on `host` that accepts connections (and keeps them) until killed.
server_process tcp_listener(const host_bed& bed, int host) {
  pipe_pair port_pipe;
  server_process s;
  s.process = bed.run(host, [&, address = bed.address(host)] {
    const int l = bound_socket(SOCK_STREAM, address, port_pipe.write_end());
    if (l < 0)
      return 2;
    for (;;)
      (void)::accept(l, nullptr, nullptr);
  });
  s.port = read_port(port_pipe.read_end());
  BOOST_REQUIRE_MESSAGE(s.port != 0, "the listener on host " << host << " did not start");
  return s;
}

/// How a connect from one host to another ended.
enum connect_outcome : int { connected = 0, timed_out = 1, failed = 2 };

/// Connects from host `from` to `address`:`port` with a deadline of `limit`.
connect_outcome connect_from(const host_bed& bed, int from, const std::string& address, std::uint16_t port,
                             std::chrono::milliseconds limit) {
  auto probe = bed.run(from, [&] {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    auto a = ipv4(address, port);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0)
      return static_cast<int>(connected);
    if (errno != EINPROGRESS) {
      std::fprintf(stderr, "connect to %s:%u: %s\n", address.c_str(), port, std::strerror(errno));
      return static_cast<int>(failed);
    }
    pollfd p{s, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) == 0)
      return static_cast<int>(timed_out);
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0)
      std::fprintf(stderr, "connect to %s:%u: %s\n", address.c_str(), port, std::strerror(err));
    return static_cast<int>(err == 0 ? connected : failed);
  });
  return static_cast<connect_outcome>(probe->wait_for(limit + 10s));
}

/// Whether datagrams sent from host `from` to host `to` arrive within
/// `limit` (a sender repeats one every 10 ms meanwhile).
bool udp_arrives(const host_bed& bed, int from, int to, std::chrono::milliseconds limit) {
  pipe_pair port_pipe;
  auto receiver = bed.run(to, [&, address = bed.address(to)] {
    const int s = bound_socket(SOCK_DGRAM, address, port_pipe.write_end());
    if (s < 0)
      return 2;
    return wait_readable(s, limit) ? 0 : 1;
  });
  const auto port = read_port(port_pipe.read_end());
  BOOST_REQUIRE_MESSAGE(port != 0, "the receiver on host " << to << " did not start");
  auto sender = bed.run(from, [&, address = bed.address(to)] {
    const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    auto a = ipv4(address, port);
    for (;;) { // until killed
      (void)::sendto(s, "probe", 5, 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
      std::this_thread::sleep_for(10ms); // (traffic, not a wait)
    }
    return 0;
  });
  const int code = receiver->wait_for(limit + 10s);
  BOOST_REQUIRE_MESSAGE(code == 0 || code == 1, "the UDP receiver on host " << to << " exited with " << code);
  return code == 0;
}

/// What `tc qdisc show` says of `dev` in namespace `ns`.
std::string qdiscs(const std::string& ns, const std::string& dev) {
  corodist::test::program tc({"tc", "-n", ns, "qdisc", "show", "dev", dev});
  tc.wait(10s);
  return tc.output();
}

/// Process `pid`'s state letter in /proc/<pid>/stat ('T': stopped).
char process_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

/// A store server in a process of its own on host `host`, bound to its address.
server_process store_on(const host_bed& bed, int host) {
  pipe_pair port_pipe;
  server_process s;
  s.process = bed.run(host, [&, address = bed.address(host)] {
    event_loop loop;
    loop.start();
    cs::server_options so;
    so.host = address;
    so.auth_token = "";
    auto server = cs::store_server::start(loop.get_executor(), so);
    const std::uint16_t port = server->local_endpoint().port();
    if (!corodist::test::write_all(port_pipe.write_end(), &port, sizeof port))
      return 2;
    for (;;)
      ::pause(); // serves until killed
  });
  s.port = read_port(port_pipe.read_end());
  BOOST_REQUIRE_MESSAGE(s.port != 0, "the store server on host " << host << " did not start");
  return s;
}

/// Rank `rank` of `size` of a Gloo group under `prefix` listening on
/// `address`, meeting at the store on `store_address`:`port` (in a rank process).
std::shared_ptr<cc::gloo_group> join_group(event_loop& loop, const std::string& store_address, std::uint16_t port,
                                           int rank, int size, const std::string& prefix, const std::string& address) {
  auto store = corodist::test::connect_test_store(loop, port, store_address);
  auto o = corodist::test::gloo_test_options(prefix, 30s);
  o.host = address;
  return cc::gloo_group::create_sync(store, rank, size, o);
}

} // namespace

BOOST_AUTO_TEST_SUITE(host_bed_faults, *utf::precondition(host_bed::available))

// Every host reaches every other at its address; after the bed, none of its
// namespaces is left, and a leftover of a dead process is swept.
BOOST_AUTO_TEST_CASE(hosts_reach_one_another_and_nothing_is_left, *utf::timeout(120)) {
  std::string prefix;
  {
    host_bed bed(3);
    prefix = bed.prefix();
    BOOST_TEST(host_bed::namespaces(prefix).size() == 4u); // three hosts and the switch
    std::vector<server_process> listeners;
    for (int h = 0; h < 3; ++h)
      listeners.push_back(tcp_listener(bed, h));
    for (int from = 0; from < 3; ++from)
      for (int to = 0; to < 3; ++to)
        BOOST_TEST(connect_from(bed, from, bed.address(to), listeners[static_cast<std::size_t>(to)].port, 10s) ==
                       connected,
                   "host " << from << " to host " << to);
    // A host's own loopback is its own: nothing listens on 127.0.0.1 there.
    BOOST_TEST(connect_from(bed, 0, "127.0.0.1", listeners[0].port, 10s) == failed);
    // A program runs in a host through `ip netns exec`, and sees its address there.
    corodist::test::program ip({"ip", "netns", "exec", bed.netns(2), "ip", "-brief", "address", "show", "eth0"});
    BOOST_TEST(ip.wait(10s) == 0, ip.output());
    BOOST_TEST(ip.output().find(bed.address(2) + "/24") != std::string::npos, ip.output());
  }
  BOOST_TEST(host_bed::namespaces(prefix).empty());
  // A namespace named after a process that is gone is swept.
  child_process gone([] { return 0; });
  const pid_t dead = gone.pid();
  BOOST_REQUIRE(gone.wait() == 0);
  const std::string leftover = "cdbed-" + std::to_string(dead) + "-0-h0";
  corodist::test::program add({"ip", "netns", "add", leftover});
  BOOST_REQUIRE(add.wait(10s) == 0);
  BOOST_TEST(host_bed::sweep() >= 1);
  BOOST_TEST(host_bed::namespaces(leftover).empty());
}

// link_down: a connect to the host gets no answer at all (no RST, no ICMP):
// it times out; after link_up it connects.
BOOST_AUTO_TEST_CASE(link_down_is_a_silent_partition, *utf::timeout(120)) {
  host_bed bed(2);
  auto listener = tcp_listener(bed, 1);
  bed.link_down(1);
  BOOST_TEST(connect_from(bed, 0, bed.address(1), listener.port, 1500ms) == timed_out);
  bed.link_up(1);
  BOOST_TEST(connect_from(bed, 0, bed.address(1), listener.port, 20s) == connected);
}

// block(out) drops what the host sends and nothing else; block(in) what it
// receives; unblock lets it through again. A TCP connect to a host whose
// output is blocked gets no SYN-ACK: it times out.
BOOST_AUTO_TEST_CASE(block_drops_one_direction, *utf::timeout(180)) {
  host_bed bed(2);
  bed.block(1, direction::out);
  BOOST_TEST(udp_arrives(bed, 0, 1, 10s));
  BOOST_TEST(!udp_arrives(bed, 1, 0, 1s));
  auto listener = tcp_listener(bed, 1);
  BOOST_TEST(connect_from(bed, 0, bed.address(1), listener.port, 1500ms) == timed_out);
  bed.unblock(1, direction::out);
  BOOST_TEST(udp_arrives(bed, 1, 0, 10s));
  bed.block(1, direction::in);
  BOOST_TEST(!udp_arrives(bed, 0, 1, 1s));
  BOOST_TEST(udp_arrives(bed, 1, 0, 10s));
  bed.unblock(1, direction::in);
  bed.unblock(1, direction::in); // (not blocked: nothing to do)
  BOOST_TEST(udp_arrives(bed, 0, 1, 10s));
  BOOST_TEST(connect_from(bed, 0, bed.address(1), listener.port, 20s) == connected);
}

// stop: the process answers nothing until cont; kill9 ends it.
BOOST_AUTO_TEST_CASE(signals_act_on_the_child, *utf::timeout(60)) {
  host_bed bed(1);
  pipe_pair ping, pong;
  auto echo = bed.run(0, [&] {
    ping.close_write();
    pong.close_read();
    char c;
    while (corodist::test::read_all(ping.read_end(), &c, 1))
      if (!corodist::test::write_all(pong.write_end(), &c, 1))
        return 1;
    return 0;
  });
  ping.close_read();
  pong.close_write();
  char c = 'a';
  BOOST_REQUIRE(corodist::test::write_all(ping.write_end(), &c, 1));
  BOOST_REQUIRE(wait_readable(pong.read_end(), 10s));
  BOOST_REQUIRE(corodist::test::read_all(pong.read_end(), &c, 1));
  host_bed::stop(echo->pid());
  BOOST_TEST(corodist::test::eventually([&] { return process_state(echo->pid()) == 'T'; }));
  BOOST_REQUIRE(corodist::test::write_all(ping.write_end(), &c, 1));
  BOOST_TEST(!wait_readable(pong.read_end(), 300ms), "a stopped process answered");
  host_bed::cont(echo->pid());
  BOOST_TEST(wait_readable(pong.read_end(), 10s), "the process did not go on after SIGCONT");
  host_bed::kill9(echo->pid());
  BOOST_TEST(echo->wait_for(10s) == 128 + SIGKILL);
}

// A tbf limit is in place on both ends of the host's link and a bulk
// transfer through it completes; unlimit removes it. (How fast it goes is
// printed, not asserted.)
BOOST_AUTO_TEST_CASE(a_bandwidth_limit_lets_a_transfer_complete, *utf::timeout(120)) {
  constexpr std::size_t bytes = std::size_t{4} << 20;
  host_bed bed(2);
  bed.limit(1, 50'000'000);
  BOOST_TEST(qdiscs(bed.netns(1), "eth0").find("tbf") != std::string::npos, qdiscs(bed.netns(1), "eth0"));
  pipe_pair port_pipe;
  auto sink = bed.run(1, [&, address = bed.address(1)] {
    const int l = bound_socket(SOCK_STREAM, address, port_pipe.write_end());
    if (l < 0)
      return 2;
    const int s = ::accept(l, nullptr, nullptr);
    std::size_t got = 0;
    char buf[65536];
    for (ssize_t n; (n = ::read(s, buf, sizeof buf)) > 0;)
      got += static_cast<std::size_t>(n);
    return got == bytes ? 0 : 3;
  });
  const auto port = read_port(port_pipe.read_end());
  BOOST_REQUIRE(port != 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto source = bed.run(0, [&, address = bed.address(1)] {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    auto a = ipv4(address, port);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return 2;
    const std::vector<char> data(bytes, 'x');
    return corodist::test::write_all(s, data.data(), data.size()) ? 0 : 3;
  });
  BOOST_TEST(source->wait_for(60s) == 0);
  BOOST_TEST(sink->wait_for(60s) == 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("4 MiB through a 50 Mbit/s limit in " << s << " s (" << bytes * 8 / s / 1e6 << " Mbit/s)");
  bed.unlimit(1);
  BOOST_TEST(qdiscs(bed.netns(1), "eth0").find("tbf") == std::string::npos, qdiscs(bed.netns(1), "eth0"));
}

// The delay proxy (tests/support/delay_proxy.hpp): host 0 talks to an echo
// server on host 2 through a proxy on host 1 that holds every chunk 100 ms.
// A one-byte round trip takes at least the two delays (a bound the proxy
// guarantees: its timers never fire early; not a speed), and 1 MiB comes
// back intact, EOF included.
BOOST_AUTO_TEST_CASE(the_delay_proxy_delays_and_delivers, *utf::timeout(120)) {
  constexpr auto delay = 100ms;
  constexpr std::size_t bulk = std::size_t{1} << 20;
  host_bed bed(3);
  pipe_pair echo_port, proxy_port;
  auto echo = bed.run(2, [&, address = bed.address(2)] {
    const int l = bound_socket(SOCK_STREAM, address, echo_port.write_end());
    if (l < 0)
      return 2;
    const int s = ::accept(l, nullptr, nullptr);
    char buf[65536];
    for (ssize_t n; (n = ::read(s, buf, sizeof buf)) > 0;)
      if (!corodist::test::write_all(s, buf, static_cast<std::size_t>(n)))
        return 3;
    return 0;
  });
  const auto target_port = read_port(echo_port.read_end());
  BOOST_REQUIRE(target_port != 0);
  auto proxy = bed.run(1, [&, from = bed.address(1), to = bed.address(2)] {
    asio::io_context ctx;
    corodist::test::delay_proxy p(ctx.get_executor(), {asio::ip::make_address(from), 0},
                                  {asio::ip::make_address(to), target_port}, delay);
    const std::uint16_t port = p.port();
    if (!corodist::test::write_all(proxy_port.write_end(), &port, sizeof port))
      return 2;
    ctx.run();
    return 0;
  });
  const auto port = read_port(proxy_port.read_end());
  BOOST_REQUIRE(port != 0);
  auto client = bed.run(0, [&, address = bed.address(1)] {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    auto a = ipv4(address, port);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return 2;
    char c = 'x';
    const auto t0 = std::chrono::steady_clock::now();
    if (!corodist::test::write_all(s, &c, 1) || !corodist::test::read_all(s, &c, 1))
      return 3;
    const auto rtt = std::chrono::steady_clock::now() - t0;
    std::fprintf(stderr, "round trip through the proxy: %.1f ms\n",
                 std::chrono::duration<double, std::milli>(rtt).count());
    if (rtt < 2 * delay)
      return 4;
    std::vector<char> out(bulk), back;
    for (std::size_t i = 0; i < bulk; ++i)
      out[i] = static_cast<char>(i * 7 + i / 4096);
    std::thread sender([&] {
      corodist::test::write_all(s, out.data(), out.size());
      ::shutdown(s, SHUT_WR);
    });
    char buf[65536];
    for (ssize_t n; (n = ::read(s, buf, sizeof buf)) > 0;)
      back.insert(back.end(), buf, buf + n);
    sender.join();
    return back == out ? 0 : 5;
  });
  BOOST_TEST(client->wait_for(60s) == 0);
  BOOST_TEST(echo->wait_for(30s) == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(layers_across_hosts, *utf::precondition(host_bed::available))

// A store server on host 0, clients on hosts 1 and 2: set, get, add, wait
// (pending across hosts), barrier, and a watch that sees the other host's set.
BOOST_AUTO_TEST_CASE(store_server_and_clients_on_three_hosts, *utf::timeout(120)) {
  host_bed bed(3);
  auto server = store_on(bed, 0);
  kids clients;
  for (int rank = 0; rank < 2; ++rank)
    clients.push_back(bed.run(1 + rank, [rank, port = server.port, address = bed.address(0)] {
      event_loop loop;
      loop.start();
      cs::sync_store s(corodist::test::connect_test_store(loop, port, address));
      const auto me = std::to_string(rank), other = std::to_string(1 - rank);
      auto news = s.watch_key("news"); // before the barrier: sees what the other sets after it
      s.set("key/" + me, "value " + me);
      s.add("count", 1);
      s.barrier("met", 2);
      expect(s.get("key/" + other) == "value " + other, "the other host's key");
      expect(s.add("count", 0) == 2, "both adds counted");
      if (rank == 0) {
        s.wait({"late"}); // pending at the server until host 2 sets it
        expect(s.get("late") == "set by 1", "the awaited key");
        const auto e = s.next(news, 20s);
        expect(e.type == cs::watch_event::kind::created && e.value == "from 1", "the watch saw host 2's set");
      } else {
        s.set("news", "from 1");
        s.set("late", "set by 1");
      }
      s.barrier("done", 2);
      return 0;
    }));
  require_all_zero(clients, "store client");
}

// Agents on three hosts meet at a store on host 0 and call every worker
// (rpc_sync, rpc_async, nested) and have each throw (remote_error).
BOOST_AUTO_TEST_CASE(rpc_between_every_pair_of_hosts, *utf::timeout(180)) {
  host_bed bed(3);
  auto store = store_on(bed, 0);
  kids workers;
  for (int rank = 0; rank < 3; ++rank)
    workers.push_back(bed.run(rank, [rank, port = store.port, store_address = bed.address(0),
                                     address = bed.address(rank)] {
      event_loop loop;
      loop.start();
      return corodist::test::call_everyone(loop, corodist::test::connect_test_store(loop, port, store_address), rank, 3,
                                           address);
    }));
  require_all_zero(workers, "worker");
}

// RRefs across hosts: remote() and to_here, a reference passed to a third
// worker (a fork) and read there, one kept until shutdown deletes it, and
// every worker's protocol empty afterwards (rref_jobs::four_scenarios).
BOOST_AUTO_TEST_CASE(rrefs_across_hosts, *utf::timeout(180)) {
  namespace jobs = corodist::test::rref_jobs;
  host_bed bed(3);
  auto store = store_on(bed, 0);
  kids workers;
  for (int rank = 0; rank < 3; ++rank)
    workers.push_back(bed.run(rank, [rank, port = store.port, store_address = bed.address(0),
                                     address = bed.address(rank)] {
      return jobs::worker(store_address, port, rank, 3, jobs::standard,
                          [rank](corodist::rpc::agent& a) { jobs::four_scenarios(a, rank); }, address);
    }));
  require_all_zero(workers, "worker");
}

// A Gloo group of three ranks on three hosts, each listening on its host's
// address: every collective on every dtype (allreduce, broadcast, allgather,
// barrier and the rest of check_every_collective).
BOOST_AUTO_TEST_CASE(gloo_group_on_three_hosts, *utf::precondition(corodist::test::gloo_built) * utf::timeout(240)) {
  host_bed bed(3);
  auto store = store_on(bed, 0);
  kids ranks;
  for (int rank = 0; rank < 3; ++rank)
    ranks.push_back(bed.run(rank, [rank, port = store.port, store_address = bed.address(0),
                                   address = bed.address(rank)] {
      event_loop loop;
      loop.start();
      auto pg = join_group(loop, store_address, port, rank, 3, "hosts/every", address);
      const auto f = corodist::test::check_every_collective(*pg);
      if (!f.ok())
        std::fprintf(stderr, "rank %d on %s:\n%s", rank, address.c_str(), f.text().c_str());
      return f.ok() ? 0 : 1;
    }));
  require_all_zero(ranks, "rank", 180s);
}

// The DDP reducer with three ranks on three hosts, one iteration: the values
// come from rank 0, and every gradient is the exact mean of the three ranks'
// (float64: sums of eighths, divided by 3 as the check does), bitwise equal
// on every rank.
BOOST_AUTO_TEST_CASE(reducer_on_three_hosts, *utf::precondition(corodist::test::gloo_built) * utf::timeout(180)) {
  using namespace corodist::test::reducer_fixtures;
  host_bed bed(3);
  auto store = store_on(bed, 0);
  kids ranks;
  for (int rank = 0; rank < 3; ++rank)
    ranks.push_back(bed.run(rank, [rank, port = store.port, store_address = bed.address(0),
                                   address = bed.address(rank)] {
      event_loop loop;
      loop.start();
      auto pg = join_group(loop, store_address, port, rank, 3, "hosts/ddp", address);
      model<double> m({300, 7, 1000, 64, 129});
      for (auto& v : m.values)
        std::fill(v.begin(), v.end(), rank + 1.0);
      dd::reducer_options o;
      o.bucket_cap_bytes = 2048;
      o.first_bucket_bytes = 512;
      dd::reducer red(pg, m.parameters(), o);
      for (auto& v : m.values)
        for (double x : v)
          CHECK(x == 1.0, "values not broadcast from rank 0: {}", x);
      red.prepare_for_backward();
      for (std::size_t k = m.values.size(); k-- > 0;) {
        fill_grad<double>(red, rank, 0, k);
        red.mark_grad_ready(k);
      }
      red.finalize_sync();
      for (std::size_t k = 0; k < m.values.size(); ++k)
        check_mean<double>(red, 3, 0, k, 0.0);
      for (auto& g : m.grads)
        CHECK(same_on_all_ranks(*pg, g), "gradients differ between ranks");
      return 0;
    }));
  require_all_zero(ranks, "rank");
}

BOOST_AUTO_TEST_SUITE_END()
