#include <corodist/store/debug_responder.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/flight_recorder.hpp>
#include <corodist/store/errors.hpp>
#include <corodist/store/watch_stream.hpp>

#include "core/log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <utility>

namespace corodist::store {

namespace {

/// A stream's wait is cut in slices this long, so that a stopped responder ends.
constexpr std::chrono::seconds answer_slice{2};

std::mutex current_mutex;
std::weak_ptr<debug_responder> current_responder;

std::chrono::milliseconds hang_after_from_env(std::chrono::milliseconds fallback) {
  const char* v = std::getenv("CORODIST_HANG_AFTER_MS");
  if (v == nullptr || *v == '\0')
    return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < 0) {
    CORODIST_LOG_WARN("CORODIST_HANG_AFTER_MS={} is not a count of milliseconds; using {} ms", v, fallback.count());
    return fallback;
  }
  return std::chrono::milliseconds(n);
}

/// What a hang watch counts as stuck: a collective, or an RPC call made by this process.
bool watched(const pending_record& p) {
  return p.layer == "collective" || (p.layer == "rpc" && p.entry.op == "call");
}

std::string seconds_text(std::chrono::nanoseconds d) {
  return fmt::format("{:.1f} s", std::chrono::duration<double>(d).count());
}

} // namespace

std::string debug_key(std::string_view name) { return "debug/" + std::string(name); }

struct debug_responder::state {
  std::atomic<bool> stopped{false};
  std::mutex mutex;
  std::shared_ptr<watch_stream> stream; // closed by stop()
  std::shared_ptr<asio::steady_timer> timer; // the scan's; cancelled by stop() (an event loop drains no idle wait)
  std::set<std::pair<std::string, std::uint64_t>> reported; // (recorder, entry id) reported stuck
};

debug_responder::debug_responder(std::shared_ptr<store> job_store, int rank, int world_size,
                                 debug_responder_options opts)
    : store_(job_store), rank_(rank), world_size_(world_size), opts_(opts), state_(std::make_shared<state>()) {}

namespace {

/// Subscribes to asks and registers the rank; false when the store is gone or fails.
asio::awaitable<bool> listen(std::shared_ptr<debug_responder::state> st, std::weak_ptr<store> ws, int rank,
                             int world) {
  try {
    auto s = ws.lock();
    if (!s)
      co_return false;
    auto stream = std::make_shared<watch_stream>(co_await s->watch_key(debug_key("request")));
    {
      std::lock_guard lk(st->mutex);
      if (st->stopped)
        co_return false;
      st->stream = stream;
    }
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    co_await s->set_owned(debug_key("rank/" + std::to_string(rank)),
                          fmt::format("pid {} host {}", ::getpid(), host));
    co_await s->set(debug_key("world_size"), std::to_string(world));
    co_return true;
  } catch (const std::exception& e) {
    CORODIST_LOG_WARN("debug responder of rank {}: cannot start: {}", rank, e.what());
    co_return false;
  }
}

asio::awaitable<void> answer_loop(std::shared_ptr<debug_responder::state> st, std::weak_ptr<store> ws, int rank) {
  std::shared_ptr<watch_stream> stream;
  {
    std::lock_guard lk(st->mutex);
    stream = st->stream;
  }
  while (stream && !st->stopped) {
    watch_event ev;
    try {
      ev = co_await stream->next(answer_slice);
    } catch (const corodist::timeout_error&) {
      continue;
    } catch (const std::exception& e) {
      if (!st->stopped)
        CORODIST_LOG_DEBUG("debug responder of rank {}: stops: {}", rank, e.what());
      co_return;
    }
    if (ev.type == watch_event::kind::deleted)
      continue;
    auto s = ws.lock();
    if (!s)
      co_return;
    try {
      co_await s->set(debug_key("dump/" + std::to_string(rank) + "/" + ev.value), dump_flight_recorders());
    } catch (const std::exception& e) {
      CORODIST_LOG_WARN("debug responder of rank {}: cannot answer ask {}: {}", rank, ev.value, e.what());
    }
  }
}

asio::awaitable<void> listen_and_answer(std::shared_ptr<debug_responder::state> st, std::weak_ptr<store> ws,
                                        int rank, int world) {
  const bool listening = co_await listen(st, ws, rank, world);
  if (listening)
    co_await answer_loop(st, ws, rank);
}

asio::awaitable<void> scan_loop(std::shared_ptr<debug_responder::state> st, std::weak_ptr<store> ws, int rank,
                                debug_responder_options opts) {
  auto timer = std::make_shared<asio::steady_timer>(co_await asio::this_coro::executor);
  {
    std::lock_guard lk(st->mutex);
    if (st->stopped)
      co_return;
    st->timer = timer;
  }
  while (!st->stopped) {
    timer->expires_after(opts.scan_every);
    (void)co_await timer->async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (st->stopped)
      co_return;
    const auto now = record_entry::clock::now();
    std::string first;
    int fresh = 0;
    std::set<std::pair<std::string, std::uint64_t>> still;
    for (const auto& p : pending_flight_records()) {
      if (!watched(p))
        continue;
      const auto since = p.entry.started == record_entry::clock::time_point{} ? p.entry.queued : p.entry.started;
      if (now - since < opts.hang_after)
        continue;
      auto id = std::make_pair(p.name, p.entry.id);
      still.insert(id);
      if (st->reported.contains(id))
        continue;
      if (fresh++ == 0)
        first = fmt::format("rank {}: {} #{} ({}) on '{}' waiting since {}", rank, p.entry.op, p.entry.seq,
                            p.entry.detail, p.name, seconds_text(now - since));
    }
    st->reported = std::move(still); // forget what ended
    if (fresh == 0)
      continue;
    auto s = ws.lock();
    if (!s)
      co_return;
    try {
      const auto k = co_await s->add(debug_key("stuck"), 1);
      co_await s->set(debug_key("stuck/" + std::to_string(k)), first);
      CORODIST_LOG_WARN("{} (reported to the job's hang watch)", first);
    } catch (const std::exception& e) {
      CORODIST_LOG_WARN("debug responder of rank {}: cannot report a stuck operation: {}", rank, e.what());
    }
  }
}

} // namespace

