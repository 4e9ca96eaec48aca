#include "launcher.hpp"
#include "output.hpp"
#include "signals.hpp"

#include <corodist/core/run_blocking.hpp>
#include <corodist/store/tcp_store.hpp>


#include <asio/ip/tcp.hpp>

#include <algorithm>

namespace corodist::tools::launch {

namespace cs = corodist::store;

namespace {

/// At the end, how long node 0's launcher keeps the store up for the launchers still connected.
constexpr auto host_linger = std::chrono::seconds(5);
/// The launchers' waits on the store are cut in slices this long, so that a
/// signal to the launcher is seen between them.
constexpr auto wait_slice = std::chrono::milliseconds(250);
/// A watcher's wait for the end of a generation is renewed after this long
/// (shorter than the 5 s after which the store client warns of a long wait).
constexpr auto watch_slice = std::chrono::seconds(2);
/// An elastic launcher that could not bind the store's address connects for
/// this long while nothing listens there, then tries to bind it again.
constexpr auto host_retry_slice = std::chrono::seconds(1);

} // namespace

// Waits (on the loop) for a generation's end key and wakes the supervisor
// with its value, or with "lost <why>" when the store is gone.
asio::awaitable<void> watch_end(std::shared_ptr<cs::store> store, std::string key, std::shared_ptr<watch_state> w) {
  std::string v;
  for (;;) {
    try {
      v = co_await store->get(key, watch_slice);
      break;
    } catch (const corodist::timeout_error&) {
      if (w->closing)
        co_return;
    } catch (const std::exception& e) {
      if (w->closing)
        co_return;
      v = std::string("lost ") + e.what();
      break;
    }
  }
  {
    std::lock_guard lock(w->m);
    w->value = std::move(v);
  }
  wake_supervisor();
}

std::string launcher::store_address() const {
  return (s_.master_addr.find(':') != std::string::npos ? "[" + s_.master_addr + "]" : s_.master_addr) + ":" +
         std::to_string(s_.master_port);
}

// Node 0 (for --nnodes MIN:MAX: the launcher that can bind the address)
// hosts the store in this process; every launcher connects to it. Elastic
// launchers that cannot bind and find nobody listening (the host is not up
// yet, or another program held the port for a moment) try to bind again,
// until --join-timeout: one of them always ends up hosting.
void launcher::open_store() {
  const bool try_host = s_.elastic || s_.node_rank == 0;
  cs::server_options so;
  if (try_host) {
    try {
      asio::ip::tcp::resolver resolver(loop_.context());
      auto found = resolver.resolve(s_.master_addr, std::to_string(s_.master_port));
      if (found.empty())
        throw corodist::connection_error("no address");
      so.host = found.begin()->endpoint().address().to_string();
    } catch (const std::system_error& e) {
      throw corodist::connection_error("cannot resolve --master-addr '" + s_.master_addr + "': " + e.what());
    }
    so.port = static_cast<std::uint16_t>(s_.master_port);
  }
  const auto deadline = std::chrono::steady_clock::now() + to_ms(s_.join_timeout_s);
  std::string bind_error;
  for (bool said = false;;) {
    if (try_host) {
      try {
        server_ = cs::store_server::start(loop_.get_executor(), so);
        host_ = true;
        s_.master_port = server_->local_endpoint().port();
      } catch (const corodist::connection_error& e) {
        if (!s_.elastic)
          throw corodist::connection_error("node 0 cannot host the job's store on " + store_address() + ": " +
                                           e.what() + " (another program listens there, or an earlier job's "
                                           "launcher still runs: stop it or pick another --master-port)");
        // Another launcher hosts it (or the address is another host's): a client.
        bind_error = e.what();
      }
    }
    cs::tcp_store_options to;
    to.host = s_.master_addr;
    to.port = static_cast<std::uint16_t>(s_.master_port);
    to.timeout = to_ms(s_.join_timeout_s);
    const bool may_host_later = s_.elastic && !host_;
    if (may_host_later)
      to.refused_retry_window = host_retry_slice;
    try {
      store_ = cs::tcp_store::connect_sync(loop_.get_executor(), to);
      break;
    } catch (const corodist::connection_error&) {
      if (!may_host_later || std::chrono::steady_clock::now() >= deadline)
        throw;
      if (!said)
        say("cannot host the job's store on " + store_address() + " (" + bind_error +
            ") and no store answers there yet: trying both again until --join-timeout");
      said = true;
      check_signals();
    }
  }
  sync_ = std::make_unique<cs::sync_store>(store_);
}

void launcher::close_store() {
  if (watch_)
    watch_->closing = true;
  if (host_ && server_ && sync_) {
    try {
      // Whoever still waits for a round tells the job is over; then the
      // others get a moment to read the end and disconnect.
      (void)sync_->compare_set(round_key(generation_ + 1) + "closed", "", "done");
      (void)corodist::run_blocking(loop_.get_executor(), server_->clients_left(1, host_linger),
                                   "the launcher's linger");
    } catch (const std::exception&) {
    }
  }
  if (auto* t = dynamic_cast<cs::tcp_store*>(store_.get()))
    t->close();
  if (server_)
    server_->stop();
}

// Reads the signal pipe between waits on the store (no worker runs then).
void launcher::check_signals() {
  drain_signals([](int sig) {
    if (sig != SIGCHLD)
      throw stopped_by_signal{sig};
  });
}

// Waits for `key` at most `limit` (zero: forever), in slices; nullopt at the limit.
std::optional<std::string> launcher::wait_key(const std::string& key, std::chrono::milliseconds limit) {
  const auto deadline = clock_type::now() + limit;
  for (;;) {
    check_signals();
    auto slice = wait_slice;
    if (limit.count() > 0) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock_type::now());
      if (left.count() <= 0)
        return std::nullopt;
      slice = std::min(slice, left);
    }
    try {
      sync_->wait({key}, slice);
      return sync_->get(key);
    } catch (const corodist::timeout_error&) {
    }
  }
}

std::string launcher::must_wait_key(const std::string& key, const std::string& what) {
  auto v = wait_key(key, to_ms(s_.join_timeout_s));
  if (!v)
    throw corodist::timeout_error("gave up after " + fmt_seconds(s_.join_timeout_s) +
                                  " (--join-timeout) waiting for " + what);
  return *v;
}
} // namespace corodist::tools::launch
