/// \file
/// Suite `hostile`: what the store server and the RPC agent cost under the
/// attacks of the hardening issue. Servers run in this process on event loops
/// of their own; the attackers are raw loopback sockets driven with blocking
/// POSIX calls from the benchmark's threads (every call bounded by
/// SO_RCVTIMEO / SO_SNDTIMEO), so they hold no user-space memory and the
/// process's resident memory (/proc/self/status) is what the servers hold.
///
/// Cases (one JSON record each): pending_wait_memory, refused_wait_memory, idle_connection_memory,
/// half_sent_frame_memory, legit_get_under_500_slow, decode_amplification,
/// unread_replies_memory (1 MiB replies) and unread_replies_memory_32MiB,
/// and max_loop_stall_ms (the worst lateness of a 1 ms timer on the server's
/// loop during each case, against the same probe on the idle loop just before).

#include "harness.hpp"
#include "process_resources.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/core/little_endian.hpp>
#include <corodist/core/logging.hpp>
#include <corodist/core/run_on.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/net/listener.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/rpc/codec.hpp>
#include <corodist/store/hash_store.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/address.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <future>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <span>
#include <stdexcept>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace corodist::bench {
namespace {

namespace cs = corodist::store;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// Frame kinds of the two wire protocols (fixed by the protocols: src/store/wire/native/fields.hpp
// `op`, src/rpc/protocol.hpp), which the attackers speak without the library.
constexpr std::uint16_t store_op_wait = 7;
constexpr std::uint16_t store_op_num_keys = 8;
constexpr std::uint16_t rpc_kind_call = 0x0500;
constexpr std::uint16_t rpc_kind_reply = 0x0501;
constexpr std::uint16_t rpc_kind_identify = 0x0503;

constexpr auto io_timeout = 30s;   // any one blocking socket call
constexpr auto loop_timeout = 10s; // any one wait for a server's loop
constexpr std::size_t declared_frame = std::size_t{64} << 20; // the half-sent frames' declared payload

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// Gives free heap memory back to the system, so that what a case allocates
/// next shows as resident growth instead of reusing what an earlier case freed.
void trim_heap() { ::malloc_trim(0); }

// ---- bounded waits on a server's loop ---------------------------------------

/// Runs `fn()` on `ex` and returns its result; throws if the loop does not
/// answer within loop_timeout.
template <typename F>
auto on_loop(const asio::any_io_executor& ex, F fn) {
  auto f = corodist::run_on(ex, std::move(fn));
  if (!f.wait_for(loop_timeout))
    throw std::runtime_error("a server's event loop did not answer within 10 s");
  return f.get();
}

/// Runs the coroutine `op` on `ex` and returns its result; throws after `limit`.
template <typename T>
T await_on(const asio::any_io_executor& ex, asio::awaitable<T> op, std::chrono::seconds limit) {
  auto f = asio::co_spawn(ex, std::move(op), asio::use_future);
  if (f.wait_for(limit) != std::future_status::ready)
    throw std::runtime_error(fmt::format("a benchmark step did not finish within {} s", limit.count()));
  return f.get();
}

/// Polls `pred()` every `period` until it holds (true) or `limit` passes (false).
template <typename P>
bool poll_until(P pred, std::chrono::milliseconds limit, std::chrono::milliseconds period = 1ms) {
  const auto end = clock_type::now() + limit;
  while (!pred()) {
    if (clock_type::now() >= end)
      return false;
    std::this_thread::sleep_for(period);
  }
  return true;
}

// ---- the loop stall probe ---------------------------------------------------

struct stall_figures {
  double max_ms = not_applicable;  ///< the largest lateness of one wake-up (wall clock)
  double busy_ms = not_applicable; ///< the largest part of one lateness the loop's thread spent on a CPU
  /// busy_ms over the wake-ups whose lateness an idle thread of the process did not share:
  /// what the loop itself did, without the stalls of the whole machine (a VM's vCPU held
  /// by its host counts as CPU time of whatever thread it was running).
  double own_busy_ms = not_applicable;
  double machine_ms = not_applicable; ///< the largest lateness of the idle control thread
  std::size_t wakeups = 0;
  std::size_t over_10ms = 0; ///< wake-ups later than 10 ms
};

/// The larger of each figure (the counts added).
stall_figures worse(const stall_figures& a, const stall_figures& b) {
  return {std::max(a.max_ms, b.max_ms),           std::max(a.busy_ms, b.busy_ms),
          std::max(a.own_busy_ms, b.own_busy_ms), std::max(a.machine_ms, b.machine_ms),
          a.wakeups + b.wakeups,                  a.over_10ms + b.over_10ms};
}

double thread_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

/// A coroutine on a loop whose steady_timer should wake it every 1 ms; it
/// records how late each wake-up is (how long something else held the loop,
/// waiting for a CPU included) and how much of that the loop's thread was
/// running (its CPU time over the interval, capped at the lateness): the work
/// itself, whatever else the machine runs. Bounded: it ends by itself after
/// 5 minutes.
class loop_probe {
public:
  explicit loop_probe(const asio::any_io_executor& ex) : state_(std::make_shared<state>()) {
    control_ = std::thread([st = state_] { run_control(*st); });
    done_ = asio::co_spawn(ex, run(state_), asio::use_future);
  }
  ~loop_probe() {
    state_->stop = true;
    if (done_.valid())
      done_.wait_for(loop_timeout);
    if (control_.joinable())
      control_.join();
  }
  loop_probe(const loop_probe&) = delete;
  loop_probe& operator=(const loop_probe&) = delete;

  /// Stops the probe; returns what it saw. Throws if the loop does not let it end.
  stall_figures stop() {
    state_->stop = true;
    if (done_.wait_for(loop_timeout) != std::future_status::ready)
      throw std::runtime_error("the loop stall probe did not end within 10 s");
    done_.get();
    control_.join();
    auto& st = *state_;
    // A loop wake-up's lateness that the control thread shared for at least half of
    // it was the machine's, not the loop's. Both lists are in time order.
    st.seen.own_busy_ms = st.small_busy_ms;
    const auto& control = st.control_stalls;
    std::size_t first = 0; // the first control stall that does not end before the loop stall at hand
    for (const auto& l : st.loop_stalls) {
      while (first < control.size() && control[first].to <= l.from)
        ++first;
      double shared = 0;
      for (std::size_t i = first; i < control.size() && control[i].from < l.to; ++i)
        shared += ms_between(std::max(l.from, control[i].from), std::min(l.to, control[i].to));
      if (shared < 0.5 * ms_between(l.from, l.to))
        st.seen.own_busy_ms = std::max(st.seen.own_busy_ms, l.busy_ms);
    }
    return st.seen;
  }

  /// The idle loop's figures: a probe over `window`, with nothing else to do.
  static stall_figures idle(const asio::any_io_executor& ex, std::chrono::milliseconds window) {
    loop_probe p(ex);
    std::this_thread::sleep_for(window);
    return p.stop();
  }

private:
  /// Wake-ups later than this are kept, with their interval, for the attribution.
  static constexpr double kept_ms = 2.0;
  static constexpr std::size_t max_kept = 100'000;
  struct interval {
    clock_type::time_point from, to;
    double busy_ms;
  };
  struct state {
    std::atomic<bool> stop{false};
    stall_figures seen;                  // written on the loop; read after the coroutine ended
    double small_busy_ms = 0;            // the busy part of wake-ups not kept
    std::vector<interval> loop_stalls;   // the same
    std::vector<interval> control_stalls; // written by the control thread; read after it ended
  };