namespace {

std::shared_ptr<debug_responder> make_responder(const std::shared_ptr<store>& job_store, int rank, int world_size,
                                                debug_responder_options& opts) {
  if (!job_store)
    throw usage_error("debug_responder::start: no store");
  if (rank < 0 || world_size <= 0 || rank >= world_size)
    throw usage_error(fmt::format("debug_responder::start: rank {} of {} ranks", rank, world_size));
  opts.hang_after = hang_after_from_env(opts.hang_after);
  auto r = std::make_shared<debug_responder>(job_store, rank, world_size, opts);
  set_flight_recorder_label("rank " + std::to_string(rank));
  std::lock_guard lk(current_mutex);
  current_responder = r;
  return r;
}

} // namespace

std::shared_ptr<debug_responder> debug_responder::start(std::shared_ptr<store> job_store, int rank, int world_size,
                                                        debug_responder_options opts) {
  auto r = make_responder(job_store, rank, world_size, opts);
  auto ex = job_store->get_executor();
  asio::co_spawn(ex, listen_and_answer(r->state_, job_store, rank, world_size), asio::detached);
  if (opts.hang_after.count() > 0)
    asio::co_spawn(ex, scan_loop(r->state_, job_store, rank, opts), asio::detached);
  return r;
}

asio::awaitable<std::shared_ptr<debug_responder>> debug_responder::async_start(std::shared_ptr<store> job_store,
                                                                               int rank, int world_size,
                                                                               debug_responder_options opts) {
  auto r = make_responder(job_store, rank, world_size, opts);
  const bool listening = co_await asio::co_spawn(job_store->get_executor(),
                                                 listen(r->state_, job_store, rank, world_size), asio::use_awaitable);
  if (!listening)
    throw store_error("debug_responder: cannot listen on the job's store (see the log)");
  auto ex = job_store->get_executor();
  asio::co_spawn(ex, answer_loop(r->state_, job_store, rank), asio::detached);
  if (opts.hang_after.count() > 0)
    asio::co_spawn(ex, scan_loop(r->state_, job_store, rank, opts), asio::detached);
  co_return r;
}

std::shared_ptr<debug_responder> debug_responder::current() {
  std::lock_guard lk(current_mutex);
  auto r = current_responder.lock();
  if (r && r->state_->stopped)
    return nullptr;
  return r;
}

void debug_responder::stop() {
  std::shared_ptr<watch_stream> stream;
  std::shared_ptr<asio::steady_timer> timer;
  {
    std::lock_guard lk(state_->mutex);
    state_->stopped = true;
    stream = std::move(state_->stream);
    timer = std::move(state_->timer);
  }
  if (stream)
    stream->close();
  if (timer) // on its own executor (a timer is not thread-safe)
    asio::post(timer->get_executor(), [timer] { timer->cancel(); });
}

debug_responder::~debug_responder() { stop(); }

} // namespace corodist::store
