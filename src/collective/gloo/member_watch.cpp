#include "collective/gloo/member_watch.hpp"

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
  for (int r = 0; r < size_; ++r) {
    if (r == rank_)
      continue;
    auto s = std::make_shared<store::watch_stream>(co_await keys_->watch_key(key(r)));
    streams_.push_back(s);
    asio::co_spawn(keys_->get_executor(), follow(r, s), asio::detached);
  }
  // A rank lost before its key was watched.
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