  static asio::awaitable<void> run(std::shared_ptr<state> st) {
    asio::steady_timer t(co_await asio::this_coro::executor);
    const auto end = clock_type::now() + 5min;
    auto due = clock_type::now() + 1ms;
    double cpu = thread_cpu_ms();
    st->seen.max_ms = 0;
    st->seen.busy_ms = 0;
    while (!st->stop.load(std::memory_order_relaxed) && clock_type::now() < end) {
      t.expires_at(due);
      co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
      const auto now = clock_type::now();
      const double cpu_now = thread_cpu_ms();
      const double late = ms_between(due, now);
      st->seen.max_ms = std::max(st->seen.max_ms, late);
      // The part of the lateness the loop's thread spent on a CPU (at most):
      // the rest it waited for one, which says more about the machine's load.
      const double busy = std::min(late, cpu_now - cpu);
      st->seen.busy_ms = std::max(st->seen.busy_ms, busy);
      if (late > kept_ms && st->loop_stalls.size() < max_kept)
        st->loop_stalls.push_back({due, now, busy});
      else
        st->small_busy_ms = std::max(st->small_busy_ms, busy);
      st->seen.over_10ms += late > 10.0;
      ++st->seen.wakeups;
      due = now + 1ms;
      cpu = cpu_now;
    }
  }

  /// The control: a plain thread of the same process that only sleeps 1 ms at a time.
  static void run_control(state& st) {
    st.seen.machine_ms = 0;
    auto due = clock_type::now() + 1ms;
    while (!st.stop.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_until(due);
      const auto now = clock_type::now();
      const double late = ms_between(due, now);
      st.seen.machine_ms = std::max(st.seen.machine_ms, late);
      if (late > kept_ms && st.control_stalls.size() < max_kept)
        st.control_stalls.push_back({due, now, 0});
      due = now + 1ms;
    }
  }

  std::shared_ptr<state> state_;
  std::thread control_;
  std::future<void> done_;
};

// ---- raw attacker sockets ---------------------------------------------------

[[noreturn]] void fail_errno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

/// An owned socket descriptor.
class raw_socket {
public:
  raw_socket() = default;
  explicit raw_socket(int fd) noexcept : fd_(fd) {}
  raw_socket(raw_socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  raw_socket& operator=(raw_socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~raw_socket() { reset(); }
  int fd() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
  }

private:
  int fd_ = -1;
};

void send_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      fail_errno("send to the server"); // EAGAIN: io_timeout passed
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void recv_all(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k == 0)
      throw std::runtime_error("the server closed the connection");
    if (k < 0) {
      if (errno == EINTR)
        continue;
      fail_errno("recv from the server"); // EAGAIN: io_timeout passed
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

/// A blocking TCP connection to 127.0.0.1:port, every call bounded by io_timeout.
raw_socket connect_raw(std::uint16_t port) {
  raw_socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd() < 0)
    fail_errno("socket");
  const timeval tv{static_cast<time_t>(std::chrono::seconds(io_timeout).count()), 0};
  ::setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(s.fd(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); // also bounds connect()
  const int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    // With SO_SNDTIMEO set, an interrupted connect() is not restarted; the
    // connection goes on in the background (this thread posts to io_uring
    // loops, which seems to be what interrupts it now and then).
    if (errno != EINTR)
      fail_errno("connect to 127.0.0.1:" + std::to_string(port));
    pollfd p{s.fd(), POLLOUT, 0};
    const auto end = clock_type::now() + io_timeout;
    int n = 0;
    while ((n = ::poll(&p, 1, 100)) <= 0) {
      if (n < 0 && errno != EINTR)
        fail_errno("connect to 127.0.0.1:" + std::to_string(port) + " (after EINTR)");
      if (clock_type::now() >= end) {
        errno = ETIMEDOUT;
        fail_errno("connect to 127.0.0.1:" + std::to_string(port) + " (after EINTR)");
      }
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      errno = err;
      fail_errno("connect to 127.0.0.1:" + std::to_string(port));
    }
  }
  return s;
}

/// A raw connection that has completed the native hello (no authentication).
raw_socket connect_hello(std::uint16_t port) {
  auto s = connect_raw(port);
  const auto mine = net::encode(net::hello{});
  send_all(s.fd(), mine.data(), mine.size());
  std::array<std::byte, net::hello_size> back{};
  recv_all(s.fd(), back.data(), back.size());
  const auto h = net::decode_hello(back.data());
  if (h.magic != net::protocol_magic || h.extension_len != 0)
    throw std::runtime_error("unexpected hello from the server");
  return s;
}

std::vector<raw_socket> open_hello_connections(std::uint16_t port, int n) {
  std::vector<raw_socket> out;
  out.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    out.push_back(connect_hello(port));
  return out;
}

template <typename T>
void append_le(std::vector<std::byte>& out, T v) {
  std::array<std::byte, sizeof(T)> b;
  corodist::store_le(b.data(), v);
  out.insert(out.end(), b.begin(), b.end());
}

std::array<std::byte, net::header_size> frame_header_bytes(std::size_t payload_len, std::uint16_t kind,
                                                           std::uint16_t flags, std::uint64_t id) {
  return net::encode(net::frame_header{static_cast<std::uint32_t>(payload_len), kind, flags, id});
}

void append_frame(std::vector<std::byte>& out, std::uint16_t kind, std::uint16_t flags, std::uint64_t id,
                  std::span<const std::byte> payload) {
  const auto h = frame_header_bytes(payload.size(), kind, flags, id);
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), payload.begin(), payload.end());
}

/// Reads one frame (payloads over 64 MiB are refused).
std::pair<net::frame_header, net::bytes> read_frame(int fd) {
  std::array<std::byte, net::header_size> hb{};
  recv_all(fd, hb.data(), hb.size());
  const auto h = net::decode_header(hb.data());
  if (h.payload_len > declared_frame)
    throw std::runtime_error("the server sent a frame of " + std::to_string(h.payload_len) + " bytes");
  net::bytes body(h.payload_len);
  recv_all(fd, body.data(), body.size());
  return {h, std::move(body)};
}

/// Bytes that arrived at the server's side of its connections on `port` and
/// that it has not read yet: the sum of rx_queue in /proc/net/tcp over the
/// established IPv4 sockets whose local port is `port`.
std::size_t unread_at_server(std::uint16_t port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line); // the column names
  std::size_t total = 0;
  while (std::getline(f, line)) {
    unsigned local_port = 0, state = 0;
    unsigned long tx = 0, rx = 0;
    if (std::sscanf(line.c_str(), " %*u: %*x:%x %*x:%*x %x %lx:%lx", &local_port, &state, &tx, &rx) == 4 &&
        local_port == port && state == 1 /* TCP_ESTABLISHED */)
      total += rx;
  }
  return total;
}

/// Sends each socket a frame header declaring `declared_frame` bytes and the
/// first `body_bytes` of it, one socket every `pace` (so that the loop probe
/// sees what one such frame costs, not a burst of them); returns when each was sent.
std::vector<clock_type::time_point> send_half_frames(const std::vector<raw_socket>& socks, std::size_t body_bytes,
                                                     std::chrono::microseconds pace) {
  const auto header = frame_header_bytes(declared_frame, 1, 0, 1); // kind 1 (store SET), never completed
  std::vector<std::byte> partial(header.begin(), header.end());
  partial.resize(net::header_size + body_bytes, std::byte{'h'});
  std::vector<clock_type::time_point> sent;
  sent.reserve(socks.size());
  auto next = clock_type::now();
  for (const auto& s : socks) {
    std::this_thread::sleep_until(next);
    send_all(s.fd(), partial.data(), partial.size());
    sent.push_back(clock_type::now());
    next += pace;
  }
  return sent;
}

/// Waits until the server on `ex` has read every byte sent to `port` and has
/// run what those reads completed (two turns of its loop).
void wait_until_read(const asio::any_io_executor& ex, std::uint16_t port) {
  if (!poll_until([&] { return unread_at_server(port) == 0; }, loop_timeout, 5ms))
    throw std::runtime_error("the server did not read what its connections sent within 10 s");
  on_loop(ex, [] {});
  on_loop(ex, [] {});
}

// ---- reporting --------------------------------------------------------------

/// Prints the case's row, then `summary` on the line below it (the headline
/// figures, which the table has no columns for; every one is also in the JSON).
void report(context& ctx, record r, const std::string& summary) {
  ctx.report(std::move(r));
  if (ctx.status != nullptr)
    ctx.status->pause();
  fmt::print(ctx.table_out, "         {}\n", summary);
  std::fflush(ctx.table_out);
}

void note(context& ctx, std::string what) {
  if (ctx.status != nullptr)
    ctx.status->note(std::move(what));
}

