#include "store/kv_state.hpp"

#include <corodist/core/error.hpp>

#include <algorithm>
#include <charconv>

namespace corodist::store::detail {

std::int64_t parse_counter(const std::string& key, const std::string& text) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size())
    throw store_error("add: the value of key '" + key + "' is not an integer");
  return v;
}

std::string timeout_message(const std::vector<std::string>& missing, std::chrono::milliseconds timeout) {
  std::string m = "store: timed out after " + std::to_string(timeout.count()) + " ms waiting for keys: ";
  for (std::size_t i = 0; i < missing.size(); ++i) {
    if (i == 8) {
      m += ", ... (" + std::to_string(missing.size()) + " in all)";
      break;
    }
    m += (i ? ", " : "") + missing[i];
  }
  return m;
}

void check_multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size())
    throw store_error("multi_set: " + std::to_string(keys.size()) + " keys but " + std::to_string(values.size()) +
                      " values");
}

kv_state::~kv_state() {
  for (auto& [id, w] : waiters_)
    if (w.timer)
      w.timer->cancel();
}

void kv_state::set(const std::string& key, std::string value) {
  auto [it, created] = data_.insert_or_assign(key, std::move(value));
  changed(created ? watch_event::kind::created : watch_event::kind::updated, key, it->second);
  if (created)
    key_created(key);
}

const std::string* kv_state::find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

std::int64_t kv_state::add(const std::string& key, std::int64_t delta) {
  std::int64_t v = 0;
  if (auto* cur = find(key))
    v = parse_counter(key, *cur);
  v += delta;
  set(key, std::to_string(v));
  return v;
}

std::string kv_state::compare_set(const std::string& key, const std::string& expected, std::string desired) {
  auto* cur = find(key);
  if (!cur) {
    if (!expected.empty())
      return expected;
    set(key, desired);
    return desired;
  }
  if (*cur != expected)
    return *cur;
  set(key, desired);
  return desired;
}

bool kv_state::erase(const std::string& key) {
  if (data_.erase(key) == 0)
    return false;
  changed(watch_event::kind::deleted, key, {});
  return true;
}

bool kv_state::present(const std::string& key) const {
  if (data_.count(key))
    return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

bool kv_state::contains_all(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return present(k); });
}

void kv_state::queue_push(const std::string& key, std::string value) {
  queues_[key].push_back(std::move(value));
  key_created(key, true); // one waiter: it will pop the value
}

std::optional<std::string> kv_state::queue_pop(const std::string& key, std::size_t& size_before) {
  auto it = queues_.find(key);
  size_before = it == queues_.end() ? 0 : it->second.size();
  if (size_before == 0)
    return std::nullopt;
  auto v = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty())
    queues_.erase(it);
  return v;
}

std::size_t kv_state::queue_len(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : it->second.size();
}

void kv_state::append(const std::string& key, const std::string& value) {
  auto* cur = find(key);
  set(key, cur ? *cur + value : value);
}

std::vector<std::string> kv_state::list(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto& [k, v] : data_)
    if (k.compare(0, prefix.size(), prefix) == 0)
      out.push_back(k);
  std::sort(out.begin(), out.end());
  return out;
}

void kv_state::wait(std::vector<std::string> keys, std::chrono::milliseconds timeout, owner_id owner,
                    wait_done done) {
  std::size_t missing = 0;
  for (auto& k : keys)
    if (!present(k))
      ++missing;
  if (missing == 0) {
    done({});
    return;
  }
  const auto id = next_id_++;
  auto& w = waiters_[id];
  w.keys = std::move(keys);
  w.missing = missing;
  w.owner = owner;
  w.done = std::move(done);
  for (auto& k : w.keys)
    if (!present(k))
      waiting_on_[k].push_back(id);
  ++waits_per_owner_[owner];
  if (timeout.count() > 0) {
    w.timer = std::make_unique<asio::steady_timer>(ex_, timeout);
    w.timer->async_wait([weak = weak_from_this(), id](std::error_code ec) {
      if (ec)
        return;
      if (auto self = weak.lock())
        self->finish(id, true);
    });
  }
}

std::size_t kv_state::pending_waits(owner_id owner) const {
  auto it = waits_per_owner_.find(owner);
  return it == waits_per_owner_.end() ? 0 : it->second;
}

void kv_state::key_created(const std::string& key, bool wake_one) {
  auto it = waiting_on_.find(key);
  if (it == waiting_on_.end())
    return;
  if (wake_one) {
    // Like PyTorch's wakeupOneWaitingClient: release waiters in order until one completes.
    auto& ids = it->second;
    while (!ids.empty()) {
      auto id = ids.front();
      ids.erase(ids.begin());
      auto w = waiters_.find(id);
      if (w != waiters_.end() && --w->second.missing == 0) {
        if (ids.empty())
          waiting_on_.erase(it);
        finish(id, false);
        return;
      }
    }
    waiting_on_.erase(it);
    return;
  }
  auto ids = std::move(it->second);
  waiting_on_.erase(it);
  for (auto id : ids) {
    auto w = waiters_.find(id);
    if (w != waiters_.end() && --w->second.missing == 0)
      finish(id, false);
  }
}

void kv_state::forget(std::uint64_t id, waiter& w) {
  for (auto& k : w.keys) {
    auto it = waiting_on_.find(k);
    if (it == waiting_on_.end())
      continue;
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty())
      waiting_on_.erase(it);
  }
  if (auto it = waits_per_owner_.find(w.owner); it != waits_per_owner_.end() && --it->second == 0)
    waits_per_owner_.erase(it);
  if (w.timer)
    w.timer->cancel();
}

void kv_state::finish(std::uint64_t id, bool timed_out) {
  auto it = waiters_.find(id);
  if (it == waiters_.end())
    return;
  waiter w = std::move(it->second);
  waiters_.erase(it);
  forget(id, w);
  std::vector<std::string> missing;
  if (timed_out)
    for (auto& k : w.keys)
      if (!present(k))
        missing.push_back(k);
  if (timed_out && missing.empty())
    missing.push_back("?"); // cannot happen: all keys present means it finished already
  w.done(std::move(missing));
}

std::uint64_t kv_state::watch(const std::string& key, owner_id owner, watch_fn fn) {
  const auto id = next_id_++;
  watchers_.emplace(id, watcher{key, owner, std::move(fn)});
  watched_[key].push_back(id);
  return id;
}

void kv_state::unwatch(std::uint64_t id) {
  auto it = watchers_.find(id);
  if (it == watchers_.end())
    return;
  auto& ids = watched_[it->second.key];
  ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
  if (ids.empty())
    watched_.erase(it->second.key);
  watchers_.erase(it);
}

void kv_state::drop_owner(owner_id owner) {
  std::vector<std::uint64_t> ids;
  for (auto& [id, w] : waiters_)
    if (w.owner == owner)
      ids.push_back(id);
  for (auto id : ids) {
    auto it = waiters_.find(id);
    waiter w = std::move(it->second);
    waiters_.erase(it);
    forget(id, w);
  }
  ids.clear();
  for (auto& [id, w] : watchers_)
    if (w.owner == owner)
      ids.push_back(id);
  for (auto id : ids)
    unwatch(id);
}

void kv_state::changed(watch_event::kind kind, const std::string& key, const std::string& value) {
  auto it = watched_.find(key);
  if (it == watched_.end())
    return;
  watch_event e{kind, key, value};
  auto ids = it->second; // a callback may unwatch
  for (auto id : ids)
    if (auto w = watchers_.find(id); w != watchers_.end())
      w->second.fn(e);
}

} // namespace corodist::store::detail
