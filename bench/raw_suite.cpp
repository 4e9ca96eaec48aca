/// \file
/// Suite `raw`: blocking POSIX sockets over loopback, no corodist involved.
/// This is the floor every other case's ratio is computed against.

#include "harness.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace corodist::bench {
namespace {

using clock_type = std::chrono::steady_clock;

constexpr int io_timeout_s = 10; // every blocking socket call gives up after this
constexpr std::size_t pingpong_bytes = 64;
constexpr std::size_t pingpong_warmup = 2'000;
constexpr int fanin_connections = 64;
constexpr std::size_t fanin_bytes = 64;
constexpr std::size_t bulk_chunk = std::size_t{1} << 20; // 1 MiB
constexpr int raw_bulk_runs = 3;                         // the floor's bulk figure: the best of these

std::size_t pingpong_samples(bool quick) { return quick ? 20'000 : 200'000; }
double pingpong_budget_s(bool quick) { return quick ? 5.0 : 30.0; } // timed-loop cap
std::uint64_t bulk_total(bool quick) {
  return quick ? std::uint64_t{512} << 20 : std::uint64_t{2} << 30;
}

// The floor is a ceiling for throughput: the best of a few transfers (one
// stream's rate varies by a third between runs on this VM, and a single low
// one let per-call cases "beat" it).
bulk_result best_raw_bulk(bool quick) {
  bulk_result best;
  for (int i = 0; i < raw_bulk_runs; ++i)
    if (auto b = raw_bulk(bulk_total(quick), bulk_chunk); i == 0 || b.gbytes_per_s > best.gbytes_per_s)
      best = b;
  return best;
}

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// Throws for a failed socket call; EAGAIN from a blocking socket means
/// SO_RCVTIMEO/SO_SNDTIMEO expired.
[[noreturn]] void throw_errno(const char* what) {
  const int err = errno;
  if (err == EAGAIN || err == EWOULDBLOCK || err == EINPROGRESS)
    throw std::runtime_error(std::string(what) + ": timed out after " +
                             std::to_string(io_timeout_s) + " s");
  throw std::system_error(err, std::generic_category(), what);
}

/// Owning socket descriptor.
class socket_fd {
public:
  socket_fd() = default;
  explicit socket_fd(int fd) : fd_(fd) {}
  ~socket_fd() { reset(); }
  socket_fd(socket_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  socket_fd& operator=(socket_fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }

  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

private:
  int fd_ = -1;
};

/// SO_RCVTIMEO / SO_SNDTIMEO of io_timeout_s (on Linux these also bound
/// accept() and connect()).
void set_timeouts(int fd) {
  timeval tv{};
  tv.tv_sec = io_timeout_s;
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) throw_errno("SO_RCVTIMEO");
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) throw_errno("SO_SNDTIMEO");
}

socket_fd make_tcp_socket() {
  socket_fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.get() < 0) throw_errno("socket");
  set_timeouts(s.get());
  return s;
}

void set_nodelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) throw_errno("TCP_NODELAY");
}

struct tcp_pair {
  socket_fd client;
  socket_fd server;
};