std::chrono::milliseconds baseline_window(const context& ctx) { return ctx.quick ? 200ms : 500ms; }

void add_stall_fields(record& r, const stall_figures& during, const stall_figures& idle) {
  r.extra.emplace_back("max_loop_stall_ms", during.max_ms);
  r.extra.emplace_back("max_loop_busy_ms", during.busy_ms);
  r.extra.emplace_back("loop_wakeups_over_10ms", static_cast<double>(during.over_10ms));
  r.extra.emplace_back("max_loop_own_busy_ms", during.own_busy_ms);
  r.extra.emplace_back("max_machine_stall_ms", during.machine_ms);
  r.extra.emplace_back("idle_max_loop_stall_ms", idle.max_ms);
  r.extra.emplace_back("idle_max_loop_busy_ms", idle.busy_ms);
}

std::string stall_text(const stall_figures& during, const stall_figures& idle) {
  return fmt::format("loop stall max {:.2f} ms, on a CPU {:.2f} ms, {:.2f} ms of it not shared by an idle thread "
                     "(whose own worst was {:.2f} ms); {} wake-ups over 10 ms; idle loop just before: {:.2f} / {:.2f} ms",
                     during.max_ms, during.busy_ms, during.own_busy_ms, during.machine_ms, during.over_10ms,
                     idle.max_ms, idle.busy_ms);
}

/// The worst stall of each case, for the max_loop_stall_ms record.
struct stall_log {
  std::vector<std::tuple<std::string, stall_figures, stall_figures>> cases; // name, during, idle
};

cs::server_options store_options() {
  cs::server_options so;
  so.auth_token = "";
  return so;
}

// ---- 1. pending waits -------------------------------------------------------

void pending_wait_memory(context& ctx, stall_log& stalls) {
  constexpr std::size_t waits = 10'000;
  constexpr std::size_t key_bytes = 32;
  constexpr std::uint64_t wait_timeout_ms = 120'000; // a timer per wait, as a real client's would have
  event_loop loop;
  loop.start();
  auto so = store_options();
  so.max_pending_waits = waits; // the default, 4096 per connection, would refuse the rest
  auto server = cs::store_server::start(loop.get_executor(), so);
  const asio::any_io_executor ex = loop.get_executor();
  const auto port = server->local_endpoint().port();

  // Every request is built before the baseline: 10,000 WAITs on distinct
  // missing keys, then one NUM_KEYS, whose reply means the server has handled
  // every WAIT before it (frames of one connection are served in order).
  std::vector<std::byte> frames;
  frames.reserve(waits * (net::header_size + 16 + key_bytes) + 2 * net::header_size);
  std::vector<std::byte> payload;
  for (std::size_t i = 0; i < waits; ++i) {
    const auto key = fmt::format("hostile/wait/{:019}", i);
    payload.clear();
    append_le<std::uint32_t>(payload, 1);
    append_le<std::uint32_t>(payload, static_cast<std::uint32_t>(key.size()));
    const auto* k = reinterpret_cast<const std::byte*>(key.data());
    payload.insert(payload.end(), k, k + key.size());
    append_le<std::uint64_t>(payload, wait_timeout_ms);
    append_frame(frames, store_op_wait, 0, i + 1, payload);
  }
  append_frame(frames, store_op_num_keys, 0, waits + 1, {});
  if (fmt::format("hostile/wait/{:019}", 0).size() != key_bytes)
    throw std::logic_error("the wait keys are not 32 bytes");

  auto sock = connect_hello(port);
  std::vector<std::byte> warm;
  append_frame(warm, store_op_num_keys, 0, 0, {});
  send_all(sock.fd(), warm.data(), warm.size()); // the server's read buffers exist before the baseline
  (void)read_frame(sock.fd());

  const auto idle = loop_probe::idle(ex, baseline_window(ctx));
  trim_heap();
  loop_probe probe(ex);
  const long before = resident_bytes();
  const auto t0 = clock_type::now();
  send_all(sock.fd(), frames.data(), frames.size());
  auto [h, body] = read_frame(sock.fd());
  const double register_s = seconds_since(t0);
  if (h.request_id != waits + 1 || body.empty() || body[0] != std::byte{0}) {
    const std::string text = body.size() > 5 ? std::string(reinterpret_cast<const char*>(body.data()) + 5,
                                                           body.size() - 5)
                                             : std::string();
    throw std::runtime_error(fmt::format("the server answered request {} early (status {}): {}", h.request_id,
                                         body.empty() ? -1 : std::to_integer<int>(body[0]), text));
  }
  const std::size_t accounted = on_loop(ex, [&] { return server->pending_wait_bytes(); });
  const long after = resident_bytes();
  const auto during = probe.stop();
  stalls.cases.emplace_back("pending_wait_memory", during, idle);

  // The client goes: its waits go with it.
  const auto t1 = clock_type::now();
  sock.reset();
  if (!poll_until([&] { return on_loop(ex, [&] { return server->pending_wait_bytes(); }) == 0; }, loop_timeout))
    throw std::runtime_error("the server still held waits 10 s after their client left");
  const double drop_ms = ms_between(t1, clock_type::now());

  const double rss_per_wait = static_cast<double>(after - before) / waits;
  const double accounted_per_wait = static_cast<double>(accounted) / waits;
  record r;
  r.suite = "hostile";
  r.name = "pending_wait_memory";
  r.extra = {{"waits", double(waits)},
             {"key_bytes", double(key_bytes)},
             {"rss_bytes_per_wait", rss_per_wait},
             {"server_accounted_bytes_per_wait", accounted_per_wait},
             {"rss_over_accounted", rss_per_wait / accounted_per_wait},
             {"rss_before", double(before)},
             {"rss_after", double(after)},
             {"register_s", register_s},
             {"drop_all_ms", drop_ms}};
  add_stall_fields(r, during, idle);
  report(ctx, std::move(r),
         fmt::format("{} waits on 32-byte keys: {:.0f} B resident per wait; the server counts {:.0f} B per wait "
                     "against its limits; registered in {:.0f} ms, all removed {:.1f} ms after the client "
                     "left; {}",
                     waits, rss_per_wait, accounted_per_wait, register_s * 1e3, drop_ms, stall_text(during, idle)));
  server.reset();
}

// ---- 1b. refused waits ------------------------------------------------------

