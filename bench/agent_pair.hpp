#pragma once
/// \file
/// Two rpc::agents in this process ("client" w0 and "server" w1), each on an
/// event-loop thread of its own, over loopback, meeting in a hash_store on a
/// third, idle loop: the rpc and observability suites' pair.

#include <corodist/core/event_loop.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/hash_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <atomic>
#include <cstdint>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

namespace corodist::bench {

/// How long one case run on the client loop may take.
inline constexpr auto case_timeout = std::chrono::seconds(120);

/// An item of the stream suite's latency case: when it was written (the
/// steady clock's nanoseconds; both agents are in this process) and its bytes.
struct stamped_item {
  std::int64_t sent_ns = 0;
  std::string data;
  MSGPACK_DEFINE(sent_ns, data);
};

inline std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// What the server's "cancel_probe" reports (the cancel latency case): that
/// it is waiting, and when (steady_clock, ns) its wait ended cancelled.
struct cancel_probe_state {
  std::atomic<bool> waiting{false};
  std::atomic<std::int64_t> observed_ns{0}; // 0: not yet
};
inline cancel_probe_state& cancel_probe() {
  static cancel_probe_state s;
  return s;
}

inline void register_functions(rpc::agent& a) {
  // The stream suite's server streams: `n` items of `bytes` as fast as the
  // window allows (a string, or a zero-copy attachment), and paced items
  // stamped when written, `interval_ns` apart.
  a.register_stream("items", [](rpc::stream_writer<std::string>& w, std::uint64_t n,
                                std::uint64_t bytes) -> asio::awaitable<void> {
    const std::string item(bytes, 'x');
    for (std::uint64_t i = 0; i < n; ++i)
      co_await w.write(item);
  });
  a.register_stream("attachments", [](rpc::stream_writer<rpc::attachment>& w, std::uint64_t n,
                                      std::uint64_t bytes) -> asio::awaitable<void> {
    const rpc::attachment item(std::vector<std::byte>(bytes, std::byte{'x'}));
    for (std::uint64_t i = 0; i < n; ++i)
      co_await w.write(item);
  });
  a.register_stream("paced", [](rpc::stream_writer<stamped_item>& w, std::uint64_t n, std::uint64_t bytes,
                                std::uint64_t interval_ns) -> asio::awaitable<void> {
    asio::steady_timer t(co_await asio::this_coro::executor);
    stamped_item item;
    item.data.assign(bytes, 'x');
    for (std::uint64_t i = 0; i < n; ++i) {
      t.expires_after(std::chrono::nanoseconds(interval_ns));
      co_await t.async_wait(asio::use_awaitable);
      item.sent_ns = steady_ns();
      co_await w.write(item);
    }
  });
  // Coroutine functions run on the server's loop; "plain_noop" on its pool.
  a.register_function("noop", []() -> asio::awaitable<void> { co_return; });
  a.register_function("plain_noop", [] {});
  a.register_function("size_of", [](const std::string& s) -> asio::awaitable<std::size_t> { co_return s.size(); });
  a.register_function("att_size", [](const rpc::attachment& b) -> asio::awaitable<std::size_t> { co_return b.size(); });
  a.register_function("echo", [](rpc::attachment b) -> asio::awaitable<rpc::attachment> { co_return b; });
  a.register_function("add", [](int x, int y) -> asio::awaitable<int> { co_return x + y; });
  // Waits (an hour) until cancelled; records when it saw the cancellation.
  a.register_function("cancel_probe", []() -> asio::awaitable<void> {
    auto& p = cancel_probe();
    asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::hours(1));
    p.waiting.store(true, std::memory_order_release);
    auto [ec] = co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    (void)ec;
    p.observed_ns.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_release);
  });
}

class agent_pair {
public:
  /// `tls`: the agents' agent_options::tls (default: plain TCP, whatever CORODIST_TLS_* says).
  explicit agent_pair(std::chrono::microseconds sync_spin = {},
                      std::optional<net::tls_options> tls = net::tls_options{}) {
    store_loop_.start();
    client_loop_.start();
    server_loop_.start();
    auto store = std::make_shared<store::hash_store>(store_loop_.get_executor());
    for (int r = 0; r < 2; ++r) {
      rpc::agent_options o;
      o.name = r == 0 ? "client" : "server";
      o.rank = r;
      o.world_size = 2;
      o.store = store;
      o.auth_token = "";
      o.rpc_timeout = std::chrono::seconds(60);
      o.sync_spin = sync_spin;
      o.tls = tls;
      agents_[r] = std::make_unique<rpc::agent>(r == 0 ? client_loop_ : server_loop_, o);
      register_functions(*agents_[r]);
    }
    std::thread t([&] { agents_[1]->start(); });
    agents_[0]->start();
    t.join();
  }
  ~agent_pair() {
    std::thread t([&] { agents_[1]->shutdown(); });
    agents_[0]->shutdown();
    t.join();
    agents_[0].reset();
    agents_[1].reset();
  }

  rpc::agent& client() { return *agents_[0]; }

  /// Runs `make(executor)` on the client loop and waits (bounded) for its result.
  template <typename F>
  auto run_on_client(F make) {
    auto fut = asio::co_spawn(client_loop_.get_executor(), make(asio::any_io_executor(client_loop_.get_executor())),
                              asio::use_future);
    if (fut.wait_for(case_timeout) != std::future_status::ready)
      throw std::runtime_error("rpc benchmark case timed out");
    return fut.get();
  }

private:
  event_loop store_loop_;
  event_loop client_loop_;
  event_loop server_loop_;
  std::unique_ptr<rpc::agent> agents_[2];
};


} // namespace corodist::bench