/// A connected TCP pair over 127.0.0.1 (ephemeral port), TCP_NODELAY and
/// I/O timeouts on both ends. Connect completes into the listen backlog, so
/// one thread can do both sides.
tcp_pair connect_loopback() {
  socket_fd listener = make_tcp_socket();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    throw_errno("bind 127.0.0.1:0");
  if (::listen(listener.get(), 1) != 0) throw_errno("listen");
  socklen_t len = sizeof addr;
  if (::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw_errno("getsockname");

  tcp_pair pair;
  pair.client = make_tcp_socket();
  if (::connect(pair.client.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    throw_errno("connect");
  pair.server = socket_fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (pair.server.get() < 0) throw_errno("accept");
  set_timeouts(pair.server.get()); // not reliably inherited from the listener
  set_nodelay(pair.client.get());
  set_nodelay(pair.server.get());
  return pair;
}

/// One recv(): bytes received (> 0), or 0 on orderly EOF. Retries EINTR.
std::size_t recv_some(int fd, char* buf, std::size_t n) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const ssize_t r = ::recv(fd, buf, n, 0);
    if (r >= 0) return static_cast<std::size_t>(r);
    if (errno != EINTR) throw_errno("recv");
  }
  throw std::runtime_error("recv: interrupted too often");
}

/// Reads exactly n bytes. Returns false on EOF before the first byte; throws
/// on EOF mid-message, errors and timeouts.
bool recv_full(int fd, char* buf, std::size_t n) {
  std::size_t got = 0;
  while (got < n) { // each pass makes progress or throws
    const std::size_t r = recv_some(fd, buf + got, n - got);
    if (r == 0) {
      if (got == 0) return false;
      throw std::runtime_error("recv: peer closed mid-message");
    }
    got += r;
  }
  return true;
}

/// Sends exactly n bytes (MSG_NOSIGNAL: a dead peer is an error, not SIGPIPE).
void send_full(int fd, const char* buf, std::size_t n) {
  std::size_t sent = 0;
  int interrupts = 0;
  while (sent < n) { // each pass makes progress or throws
    const ssize_t r = ::send(fd, buf + sent, n - sent, MSG_NOSIGNAL);
    if (r > 0) {
      sent += static_cast<std::size_t>(r);
    } else if (r < 0 && errno == EINTR && ++interrupts < 1000) {
      continue;
    } else {
      throw_errno("send");
    }
  }
}

/// Runs `fn` on its own thread. The destructor (reached when the caller
/// throws) shuts `fd` down to unblock the thread, then joins it; `join()`
/// rethrows whatever the thread threw.
class peer_thread {
public:
  template <class F>
  peer_thread(int fd, F fn)
      : fd_(fd), thread_([this, fn = std::move(fn)]() mutable {
          try {
            fn();
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~peer_thread() {
    if (thread_.joinable()) {
      ::shutdown(fd_, SHUT_RDWR);
      thread_.join();
    }
  }
  peer_thread(const peer_thread&) = delete;
  peer_thread& operator=(const peer_thread&) = delete;

  /// Joins the thread and rethrows its exception, if any.
  void join() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

private:
  int fd_;
  std::exception_ptr error_;
  std::thread thread_; // last: started once the members above exist
};


/// Epoll descriptor with every fd of `fds` registered for EPOLLIN (data.u32 = index).
socket_fd epoll_over(const std::vector<int>& fds) {
  socket_fd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (ep.get() < 0) throw_errno("epoll_create1");
  for (std::size_t i = 0; i < fds.size(); ++i) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<std::uint32_t>(i);
    if (::epoll_ctl(ep.get(), EPOLL_CTL_ADD, fds[i], &ev) != 0) throw_errno("epoll_ctl");
  }
  return ep;
}

/// Waits for readable fds; throws after io_timeout_s without any.
int wait_ready(int ep, epoll_event* events, int max_events) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int n = ::epoll_wait(ep, events, max_events, io_timeout_s * 1000);
    if (n > 0) return n;
    if (n == 0) throw std::runtime_error("epoll_wait: timed out after " + std::to_string(io_timeout_s) + " s");
    if (errno != EINTR) throw_errno("epoll_wait");
  }
  throw std::runtime_error("epoll_wait: interrupted too often");
}

} // namespace

fanin_result raw_fanin(int connections, std::size_t message_bytes, std::size_t total) {
  if (connections <= 0 || message_bytes == 0)
    throw std::invalid_argument("raw_fanin: connections and message_bytes must be > 0");
  std::vector<tcp_pair> pairs;
  std::vector<int> client_fds, server_fds;
  for (int i = 0; i < connections; ++i) {
    pairs.push_back(connect_loopback());
    client_fds.push_back(pairs.back().client.get());
    server_fds.push_back(pairs.back().server.get());
  }
  // Server: one thread, epoll over every connection, answers each message.
  // A client shutdown reads as EOF; the thread ends once every connection has.
  peer_thread server(server_fds.front(), [&server_fds, message_bytes] {
    const socket_fd ep = epoll_over(server_fds);
    std::vector<epoll_event> events(server_fds.size());
    std::vector<char> buf(message_bytes);
    std::size_t open = server_fds.size();
    while (open > 0) {
      const int n = wait_ready(ep.get(), events.data(), static_cast<int>(events.size()));
      for (int i = 0; i < n; ++i) {
        const int fd = server_fds[events[i].data.u32];
        if (!recv_full(fd, buf.data(), message_bytes)) {
          ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, fd, nullptr);
          --open;
          continue;
        }
        send_full(fd, buf.data(), message_bytes);
      }
    }
  });

  // Clients: this thread keeps one message in flight on every connection.
  const socket_fd ep = epoll_over(client_fds);
  std::vector<epoll_event> events(client_fds.size());
  std::vector<char> out(message_bytes, 'q'), in(message_bytes);
  std::size_t issued = 0, completed = 0;
  const auto start = clock_type::now();
  for (int fd : client_fds) {
    if (issued == total) break;
    send_full(fd, out.data(), message_bytes);
    ++issued;
  }
  while (completed < issued) { // each pass completes at least one message or throws
    const int n = wait_ready(ep.get(), events.data(), static_cast<int>(events.size()));
    for (int i = 0; i < n; ++i) {
      const int fd = client_fds[events[i].data.u32];
      if (!recv_full(fd, in.data(), message_bytes)) throw std::runtime_error("raw_fanin: server closed");
      ++completed;
      if (issued < total) {
        send_full(fd, out.data(), message_bytes);
        ++issued;
      }
    }
  }
  fanin_result result;
  result.seconds = seconds_between(start, clock_type::now());
  result.messages = completed;
  result.ops_per_s = static_cast<double>(completed) / result.seconds;
  for (int fd : client_fds) ::shutdown(fd, SHUT_WR);
  server.join();
  return result;
}