/// 8 WAITs of 1,000 keys of 64 KiB on one connection, each over the default
/// 16 MiB a connection's waits may hold (refused with an error reply); then
/// the connection goes. What the server still holds 1 s later, against the
/// baseline before the attack (target: within 2 MiB).
void refused_wait_memory(context& ctx) {
  constexpr std::size_t waits = 8;
  constexpr std::size_t keys_per_wait = 1000;
  constexpr std::size_t key_bytes = 64 * 1024;
  constexpr double target_mib = 2.0;
  event_loop loop;
  loop.start();
  auto server = cs::store_server::start(loop.get_executor(), store_options());
  const auto port = server->local_endpoint().port();

  // One WAIT frame, built before the baseline and sent `waits` times.
  std::vector<std::byte> payload;
  payload.reserve(4 + keys_per_wait * (4 + key_bytes) + 8);
  append_le<std::uint32_t>(payload, static_cast<std::uint32_t>(keys_per_wait));
  for (std::size_t i = 0; i < keys_per_wait; ++i) {
    auto key = fmt::format("hostile/refused/{:06}/", i);
    key.resize(key_bytes, 'k');
    append_le<std::uint32_t>(payload, static_cast<std::uint32_t>(key.size()));
    const auto* k = reinterpret_cast<const std::byte*>(key.data());
    payload.insert(payload.end(), k, k + key.size());
  }
  append_le<std::uint64_t>(payload, 60'000);
  std::vector<std::byte> frame;
  append_frame(frame, store_op_wait, 0, 1, payload);
  payload = {};

  auto sock = connect_hello(port);
  std::vector<std::byte> warm;
  append_frame(warm, store_op_num_keys, 0, 0, {});
  send_all(sock.fd(), warm.data(), warm.size()); // the server's read buffers exist before the baseline
  (void)read_frame(sock.fd());
  trim_heap();
  const long before = resident_bytes();
  long peak = before;
  for (std::size_t i = 0; i < waits; ++i) {
    send_all(sock.fd(), frame.data(), frame.size());
    auto [h, body] = read_frame(sock.fd());
    if (body.empty() || body[0] == std::byte{0})
      throw std::runtime_error("the server accepted a wait over its 16 MiB per connection");
    peak = std::max(peak, resident_bytes());
  }
  sock.reset();
  const auto t0 = clock_type::now();
  if (!poll_until([&] { return server->connection_count() == 0; }, loop_timeout))
    throw std::runtime_error("the server kept the connection 10 s after it closed");
  std::this_thread::sleep_until(t0 + 1s);
  const long after = resident_bytes();
  const double retained_mib = static_cast<double>(after - before) / (1 << 20);
  record r;
  r.suite = "hostile";
  r.name = "refused_wait_memory";
  r.extra = {{"waits", double(waits)},
             {"keys_per_wait", double(keys_per_wait)},
             {"key_bytes", double(key_bytes)},
             {"rss_before", double(before)},
             {"rss_peak", double(peak)},
             {"rss_after_1s", double(after)},
             {"retained_mib", retained_mib},
             {"target_retained_mib", target_mib},
             {"meets_target", retained_mib <= target_mib ? 1.0 : 0.0}};
  report(ctx, std::move(r),
         fmt::format("{} refused WAITs of {} keys of {} KiB: resident {:.1f} MiB at the peak, {:+.1f} MiB against "
                     "the baseline 1 s after the connection closed (target <= {:.0f}: {})",
                     waits, keys_per_wait, key_bytes / 1024, static_cast<double>(peak - before) / (1 << 20),
                     retained_mib, target_mib, retained_mib <= target_mib ? "met" : "NOT met"));
  server.reset();
}

// ---- 2. idle connections ----------------------------------------------------

void idle_connection_memory(context& ctx, stall_log& stalls) {
  const int conns = ctx.quick ? 200 : 1000;
  event_loop loop;
  loop.start();
  auto server = cs::store_server::start(loop.get_executor(), store_options());
  const asio::any_io_executor ex = loop.get_executor();
  const auto port = server->local_endpoint().port();
  auto warm = connect_hello(port); // the loop's first connection made its per-thread buffers
  std::vector<std::byte> req;
  append_frame(req, store_op_num_keys, 0, 1, {});
  send_all(warm.fd(), req.data(), req.size());
  (void)read_frame(warm.fd());

  const auto idle = loop_probe::idle(ex, baseline_window(ctx));
  trim_heap();
  loop_probe probe(ex);
  const long before = resident_bytes();
  const auto t0 = clock_type::now();
  auto socks = open_hello_connections(port, conns);
  const double open_s = seconds_since(t0);
  if (!poll_until([&] { return on_loop(ex, [&] { return server->connection_count(); }) == std::size_t(conns) + 1; },
                  loop_timeout))
    throw std::runtime_error("the server did not register every connection within 10 s");
  on_loop(ex, [] {}); // each connection's first read is posted
  const long after = resident_bytes();
  const auto during = probe.stop();
  stalls.cases.emplace_back("idle_connection_memory", during, idle);
  socks.clear();

  const double per_conn = static_cast<double>(after - before) / conns;
  record r;
  r.suite = "hostile";
  r.name = "idle_connection_memory";
  r.extra = {{"bytes_per_conn", per_conn},
             {"connections", double(conns)},
             {"rss_before", double(before)},
             {"rss_after", double(after)},
             {"open_s", open_s}};
  add_stall_fields(r, during, idle);
  report(ctx, std::move(r),
         fmt::format("{} connections that completed the hello and stay silent: {:.0f} B resident each (store "
                     "suite's idle_connections_* measures the same in a corodist-store daemon); {}",
                     conns, per_conn, stall_text(during, idle)));
  server.reset();
}

// ---- 3. half-sent frames ----------------------------------------------------

void half_sent_frame_memory(context& ctx, stall_log& stalls, rlim_t fd_limit) {
  constexpr int conns = 500;
  constexpr std::size_t sent_body = 100;
  constexpr auto frame_timeout = 1s;
  constexpr auto pace = 200us; // between two connections' frames
  constexpr double target_bytes = 64 * 1024;

  // (a) The store server (whose frame_timeout is connection_options' default,
  // 30 s: server_options has no field for it): memory per connection.
  double per_conn = 0, frame_per_conn = 0;
  long before = 0, hello_done = 0, after = 0;
  stall_figures idle_a, during_a;
  {
    event_loop loop;
    loop.start();
    auto server = cs::store_server::start(loop.get_executor(), store_options());
    const asio::any_io_executor ex = loop.get_executor();
    const auto port = server->local_endpoint().port();
    note(ctx, "500 half-sent frames (store server)");
    auto warm = connect_hello(port); // the loop's first connection made its per-thread buffers
    std::vector<std::byte> req;
    append_frame(req, store_op_num_keys, 0, 1, {});
    send_all(warm.fd(), req.data(), req.size());
    (void)read_frame(warm.fd());
    idle_a = loop_probe::idle(ex, baseline_window(ctx));
    trim_heap();
    before = resident_bytes();
    auto socks = open_hello_connections(port, conns);
    if (!poll_until([&] { return on_loop(ex, [&] { return server->connection_count(); }) == std::size_t(conns) + 1; },
                    loop_timeout))
      throw std::runtime_error("the server did not register every connection within 10 s");
    on_loop(ex, [] {});
    hello_done = resident_bytes();
    loop_probe probe(ex);
    send_half_frames(socks, sent_body, pace);
    wait_until_read(ex, port);
    after = resident_bytes();
    during_a = probe.stop();
    per_conn = static_cast<double>(after - before) / conns;
    frame_per_conn = static_cast<double>(after - hello_done) / conns;
    const std::size_t open = on_loop(ex, [&] { return server->connection_count(); }) - 1;
    if (open != std::size_t(conns))
      throw std::runtime_error(fmt::format("the store server dropped {} of the half-sent connections early",
                                           conns - static_cast<int>(open)));
    socks.clear();
    server.reset();
  }

  // (b) The same frames to a net::listener with frame_timeout = 1 s and the
  // store server's frame limit: how long until each stalled frame is closed.
  stall_figures idle_b, during_b;
  std::vector<double> closed_after_s;
  {
    event_loop loop;
    loop.start();
    const asio::any_io_executor ex = loop.get_executor();
    net::connection_options copts;
    copts.auth_token = "";
    copts.frame_timeout = frame_timeout;
    copts.max_frame_size = cs::server_options::default_max_value_size + cs::server_options::default_max_key_size + 1024;
    auto listener = on_loop(ex, [&] {
      auto [ec, l] = net::listener::listen(ex, {asio::ip::make_address("127.0.0.1"), 0}, copts,
                                           [](std::shared_ptr<net::connection> c) { c->start(); });
      if (ec)
        throw std::runtime_error("net::listener: " + ec.message());
      l->start();
      return l;
    });
    const auto port = listener->local_endpoint().port();
    note(ctx, "500 half-sent frames (net::listener, frame_timeout 1 s)");
    auto socks = open_hello_connections(port, conns);
    idle_b = loop_probe::idle(ex, baseline_window(ctx));
    loop_probe probe(ex);
    const auto sent_at = send_half_frames(socks, sent_body, pace);
    std::vector<pollfd> fds(socks.size());
    for (std::size_t i = 0; i < socks.size(); ++i)
      fds[i] = pollfd{socks[i].fd(), POLLIN | POLLRDHUP, 0};
    const auto give_up = clock_type::now() + frame_timeout + 10s;
    std::size_t left = fds.size();
    while (left > 0 && clock_type::now() < give_up) {
      const int n = ::poll(fds.data(), fds.size(), 100);
      if (n < 0 && errno != EINTR)
        fail_errno("poll");
      const auto now = clock_type::now();
      for (std::size_t i = 0; i < fds.size() && n > 0; ++i) {
        if (fds[i].fd < 0 || fds[i].revents == 0)
          continue;
        char b = 0;
        const ssize_t k = ::recv(fds[i].fd, &b, 1, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) { // EOF or reset: closed by the server
          closed_after_s.push_back(std::chrono::duration<double>(now - sent_at[i]).count());
          fds[i].fd = -1;
          --left;
        }
      }
    }
    during_b = probe.stop();
    socks.clear();
    on_loop(ex, [&] { listener->close(); });
  }
  std::sort(closed_after_s.begin(), closed_after_s.end());
  const auto pick = [&](double q) {
    return closed_after_s.empty() ? not_applicable
                                  : closed_after_s[static_cast<std::size_t>(q * double(closed_after_s.size() - 1))];
  };
  const auto during = worse(during_a, during_b);
  const auto idle = worse(idle_a, idle_b);
  stalls.cases.emplace_back("half_sent_frame_memory", during, idle);

  record r;
  r.suite = "hostile";
  r.name = "half_sent_frame_memory";
  r.extra = {{"bytes_per_conn", per_conn},
             {"frame_bytes_per_conn", frame_per_conn},
             {"target_bytes_per_conn", target_bytes},
             {"meets_target", per_conn <= target_bytes ? 1.0 : 0.0},
             {"connections", double(conns)},
             {"declared_payload_bytes", double(declared_frame)},
             {"sent_payload_bytes", double(sent_body)},
             {"rss_before", double(before)},
             {"rss_after_hello", double(hello_done)},
             {"rss_after", double(after)},
             {"fd_soft_limit", static_cast<double>(fd_limit)},
             {"frame_timeout_s", std::chrono::duration<double>(frame_timeout).count()},
             {"closed_at_frame_timeout", double(closed_after_s.size())},
             {"closed_after_s_min", pick(0.0)},
             {"closed_after_s_p50", pick(0.5)},
             {"closed_after_s_max", pick(1.0)},
             {"store_max_loop_stall_ms", during_a.max_ms},
             {"listener_max_loop_stall_ms", during_b.max_ms}};
  add_stall_fields(r, during, idle);
  report(ctx, std::move(r),
         fmt::format("{} connections, each the hello then a header declaring 64 MiB + {} B of it: {:.0f} B resident "
                     "each in the store server, {:.0f} B of it for the frame (target <= {:.0f}: {}); with "
                     "frame_timeout = 1 s (net::listener) {} of {} were closed {:.3f} - {:.3f} s after their last "
                     "byte (p50 {:.3f} s); fd limit {}; {}",
                     conns, sent_body, per_conn, frame_per_conn, target_bytes,
                     per_conn <= target_bytes ? "met" : "NOT met", closed_after_s.size(), conns, pick(0.0), pick(1.0),
                     pick(0.5), fd_limit, stall_text(during, idle)));
}

// ---- 4. a legitimate client among slow ones ---------------------------------

/// Trickles one byte to each socket every 50 ms (a tenth of them every 5 ms)
/// from its own thread, until stopped or `limit` passes.
class slowloris {
public:
  slowloris(const std::vector<raw_socket>& socks, std::chrono::seconds limit)
      : dead_(socks.size(), false), thread_([this, &socks, limit] { run(socks, limit); }) {}
  ~slowloris() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable())
      thread_.join();
  }
  std::size_t bytes_sent() const { return sent_; }
  std::size_t dropped() const { return static_cast<std::size_t>(std::count(dead_.begin(), dead_.end(), true)); }

