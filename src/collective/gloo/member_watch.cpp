#include "collective/gloo/member_watch.hpp"

#include <corodist/core/future.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/hash_store.hpp>
#include <corodist/store/prefix_store.hpp>

#include "core/log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>

#include <algorithm>
#include <thread>

namespace corodist::collective::detail {

member_watch::member_watch(std::shared_ptr<store::store> group_keys, std::string label, int rank, int size)
    : keys_(std::move(group_keys)), label_(std::move(label)), rank_(rank), size_(size) {}

std::string member_watch::key(int rank) { return "member/" + std::to_string(rank); }

asio::awaitable<bool> member_watch::publish(std::shared_ptr<store::store> base, store::store& group_keys, int rank) {
  // Past prefix_stores to the store that holds the keys: an in-process
  // hash_store's owned keys live as long as it does (its ranks are threads).
  auto s = base;
  while (auto p = std::dynamic_pointer_cast<store::prefix_store>(s))
    s = p->underlying();
  if (std::dynamic_pointer_cast<store::hash_store>(s))
    co_return false;
  try {
    co_await group_keys.set_owned(key(rank), "1");
  } catch (const usage_error&) {
    co_return false; // a store without owned keys (file_store, torch_store)
  }
  co_return true;
}

asio::awaitable<void> member_watch::start(lost_fn report) {
  {
    std::lock_guard lk(mutex_);
    report_ = std::move(report);
  }
  // Every peer's watch at once (one round trip, not one per peer).
  struct pending {
    std::mutex m;
    int left = 0;
    std::exception_ptr error;
    std::vector<std::shared_ptr<store::watch_stream>> streams;
    promise<void> all;
  };
  auto p = std::make_shared<pending>();
  p->left = size_ - 1;
  p->streams.resize(static_cast<std::size_t>(size_));
  auto all = p->all.get_future();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_)
      continue;
    asio::co_spawn(keys_->get_executor(), keys_->watch_key(key(r)),
                   [p, r](std::exception_ptr e, store::watch_stream s) {
                     std::unique_lock lk(p->m);
                     if (e && !p->error)
                       p->error = e;
                     else if (!e)
                       p->streams[static_cast<std::size_t>(r)] = std::make_shared<store::watch_stream>(std::move(s));
                     if (--p->left == 0) {
                       lk.unlock();
                       p->all.set_value();
                     }
                   });
  }
  co_await all.async_get();
  std::exception_ptr error;
  std::vector<std::shared_ptr<store::watch_stream>> got;
  {
    std::lock_guard lk(p->m);
    error = p->error;
    got = p->streams;
  }
  if (error)
    std::rethrow_exception(error);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_)
      continue;
    auto s = got[static_cast<std::size_t>(r)];
    streams_.push_back(s);
    asio::co_spawn(keys_->get_executor(), follow(r, s), asio::detached);
  }
  // A rank lost before its key was watched: one check of every key, then,
  // if one is gone, which.
  std::vector<std::string> every;
  for (int r = 0; r < size_; ++r)
    if (r != rank_)
      every.push_back(key(r));
  if (co_await keys_->check(std::move(every)))
    co_return;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_)
      continue;
    std::vector<std::string> k{key(r)};
    if (!co_await keys_->check(std::move(k)))
      this->report(r, "its member key vanished (connection to the store lost)");
  }
}

asio::awaitable<void> member_watch::follow(int peer, std::shared_ptr<store::watch_stream> s) {
  const auto self = shared_from_this();
  for (;;) {
    store::watch_event e;
    try {
      e = co_await s->next(corodist::timeout::never());
    } catch (const timeout_error&) {
      continue;
    } catch (const usage_error&) {
      co_return; // closed: the group is going away
    } catch (const std::exception& ex) {
      bool gone;
      {
        std::lock_guard lk(mutex_);
        gone = detached_;
      }
      // (Debug: at the end of a job the store's host may go first, ending
      // every watch; a lost rank is then still found by its connections.)
      if (!gone)
        CORODIST_LOG_DEBUG("{} (rank {}): watching rank {}'s member key ended: {}; a lost rank is now found only by "
                           "its connections",
                           label_, rank_, peer, ex.what());
      co_return;
    }
    if (e.type == store::watch_event::kind::deleted) {
      report(peer, "its member key vanished (connection to the store lost)");
      co_return;
    }
  }
}

void member_watch::report(int lost, const std::string& why) {
  std::lock_guard lk(mutex_);
  if (!detached_ && report_)
    report_(lost, why);
}

std::optional<int> member_watch::missing(int prefer, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    std::vector<std::string> present;
    try {
      present = run_blocking(keys_->get_executor(), keys_->list_keys("member/"), "gloo_group: the member keys");
    } catch (const std::exception& e) {
      CORODIST_LOG_WARN("{} (rank {}): cannot read the member keys: {}", label_, rank_, e.what());
      return std::nullopt;
    }
    auto has = [&](int r) { return std::find(present.begin(), present.end(), key(r)) != present.end(); };
    if (prefer >= 0 && prefer != rank_ && !has(prefer))
      return prefer;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && !has(r))
        return r;
    if (std::chrono::steady_clock::now() >= until)
      return std::nullopt;
    std::this_thread::sleep_for(poll_interval);
  }
}

void member_watch::detach() {
  {
    std::lock_guard lk(mutex_);
    if (detached_)
      return;
    detached_ = true;
    report_ = nullptr;
  }
  try {
    asio::post(keys_->get_executor(), [self = shared_from_this()] {
      for (auto& s : self->streams_)
        s->close();
      self->streams_.clear();
    });
  } catch (...) {
  }
}

} // namespace corodist::collective::detail