namespace {

void run_raw_suite(context& ctx) {
  const auto pp = raw_pingpong(pingpong_bytes, pingpong_warmup, pingpong_samples(ctx.quick),
                               pingpong_budget_s(ctx.quick));
  record r = latency_record("raw", "pingpong_64B", pp.latency, pp.elapsed_s);
  r.extra = {{"samples", static_cast<double>(pp.round_trips)},
             {"message_bytes", static_cast<double>(pingpong_bytes)}};
  ctx.report(std::move(r));

  const auto bulk = best_raw_bulk(ctx.quick);
  record b;
  b.suite = "raw";
  b.name = "bulk";
  b.gbytes_per_s = bulk.gbytes_per_s;
  b.extra = {{"bytes", static_cast<double>(bulk_total(ctx.quick))},
             {"chunk_bytes", static_cast<double>(bulk_chunk)},
             {"seconds", bulk.seconds}};
  ctx.report(std::move(b));

  const auto fan = raw_fanin(fanin_connections, fanin_bytes, ctx.quick ? 200'000 : 1'000'000);
  record f;
  f.suite = "raw";
  f.name = "fanin_64_conns";
  f.ops_per_s = fan.ops_per_s;
  f.extra = {{"connections", double(fanin_connections)},
             {"message_bytes", double(fanin_bytes)},
             {"messages", static_cast<double>(fan.messages)}};
  ctx.report(std::move(f));
}

const suite_registrar registrar("raw", &run_raw_suite, 0, 3);

} // namespace

pingpong_result raw_pingpong(std::size_t message_bytes, std::size_t warmup, std::size_t samples,
                             double max_seconds) {
  if (message_bytes == 0) throw std::invalid_argument("raw_pingpong: message_bytes must be > 0");
  auto [client, server] = connect_loopback();
  const std::size_t total = warmup + samples;

  peer_thread echo(server.get(), [fd = server.get(), message_bytes, total] {
    std::vector<char> buf(message_bytes);
    for (std::size_t i = 0; i < total; ++i) {
      if (!recv_full(fd, buf.data(), message_bytes)) return; // client gave up early
      send_full(fd, buf.data(), message_bytes);
    }
  });

  const int fd = client.get();
  std::vector<char> out(message_bytes, 'p');
  std::vector<char> in(message_bytes);
  auto round_trip = [&] {
    send_full(fd, out.data(), message_bytes);
    if (!recv_full(fd, in.data(), message_bytes)) throw std::runtime_error("recv: echo server closed");
  };

  for (std::size_t i = 0; i < warmup; ++i) round_trip();

  pingpong_result result;
  result.latency.reserve(samples);
  const auto start = clock_type::now();
  const auto deadline = start + std::chrono::duration_cast<clock_type::duration>(
                                     std::chrono::duration<double>(max_seconds));
  for (std::size_t i = 0; i < samples; ++i) {
    const auto t0 = clock_type::now();
    round_trip();
    const auto t1 = clock_type::now();
    result.latency.add(t1 - t0);
    if (t1 > deadline) break; // slow machine: keep what we have
  }
  result.elapsed_s = seconds_between(start, clock_type::now());
  result.round_trips = result.latency.size();

  ::shutdown(fd, SHUT_WR);
  echo.join();
  return result;
}

bulk_result raw_bulk(std::uint64_t total_bytes, std::size_t chunk_bytes) {
  if (chunk_bytes == 0) throw std::invalid_argument("raw_bulk: chunk_bytes must be > 0");
  auto [receiver, sender] = connect_loopback();

  peer_thread tx(sender.get(), [fd = sender.get(), total_bytes, chunk_bytes] {
    const std::vector<char> buf(chunk_bytes, 'b'); // pages touched before sending
    for (std::uint64_t sent = 0; sent < total_bytes;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, total_bytes - sent));
      send_full(fd, buf.data(), n);
      sent += n;
    }
    ::shutdown(fd, SHUT_WR);
  });

  const int fd = receiver.get();
  std::vector<char> buf(chunk_bytes);
  std::uint64_t received = 0;
  std::uint64_t first_bytes = 0;
  clock_type::time_point first{};
  while (received < total_bytes) { // each pass makes progress or throws
    const std::size_t r = recv_some(fd, buf.data(), buf.size());
    if (r == 0) throw std::runtime_error("raw_bulk: sender closed early");
    if (received == 0) {
      first = clock_type::now();
      first_bytes = r;
    }
    received += r;
  }
  const auto last = clock_type::now();
  tx.join();

  // Bytes that arrived with the first recv() predate the clock start.
  bulk_result result;
  result.bytes = received - first_bytes;
  result.seconds = seconds_between(first, last);
  result.gbytes_per_s =
      result.seconds > 0 ? static_cast<double>(result.bytes) / result.seconds / 1e9 : not_applicable;
  return result;
}

double measure_raw_floor(bool quick) {
  return raw_pingpong(pingpong_bytes, pingpong_warmup, pingpong_samples(quick),
                      pingpong_budget_s(quick)).latency.percentile(0.5);
}

double measure_raw_bulk(bool quick) { return best_raw_bulk(quick).gbytes_per_s; }

} // namespace corodist::bench