private:
  void run(const std::vector<raw_socket>& socks, std::chrono::seconds limit) {
    const auto end = clock_type::now() + limit;
    const std::size_t per_tick = std::max<std::size_t>(1, socks.size() / 10);
    auto next = clock_type::now();
    std::size_t i = 0;
    while (!stop_ && clock_type::now() < end) {
      for (std::size_t k = 0; k < per_tick; ++k, ++i) {
        const auto j = i % socks.size();
        if (dead_[j])
          continue;
        const char b = 's';
        if (::send(socks[j].fd(), &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1)
          ++sent_;
        else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          dead_[j] = true; // the server closed it
      }
      next += 5ms;
      if (clock_type::now() > next + 50ms)
        next = clock_type::now(); // fell behind (a busy machine): no burst to catch up
      std::this_thread::sleep_until(next);
    }
  }

  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> sent_{0};
  std::vector<bool> dead_; // written by the thread only; read after it ended
  std::thread thread_;
};

void legit_get_under_slow(context& ctx, stall_log& stalls) {
  constexpr int slow = 500;
  const auto window = ctx.quick ? 1s : 5s;
  constexpr std::size_t max_samples = 200'000;
  event_loop server_loop, client_loop;
  server_loop.start();
  client_loop.start();
  auto server = cs::store_server::start(server_loop.get_executor(), store_options());
  const asio::any_io_executor sx = server_loop.get_executor();
  const asio::any_io_executor cx = client_loop.get_executor();
  const auto port = server->local_endpoint().port();
  cs::tcp_store_options co;
  co.port = port;
  co.auth_token = "";
  co.timeout = std::chrono::seconds(10);
  auto store = await_on(cx, cs::tcp_store::connect(cx, co), 30s);
  await_on(cx, store->set("hostile/key", "0123456789abcdef"), 10s);

  // `get` of an existing key, one at a time, for `window` (or max_samples).
  auto measure = [&]() -> std::pair<latency_recorder, double> {
    return await_on(
        cx,
        [&]() -> asio::awaitable<std::pair<latency_recorder, double>> {
          for (int i = 0; i < 1000; ++i)
            (void)co_await store->get("hostile/key");
          latency_recorder rec(max_samples);
          const auto start = clock_type::now();
          for (std::size_t i = 0; i < max_samples && clock_type::now() - start < window; ++i) {
            const auto t0 = clock_type::now();
            (void)co_await store->get("hostile/key");
            rec.add(clock_type::now() - t0);
          }
          co_return std::pair{std::move(rec), seconds_since(start)};
        }(),
        window + 30s);
  };

  // Idle: only the probe (which also runs during the attack) on the server's loop.
  note(ctx, "legit get, idle server");
  const auto idle_stall_before = loop_probe::idle(sx, baseline_window(ctx));
  stall_figures idle_stall;
  std::pair<latency_recorder, double> idle;
  {
    loop_probe probe(sx);
    idle = measure();
    idle_stall = probe.stop();
  }

  note(ctx, "legit get among 500 slow connections");
  auto socks = open_hello_connections(port, slow);
  {
    // Each slow connection declares a 64 MiB frame, then trickles its bytes.
    const auto header = frame_header_bytes(declared_frame, 1, 0, 1);
    for (const auto& s : socks)
      send_all(s.fd(), header.data(), header.size());
  }
  std::pair<latency_recorder, double> attacked;
  stall_figures during;
  std::size_t trickled = 0, dropped = 0, open_at_end = 0;
  {
    slowloris attack(socks, window + 40s);
    std::this_thread::sleep_for(300ms); // every slow connection has trickled a few bytes
    loop_probe probe(sx);
    attacked = measure();
    during = probe.stop();
    open_at_end = on_loop(sx, [&] { return server->connection_count(); }) - 1; // less the legit client
    attack.stop();
    trickled = attack.bytes_sent();
    dropped = attack.dropped();
  }
  stalls.cases.emplace_back("legit_get_under_500_slow", during, idle_stall_before);
  socks.clear();

  const double idle_p50 = idle.first.percentile(0.5), idle_p99 = idle.first.percentile(0.99);
  const double p50 = attacked.first.percentile(0.5), p99 = attacked.first.percentile(0.99);
  const double ratio = p50 / idle_p50;
  auto r = latency_record("hostile", "legit_get_under_500_slow", attacked.first, attacked.second);
  r.extra = {{"idle_p50_us", idle_p50},
             {"idle_p99_us", idle_p99},
             {"attacked_p50_us", p50},
             {"attacked_p99_us", p99},
             {"attacked_over_idle_p50", ratio},
             {"target_attacked_over_idle_p50", 1.5},
             {"meets_target", ratio <= 1.5 ? 1.0 : 0.0},
             {"idle_samples", double(idle.first.size())},
             {"attacked_samples", double(attacked.first.size())},
             {"slow_connections", double(slow)},
             {"slow_bytes_trickled", double(trickled)},
             {"slow_connections_open_at_end", double(open_at_end)},
             {"slow_connections_dropped", double(dropped)},
             {"idle_phase_max_loop_stall_ms", idle_stall.max_ms}};
  add_stall_fields(r, during, idle_stall_before);
  report(ctx, std::move(r),
         fmt::format("get p50/p99 {:.1f}/{:.1f} us idle, {:.1f}/{:.1f} us among {} slow connections "
                     "({} bytes trickled, {} still open): {:.2f} x idle (target <= 1.5: {}); raw floor {:.1f} us; {}",
                     idle_p50, idle_p99, p50, p99, slow, trickled, open_at_end, ratio, ratio <= 1.5 ? "met" : "NOT met",
                     ctx.raw_p50_us, stall_text(during, idle_stall_before)));
  store.reset();
  server.reset();
}

// ---- 5. decode amplification ------------------------------------------------

// The decoder's bound (src/rpc/codec.cpp): a body may decode into at most
// max(4 x its size, 16 MiB) of msgpack objects, counted before any is made.
constexpr std::size_t decode_expansion = 4;
constexpr std::size_t decode_floor = std::size_t{16} << 20;

std::size_t object_budget(std::size_t body_len) {
  return std::max(decode_expansion * body_len, decode_floor) / sizeof(msgpack::object);
}

/// A call frame to "sink"(std::vector<nil_t>, std::string) whose body is
/// `body_len` bytes and decodes into `objects` msgpack objects: the nils are
/// the objects, the string pads the body.
struct call_frame {
  std::array<std::byte, net::header_size> header;
  net::bytes payload;
  std::size_t nils = 0;
  std::size_t pad = 0;
};

call_frame make_call_frame(std::size_t body_len, std::size_t objects, std::uint64_t id) {
  constexpr std::size_t other_objects = 6; // call array, name, argument array, nil array, pad string, timeout
  call_frame f;
  f.nils = objects - other_objects;
  std::size_t pad = body_len - f.nils - 18; // the msgpack headers of this shape take 18 bytes
  for (int attempt = 0; attempt < 2; ++attempt) {
    rpc::encoder e;
    const std::vector<msgpack::type::nil_t> nils(f.nils);
    const std::string padding(pad, 'p');
    // The call body of the RPC protocol, as a foreign client writes it:
    // [function name, [args...], timeout_ms (0: none)].
    auto& pk = e.packer();
    pk.pack_array(3);
    rpc::pack_value(pk, "sink");
    pk.pack_array(2);
    rpc::pack_value(pk, nils);
    rpc::pack_value(pk, padding);
    pk.pack(std::uint64_t{0});
    auto p = e.finish();
    const std::size_t got = corodist::load_le<std::uint32_t>(p.body.data());
    if (got == body_len && p.attachments.empty()) {
      f.pad = pad;
      f.payload = std::move(p.body);
      f.header = frame_header_bytes(f.payload.size(), rpc_kind_call, 0, id);
      return f;
    }
    pad = pad + body_len - got;
  }
  throw std::logic_error("cannot shape a call body of " + std::to_string(body_len) + " bytes");
}

struct call_outcome {
  bool ok = false;
  std::uint64_t value = 0;
  std::string error;
  double seconds = 0;
  long growth = 0; ///< peak resident memory during the call, less the resident memory before it
};

/// Bytes of memory malloc has mapped for large blocks still in use (the decoded
/// objects and received bodies of these calls are such blocks).
std::size_t mapped_in_use() { return ::mallinfo2().hblkhd; }

/// Sends `f` on `fd` and reads its reply, measuring the process's peak resident
/// growth; then waits until the callee has freed what the call allocated (its
/// worker frees the decoded message after the reply may already have left).
call_outcome timed_call(int fd, const call_frame& f) {
  const std::size_t mapped_before = mapped_in_use();
  trim_heap();
  if (!reset_peak_resident())
    throw std::runtime_error("cannot reset the peak resident memory (/proc/self/clear_refs)");
  const long base = resident_bytes();
  call_outcome out;
  const auto t0 = clock_type::now();
  send_all(fd, f.header.data(), f.header.size());
  send_all(fd, f.payload.data(), f.payload.size());
  auto [h, body] = read_frame(fd);
  out.seconds = seconds_since(t0);
  out.growth = proc_status_bytes("VmHWM") - base;
  rpc::codec_context cctx;
  auto parsed = rpc::parse_payload(std::move(body), cctx);
  if (h.kind == rpc_kind_reply) {
    out.ok = true;
    out.value = parsed.body.get().as<std::uint64_t>();
  } else {
    const auto [code, type, text] = parsed.body.get().as<std::tuple<int, std::string, std::string>>();
    out.error = type + ": " + text;
  }
  if (!poll_until([&] { return mapped_in_use() <= mapped_before; }, loop_timeout))
    throw std::runtime_error("the callee still held a call's memory 10 s after its reply");
  return out;
}

void decode_amplification(context& ctx, stall_log& stalls) {
  constexpr std::size_t body_len = std::size_t{32} << 20;
  const int rounds = ctx.quick ? 1 : 3;
  // Received buffers of 1 MiB and more are normally recycled (a cache of up
  // to 4): off here, so that each call's receive buffer is new memory.
  struct cache_off {
    std::size_t was = net::buffer_cache_limit();
    cache_off() { net::set_buffer_cache_limit(0); }
    ~cache_off() { net::set_buffer_cache_limit(was); }
  } no_recycling;

  event_loop store_loop, client_loop, server_loop;
  store_loop.start();
  client_loop.start();
  server_loop.start();
  auto kv = std::make_shared<cs::hash_store>(store_loop.get_executor());
  std::unique_ptr<rpc::agent> agents[2];
  for (int rank = 0; rank < 2; ++rank) {
    rpc::agent_options o;
    o.name = rank == 0 ? "client" : "server";
    o.rank = rank;
    o.world_size = 2;
    o.store = kv;
    o.auth_token = "";
    o.rpc_timeout = 60s;
    o.init_timeout = 60s;
    o.shutdown_timeout = 30s;
    agents[rank] = std::make_unique<rpc::agent>(rank == 0 ? client_loop : server_loop, o);
  }
  agents[1]->register_function(
      "sink", [](std::vector<msgpack::type::nil_t> nils, std::string pad) -> asio::awaitable<std::uint64_t> {
        co_return nils.size() + pad.size();
      });
  agents[1]->register_function("noop", []() -> asio::awaitable<void> { co_return; });
  {
    std::thread t([&] { agents[1]->start(); });
    agents[0]->start();
    t.join();
  }
  const asio::any_io_executor sx = server_loop.get_executor();

  note(ctx, "shaping 32 MiB call bodies");
  const std::size_t budget = object_budget(body_len);
  const auto admitted = make_call_frame(body_len, budget, 1);
  const auto refused = make_call_frame(body_len, budget + 1, 2);
  // Under 4 MiB the bound's 16 MiB floor applies: the body of nils alone (no
  // pad) that decodes into the most objects the floor admits.
  const std::size_t floor_objects = object_budget(0);
  const std::size_t floor_len = floor_objects - 6 + 18;
  const auto at_floor = make_call_frame(floor_len, floor_objects, 3);

  // The attacker: a raw connection that says it is rank 0, then sends the
  // prepared frames (already resident: not part of the growth measured).
  auto sock = connect_hello(agents[1]->local_endpoint().port());
  {
    std::vector<std::byte> id(4);
    corodist::store_le(id.data(), std::int32_t{0});
    std::vector<std::byte> f;
    append_frame(f, rpc_kind_identify, net::frame_flags::one_way, 0, id);
    send_all(sock.fd(), f.data(), f.size());
  }

  note(ctx, "32 MiB calls at the decode bound");
  const auto idle = loop_probe::idle(sx, baseline_window(ctx));
  loop_probe probe(sx);
  trim_heap();
  const long rss_start = resident_bytes();
  // The refusal first, while the receive path has no spare memory in malloc
  // yet: what receiving any 32 MiB message costs.
  const auto over = timed_call(sock.fd(), refused);
  if (over.ok || over.error.find("msgpack objects") == std::string::npos)
    throw std::runtime_error("the call over the decode bound was not refused by it: " +
                             (over.ok ? std::string("it was served") : over.error));
  std::vector<call_outcome> ok_calls;
  for (int i = 0; i < rounds; ++i) {
    auto c = timed_call(sock.fd(), admitted);
    if (!c.ok || c.value != admitted.nils + admitted.pad)
      throw std::runtime_error("the call at the decode bound was not served: " + c.error);
    ok_calls.push_back(c);
  }
  trim_heap();
  const long retained = resident_bytes() - rss_start;
  const auto small = timed_call(sock.fd(), at_floor);
  if (!small.ok || small.value != at_floor.nils + at_floor.pad)
    throw std::runtime_error("the call at the decode bound's floor was not served: " + small.error);
  const auto during = probe.stop();
  stalls.cases.emplace_back("decode_amplification", during, idle);
  agents[0]->rpc_sync<void>(10s, "server", "noop"); // the callee still serves its peers
  sock.reset();
  {
    std::thread t([&] { agents[1]->shutdown(); });
    agents[0]->shutdown();
    t.join();
  }

  auto by_growth = ok_calls;
  std::sort(by_growth.begin(), by_growth.end(), [](auto& a, auto& b) { return a.growth < b.growth; });
  auto by_time = ok_calls;
  std::sort(by_time.begin(), by_time.end(), [](auto& a, auto& b) { return a.seconds < b.seconds; });
  const double body = double(body_len);
  const double x_worst = double(by_growth.back().growth) / body;
  const double x_median = double(by_growth[by_growth.size() / 2].growth) / body;
  const double call_ms = by_time[by_time.size() / 2].seconds * 1e3;
  const double objects_x = double(budget * sizeof(msgpack::object)) / body; // what the bound lets decoding make
  const double arguments_x = double(admitted.nils * sizeof(msgpack::type::nil_t) + admitted.pad) / body;
  const double refused_x = double(over.growth) / body;
  const bool met = objects_x <= double(decode_expansion);
  record r;
  r.suite = "hostile";
  r.name = "decode_amplification";
  r.extra = {{"body_bytes", body},
             {"objects_admitted", double(budget)},
             {"nils", double(admitted.nils)},
             {"pad_bytes", double(admitted.pad)},
             {"peak_growth_per_body_byte", x_worst},
             {"peak_growth_per_body_byte_median", x_median},
             {"peak_growth_bytes", double(by_growth.back().growth)},
             {"decoded_objects_per_body_byte", objects_x},
             {"arguments_per_body_byte", arguments_x},
             {"target_decoded_objects_per_body_byte", double(decode_expansion)},
             {"meets_target", met ? 1.0 : 0.0},
             {"call_ms", call_ms},
             {"refused_peak_growth_per_body_byte", refused_x},
             {"refused_call_ms", over.seconds * 1e3},
             {"retained_after_calls_per_body_byte", double(retained) / body},
             {"rounds", double(rounds)},
             {"floor_body_bytes", double(floor_len)},
             {"floor_objects_admitted", double(floor_objects)},
             {"floor_peak_growth_per_body_byte", double(small.growth) / double(floor_len)},
             {"floor_decoded_objects_per_body_byte", double(floor_objects * sizeof(msgpack::object)) / double(floor_len)}};
  add_stall_fields(r, during, idle);
  report(ctx, std::move(r),
         fmt::format("32 MiB body = {} nils + a {:.1f} MiB string, {} msgpack objects (the most the bound admits): "
                     "peak resident growth {:.2f} x the body (median of {}: {:.2f} x), made of the received body 1 x + "
                     "decoded objects {:.2f} x (target <= 4: {}) + the C++ arguments {:.2f} x; served in {:.0f} ms. "
                     "One object more: refused in {:.0f} ms, growth {:.2f} x (the body; the 16 MiB buffer it grew from "
                     "gives its pages back once copied); after all calls the process holds {:.2f} x more than before "
                     "them. At the bound's 16 MiB floor, a {:.0f} KiB body of {} nils: growth {:.1f} x its size ({:.1f} MiB); {}",
                     admitted.nils, admitted.pad / 1048576.0, budget, x_worst, rounds, x_median, objects_x,
                     met ? "met" : "NOT met", arguments_x, call_ms, over.seconds * 1e3, refused_x,
                     double(retained) / body, floor_len / 1024.0, at_floor.nils, double(small.growth) / double(floor_len),
                     double(small.growth) / 1048576.0, stall_text(during, idle)));
}

// ---- 6. a peer that never reads its replies -----------------------------------

/// A call frame of the RPC protocol to `fn`(n), as a foreign client writes it.
std::vector<std::byte> size_call_frame(const char* fn, std::uint64_t n, std::uint64_t id) {
  rpc::encoder e;
  auto& pk = e.packer();
  pk.pack_array(3);
  rpc::pack_value(pk, fn);
  pk.pack_array(1);
  pk.pack(n);
  pk.pack(std::uint64_t{0});
  auto p = e.finish();
  std::vector<std::byte> f;
  append_frame(f, rpc_kind_call, 0, id, p.body);
  return f;
}

// A raw connection that says it is rank 0 sends calls for results of `reply_mib` MiB and
// never reads a reply: the agent stops starting its calls once the memory held
// for it would pass max_buffered_output_per_peer, and drops it when that output
// makes no progress for peer_timeout. Measured: the process's peak resident
// growth over the whole attack (VmHWM after clear_refs), against that cap.
void unread_replies_memory(context& ctx, stall_log& stalls, std::uint64_t reply_mib, const std::string& name) {
  constexpr std::size_t cap = std::size_t{256} << 20; // agent_options' default per-peer cap
  const std::uint64_t reply_size = reply_mib << 20;
  event_loop store_loop, client_loop, server_loop;
  store_loop.start();
  client_loop.start();
  server_loop.start();
  auto kv = std::make_shared<cs::hash_store>(store_loop.get_executor());
  std::unique_ptr<rpc::agent> agents[2];
  for (int rank = 0; rank < 2; ++rank) {
    rpc::agent_options o;
    o.name = rank == 0 ? "client" : "server";
    o.rank = rank;
    o.world_size = 2;
    o.store = kv;
    o.auth_token = "";
    o.rpc_timeout = 60s;
    o.init_timeout = 60s;
    o.shutdown_timeout = 30s;
    o.max_buffered_output_per_peer = cap;
    // A peer whose replies stop moving is dropped after this (flow control
    // holds its calls back meanwhile): within loop_timeout.
    o.peer_timeout = 2s;
    agents[rank] = std::make_unique<rpc::agent>(rank == 0 ? client_loop : server_loop, o);
  }
  agents[1]->register_function("blob", [](std::uint64_t n) { return std::string(n, 'z'); });
  {
    std::thread t([&] { agents[1]->start(); });
    agents[0]->start();
    t.join();
  }
  const asio::any_io_executor sx = server_loop.get_executor();
  // Warm: the server's pool and buffers have served such a call once.
  if (agents[0]->rpc_sync<std::string>(30s, "server", "blob", reply_size).size() != reply_size)
    throw std::runtime_error("the warm-up call returned a wrong result");

  auto sock = connect_hello(agents[1]->local_endpoint().port());
  {
    std::vector<std::byte> id(4);
    corodist::store_le(id.data(), std::int32_t{0});
    std::vector<std::byte> f;
    append_frame(f, rpc_kind_identify, net::frame_flags::one_way, 0, id);
    send_all(sock.fd(), f.data(), f.size());
  }
  const auto idle = loop_probe::idle(sx, baseline_window(ctx));
  loop_probe probe(sx);
  trim_heap();
  if (!reset_peak_resident())
    throw std::runtime_error("cannot reset the peak resident memory (/proc/self/clear_refs)");
  const long base = resident_bytes();
  const auto t0 = clock_type::now();
  // At most 2 x the cap's worth of calls; the agent drops us well before.
  const std::uint64_t most = 2 * cap / reply_size;
  std::uint64_t sent = 0;
  bool dropped = false;
  for (std::uint64_t id = 1; id <= most && !dropped; ++id) {
    const auto f = size_call_frame("blob", reply_size, id);
    const ssize_t k = ::send(sock.fd(), f.data(), f.size(), MSG_NOSIGNAL);
    if (k != static_cast<ssize_t>(f.size())) {
      dropped = true;
      break;
    }
    ++sent;
    pollfd p{sock.fd(), 0, 0};
    dropped = ::poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP));
  }
  // The last calls may still be served: wait for the close. The agent's FIN
  // waits behind the replies this side never reads, so the close shows only as
  // the reset that answers a byte sent to the closed socket: a one-way call
  // frame (which the agent ignores) every 10 ms.
  std::vector<std::byte> probe_frame;
  append_frame(probe_frame, rpc_kind_call, net::frame_flags::one_way, 0, {});
  auto last_probe = clock_type::now() - 1s;
  if (!dropped)
    dropped = poll_until(
        [&] {
          pollfd p{sock.fd(), 0, 0};
          if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP)))
            return true;
          if (clock_type::now() - last_probe >= 10ms) {
            last_probe = clock_type::now();
            if (::send(sock.fd(), probe_frame.data(), probe_frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
                errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
              return true;
          }
          return false;
        },
        loop_timeout);
  const double attack_s = seconds_since(t0);
  const long growth = proc_status_bytes("VmHWM") - base;
  const auto during = probe.stop();
  stalls.cases.emplace_back(name, during, idle);
  if (!dropped)
    throw std::runtime_error("the agent did not drop a peer that never reads after " + std::to_string(sent) +
                             " calls for " + std::to_string(reply_mib) + " MiB");
  // The other peer is served as before.
  if (agents[0]->rpc_sync<std::string>(10s, "server", "blob", std::uint64_t{16}) != std::string(16, 'z'))
    throw std::runtime_error("the agent did not serve its other peer after dropping the one that never reads");
  sock.reset();
  {
    std::thread t([&] { agents[1]->shutdown(); });
    agents[0]->shutdown();
    t.join();
  }
  const double ratio = double(growth) / double(cap);
  record r;
  r.suite = "hostile";
  r.name = name;
  r.extra = {{"cap_bytes", double(cap)},
             {"reply_bytes", double(reply_size)},
             {"calls_sent", double(sent)},
             {"peak_growth_bytes", double(growth)},
             {"peak_growth_per_cap", ratio},
             {"target_peak_growth_per_cap", 1.10},
             {"meets_target", ratio <= 1.10 ? 1.0 : 0.0},
             {"attack_s", attack_s}};
  add_stall_fields(r, during, idle);
  report(ctx, std::move(r),
         fmt::format("a peer that sent {} calls for {} MiB and read nothing was dropped after {:.2f} s; the process's "
                     "peak resident growth {:.1f} MiB = {:.3f} x the {} MiB per-peer cap (target <= 1.10: {}); the "
                     "other peer still served; {}",
                     sent, reply_mib, attack_s, growth / 1048576.0, ratio, cap >> 20, ratio <= 1.10 ? "met" : "NOT met",
                     stall_text(during, idle)));
}

// ---- 7. the loop stalls, case by case ----------------------------------------

void stall_summary(context& ctx, const stall_log& stalls) {
  record r;
  r.suite = "hostile";
  r.name = "max_loop_stall_ms";
  double worst = 0, worst_idle = 0;
  std::string text;
  double worst_busy = 0, worst_own = 0, worst_machine = 0;
  for (const auto& [name, during, idle] : stalls.cases) {
    r.extra.emplace_back(name + "_max_stall_ms", during.max_ms);
    r.extra.emplace_back(name + "_max_busy_ms", during.busy_ms);
    r.extra.emplace_back(name + "_max_own_busy_ms", during.own_busy_ms);
    r.extra.emplace_back(name + "_max_machine_stall_ms", during.machine_ms);
    r.extra.emplace_back(name + "_idle_max_stall_ms", idle.max_ms);
    if (name != "pending_wait_memory" && name != "idle_connection_memory" &&
        name.rfind("unread_replies_memory", 0) != 0) { // the cases 3 - 5
      worst = std::max(worst, during.max_ms);
      worst_busy = std::max(worst_busy, during.busy_ms);
      worst_own = std::max(worst_own, during.own_busy_ms);
      worst_machine = std::max(worst_machine, during.machine_ms);
      worst_idle = std::max(worst_idle, idle.max_ms);
    }
    text += fmt::format("{} {:.1f} / {:.1f} / {:.1f} (idle thread {:.1f}; idle loop {:.1f}); ", name, during.max_ms,
                        during.busy_ms, during.own_busy_ms, during.machine_ms, idle.max_ms);
  }
  r.extra.emplace_back("max_loop_stall_ms", worst);
  r.extra.emplace_back("max_loop_busy_ms", worst_busy);
  r.extra.emplace_back("max_loop_own_busy_ms", worst_own);
  r.extra.emplace_back("max_machine_stall_ms", worst_machine);
  r.extra.emplace_back("idle_max_loop_stall_ms", worst_idle);
  r.extra.emplace_back("target_max_loop_stall_ms", 10.0);
  r.extra.emplace_back("meets_target", worst <= 10.0 ? 1.0 : 0.0);
  r.extra.emplace_back("meets_target_cpu", worst_own <= 10.0 ? 1.0 : 0.0);
  report(ctx, std::move(r),
         fmt::format("worst lateness of a 1 ms timer on the server's loop / the part of it the loop was on a CPU / "
                     "that part without the stalls an idle thread of the process shared, ms: {}worst of cases 3-5 "
                     "{:.1f} / {:.1f} / {:.1f} ms (target <= 10: {} / {} / {}); the idle thread's worst {:.1f} ms",
                     text, worst, worst_busy, worst_own, worst <= 10.0 ? "met" : "NOT met",
                     worst_busy <= 10.0 ? "met" : "NOT met", worst_own <= 10.0 ? "met" : "NOT met", worst_machine));
}

void run_hostile_suite(context& ctx) {
  const rlim_t fd_limit = raise_fd_limit(); // 500 connections a case, two descriptors each in this process
  // Every attack makes the servers warn once per connection (500 lines a case): errors only while it runs.
  struct quiet_logs {
    std::string was{log_level()};
    quiet_logs() { set_log_level("error"); }
    ~quiet_logs() { set_log_level(was); }
  } quiet;
  stall_log stalls;
  std::vector<std::string> failed;
  auto run_case = [&](const char* name, auto&& body) {
    note(ctx, name);
    try {
      body();
    } catch (const std::exception& e) {
      if (ctx.status != nullptr)
        ctx.status->pause();
      fmt::print(stderr, "corodist-bench: hostile case {} failed: {}\n", name, e.what());
      failed.push_back(name);
    }
  };
  run_case("pending_wait_memory", [&] { pending_wait_memory(ctx, stalls); });
  run_case("refused_wait_memory", [&] { refused_wait_memory(ctx); });
  run_case("idle_connection_memory", [&] { idle_connection_memory(ctx, stalls); });
  run_case("half_sent_frame_memory", [&] { half_sent_frame_memory(ctx, stalls, fd_limit); });
  run_case("legit_get_under_500_slow", [&] { legit_get_under_slow(ctx, stalls); });
  run_case("decode_amplification", [&] { decode_amplification(ctx, stalls); });
  run_case("unread_replies_memory", [&] { unread_replies_memory(ctx, stalls, 1, "unread_replies_memory"); });
  run_case("unread_replies_memory_32MiB",
           [&] { unread_replies_memory(ctx, stalls, 32, "unread_replies_memory_32MiB"); });
  stall_summary(ctx, stalls);
  if (!failed.empty()) {
    std::string names;
    for (auto& n : failed)
      names += (names.empty() ? "" : ", ") + n;
    throw std::runtime_error("failed cases: " + names);
  }
}

const suite_registrar registrar("hostile", &run_hostile_suite, 45, 6);

} // namespace
} // namespace corodist::bench
