#include "store/server/engine.hpp"
#include "store/server/heap_trim.hpp"

#include <corodist/core/error.hpp>
#include <corodist/store/errors.hpp>

#include <algorithm>
#include <charconv>


namespace corodist::store::detail {

namespace rules {

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

void check_key(std::string_view key, const engine_limits& limits) {
  if (key.size() > limits.max_key_size)
    throw store_error("key of " + std::to_string(key.size()) + " bytes exceeds max_key_size " +
                      std::to_string(limits.max_key_size));
}

void check_value(std::string_view value, const engine_limits& limits) {
  if (value.size() > limits.max_value_size)
    throw store_error("value of " + std::to_string(value.size()) + " bytes exceeds max_value_size " +
                      std::to_string(limits.max_value_size));
}

void check_key_count(std::size_t count, const engine_limits& limits) {
  if (count > limits.max_keys_per_request)
    throw store_error("too many keys in one request: " + std::to_string(count) + " (limit " +
                      std::to_string(limits.max_keys_per_request) + ")");
}

void check_multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size())
    throw store_error("multi_set: " + std::to_string(keys.size()) + " keys but " + std::to_string(values.size()) +
                      " values");
}

std::int64_t parse_counter(const std::string& key, const std::string& text) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size())
    throw store_error("add: the value of key '" + key + "' is not an integer");
  return v;
}

std::int64_t added(const std::string& key, const std::string* current, std::int64_t delta) {
  const std::int64_t v = current ? parse_counter(key, *current) : 0;
  std::int64_t sum = 0;
  if (__builtin_add_overflow(v, delta, &sum))
    throw store_error("add: " + std::to_string(v) + " + " + std::to_string(delta) + " overflows the value of key '" +
                      key + "'");
  return sum;
}

std::int64_t added_like_stoll(const std::string& key, const std::string* current, std::int64_t delta) {
  std::int64_t v = 0;
  if (current) {
    try {
      v = std::stoll(*current);
    } catch (const std::logic_error&) { // invalid_argument, out_of_range
      throw store_error("add: the value of key '" + key + "' does not start with an integer in the int64 range");
    }
  }
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(v) + static_cast<std::uint64_t>(delta));
}

bool compare_set_stores(const std::string* current, const std::string& expected) {
  return current ? *current == expected : expected.empty();
}

const std::string& compare_set_unchanged(const std::string* current, const std::string& expected) {
  return current ? *current : expected;
}

std::string appended(const std::string& key, const std::string* current, std::string_view value,
                     const engine_limits& limits) {
  const std::size_t before = current ? current->size() : 0;
  if (value.size() > limits.max_value_size || before > limits.max_value_size - value.size())
    throw store_error("append would make the value of '" + key + "' exceed max_value_size " +
                      std::to_string(limits.max_value_size));
  std::string out;
  out.reserve(before + value.size());
  if (current)
    out = *current;
  out.append(value);
  return out;
}

} // namespace rules

engine::~engine() = default; // (the deadline timer goes with it; its handler holds a weak reference)

const std::string* engine::find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

void engine::store(const std::string& key, std::string value, bool wake_waiters) {
  disown(key);
  auto [it, created] = data_.insert_or_assign(key, std::move(value));
  changed(created ? watch_event::kind::created : watch_event::kind::updated, key, it->second);
  // Waits on a key that exists are left only by a compare_set that created it
  // without waking them: the next write wakes them.
  if (wake_waiters && (created || !waiting_on_.empty()))
    key_created(key);
}

const std::string* engine::get(const std::string& key) const {
  rules::check_key(key, limits_);
  return find(key);
}

std::vector<std::string> engine::values(const std::vector<std::string>& keys) const {
  rules::check_key_count(keys.size(), limits_);
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (auto& k : keys) {
    rules::check_key(k, limits_);
    auto* v = find(k);
    out.push_back(v ? *v : std::string());
  }
  return out;
}

bool engine::check(const std::vector<std::string>& keys) const {
  rules::check_key_count(keys.size(), limits_);
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return present(k); });
}

std::vector<std::string> engine::list(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto& [k, v] : data_)
    if (k.compare(0, prefix.size(), prefix) == 0)
      out.push_back(k);
  std::sort(out.begin(), out.end());
  return out;
}

void engine::set(std::string key, std::string value) {
  rules::check_key(key, limits_);
  rules::check_value(value, limits_);
  store(key, std::move(value));
}

void engine::set_owned(std::string key, std::string value, owner_id owner) {
  rules::check_key(key, limits_);
  rules::check_value(value, limits_);
  store(key, std::move(value)); // (takes the ownership from a previous owner)
  if (owner == 0)
    return;
  key_owner_[key] = owner;
  owned_keys_[owner].insert(std::move(key));
}

engine::owner_id engine::owner_of(const std::string& key) const {
  auto it = key_owner_.find(key);
  return it == key_owner_.end() ? 0 : it->second;
}

void engine::disown(const std::string& key) {
  if (key_owner_.empty())
    return;
  auto it = key_owner_.find(key);
  if (it == key_owner_.end())
    return;
  if (auto o = owned_keys_.find(it->second); o != owned_keys_.end()) {
    o->second.erase(key);
    if (o->second.empty())
      owned_keys_.erase(o);
  }
  key_owner_.erase(it);
}

std::int64_t engine::add(const std::string& key, std::int64_t delta, counter_text text) {
  rules::check_key(key, limits_);
  const auto v = text == counter_text::strict ? rules::added(key, find(key), delta)
                                              : rules::added_like_stoll(key, find(key), delta);
  store(key, std::to_string(v));
  return v;
}

std::string engine::compare_set(const std::string& key, const std::string& expected, std::string desired,
                                bool wake_waiters) {
  rules::check_key(key, limits_);
  rules::check_value(desired, limits_);
  auto* cur = find(key);
  if (!rules::compare_set_stores(cur, expected))
    return rules::compare_set_unchanged(cur, expected);
  store(key, desired, wake_waiters);
  return desired;
}

bool engine::erase(const std::string& key) {
  rules::check_key(key, limits_);
  if (data_.erase(key) == 0)
    return false;
  disown(key);
  changed(watch_event::kind::deleted, key, {});
  return true;
}

void engine::append(const std::string& key, std::string_view value) {
  rules::check_key(key, limits_);
  store(key, rules::appended(key, find(key), value, limits_));
}

void engine::multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
  rules::check_multi_set(keys, values);
  rules::check_key_count(keys.size(), limits_);
  for (std::size_t i = 0; i < keys.size(); ++i) { // all checked before any is stored
    rules::check_key(keys[i], limits_);
    rules::check_value(values[i], limits_);
  }
  for (std::size_t i = 0; i < keys.size(); ++i)
    store(keys[i], std::move(values[i]));
}

bool engine::present(const std::string& key) const {
  if (data_.count(key))
    return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void engine::queue_push(const std::string& key, std::string value) {
  rules::check_key(key, limits_);
  rules::check_value(value, limits_);
  queues_[key].push_back(std::move(value));
  key_created(key, true); // one waiter: it will pop the value
}

std::optional<std::string> engine::queue_pop(const std::string& key, std::size_t& size_before) {
  rules::check_key(key, limits_);
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

std::size_t engine::queue_len(const std::string& key) const {
  rules::check_key(key, limits_);
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : it->second.size();
}

namespace {
// What a pending wait holds per key beyond the key's bytes: its copy in the
// waiter, its entry in the key index, and the index's set node.
constexpr std::size_t wait_bytes_per_key = 160;
constexpr std::size_t wait_bytes_per_waiter = 256;
} // namespace

template <typename Keys>
std::size_t engine::wait_cost(const Keys& keys, owner_id owner) const {
  rules::check_key_count(keys.size(), limits_);
  for (auto& k : keys)
    rules::check_key(k, limits_);
  std::size_t missing = 0;
  std::size_t bytes = wait_bytes_per_waiter;
  std::string probe; // (a view's key is looked up through one reused copy)
  for (auto& k : keys) {
    bool here = false;
    if constexpr (std::is_same_v<std::decay_t<decltype(k)>, std::string>)
      here = present(k);
    else
      here = present(probe.assign(k));
    if (!here) {
      ++missing;
      bytes += 2 * k.size() + wait_bytes_per_key; // the waiter's copy and the index's
    } else {
      bytes += k.size() + sizeof(std::string);
    }
  }
  if (missing == 0)
    return 0;
  auto oit = owners_.find(owner);
  const std::size_t owner_waits = oit == owners_.end() ? 0 : oit->second.waits.size();
  const std::size_t owner_bytes = oit == owners_.end() ? 0 : oit->second.wait_bytes;
  if (owner_waits >= limits_.max_waits_per_owner)
    throw store_error("too many pending waits on this connection (limit " +
                      std::to_string(limits_.max_waits_per_owner) + ")");
  if (bytes > limits_.max_wait_bytes_per_owner || owner_bytes > limits_.max_wait_bytes_per_owner - bytes)
    throw store_error("pending waits on this connection would hold " + std::to_string(owner_bytes + bytes) +
                      " bytes of keys, over the limit of " + std::to_string(limits_.max_wait_bytes_per_owner));
  if (bytes > limits_.max_wait_bytes || wait_bytes_ > limits_.max_wait_bytes - bytes)
    throw store_error("the server's pending waits would hold " + std::to_string(wait_bytes_ + bytes) +
                      " bytes of keys, over its limit of " + std::to_string(limits_.max_wait_bytes));
  return bytes;
}

void engine::admit_wait(std::span<const std::string_view> keys, owner_id owner) const { (void)wait_cost(keys, owner); }

void engine::wait(std::vector<std::string> keys, std::chrono::milliseconds timeout, owner_id owner,
                  wait_done done) {
  const std::size_t bytes = wait_cost(keys, owner);
  // A deadline from the wire may be anything: past a year it means "never" (and
  // would overflow the clock's arithmetic).
  if (timeout > std::chrono::hours(24 * 365))
    timeout = std::chrono::milliseconds(0);
  if (bytes == 0) {
    done(std::move(keys), {});
    return;
  }
  const auto id = next_id_++;
  auto& w = waiters_[id];
  w.keys = std::move(keys);
  w.bytes = bytes;
  w.owner = owner;
  w.done = std::move(done);
  for (auto& k : w.keys) // a key named twice is awaited once
    if (!present(k) && waiting_on_[k].insert(id).second)
      ++w.missing;
  auto& o = owners_[owner];
  o.waits.insert(id);
  o.wait_bytes += bytes;
  wait_bytes_ += bytes;
  if (timeout.count() > 0) {
    deadline_insert(id, w, clock::now() + timeout);
    arm_deadline_timer();
  }
  waits_changed();
}

std::size_t engine::pending_waits(owner_id owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.waits.size();
}

std::size_t engine::wait_bytes(owner_id owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.wait_bytes;
}

void engine::key_created(const std::string& key, bool wake_one) {
  auto it = waiting_on_.find(key);
  if (it == waiting_on_.end())
    return;
  if (wake_one) {
    // Like PyTorch's wakeupOneWaitingClient: release waiters in order until one completes.
    auto& ids = it->second;
    while (!ids.empty()) {
      auto id = *ids.begin();
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
  bool any = false;
  for (auto id : ids) { // each in O(its keys + log waits): a barrier's N waiters in O(N log N)
    auto w = waiters_.find(id);
    if (w != waiters_.end() && --w->second.missing == 0) {
      finish(id, false, false);
      any = true;
    }
  }
  if (any)
    waits_changed(); // once for the batch
}

void engine::forget(std::uint64_t id, waiter& w) {
  for (auto& k : w.keys) {
    auto it = waiting_on_.find(k);
    if (it == waiting_on_.end())
      continue;
    it->second.erase(id);
    if (it->second.empty())
      waiting_on_.erase(it);
  }
  wait_bytes_ -= w.bytes;
  if (auto it = owners_.find(w.owner); it != owners_.end()) {
    it->second.waits.erase(id);
    it->second.wait_bytes -= w.bytes;
    release_owner_entry(w.owner);
  }
  if (w.deadline_slot != no_deadline) {
    deadline_erase(w);
    if (deadlines_.empty())
      arm_deadline_timer(); // lets the timer go: nothing left to time out
  }
}

void engine::release_owner_entry(owner_id owner) {
  auto it = owners_.find(owner);
  if (it != owners_.end() && it->second.waits.empty() && it->second.watches.empty())
    owners_.erase(it);
}

void engine::finish(std::uint64_t id, bool timed_out, bool notify) {
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
  w.done(std::move(w.keys), std::move(missing));
  if (notify)
    waits_changed();
}

bool engine::deadline_before(std::size_t a, std::size_t b) const noexcept {
  const auto& x = deadlines_[a];
  const auto& y = deadlines_[b];
  return x.at < y.at || (x.at == y.at && x.id < y.id); // equal deadlines: in the order the waits came
}

void engine::deadline_place(std::size_t slot) noexcept {
  deadlines_[slot].w->deadline_slot = slot;
}

void engine::deadline_up(std::size_t slot) noexcept {
  while (slot > 0) {
    const auto parent = (slot - 1) / 2;
    if (!deadline_before(slot, parent))
      break;
    std::swap(deadlines_[slot], deadlines_[parent]);
    deadline_place(slot);
    slot = parent;
  }
  deadline_place(slot);
}

void engine::deadline_down(std::size_t slot) noexcept {
  const auto n = deadlines_.size();
  for (;;) {
    auto least = slot;
    const auto l = 2 * slot + 1;
    const auto r = l + 1;
    if (l < n && deadline_before(l, least))
      least = l;
    if (r < n && deadline_before(r, least))
      least = r;
    if (least == slot)
      break;
    std::swap(deadlines_[slot], deadlines_[least]);
    deadline_place(slot);
    slot = least;
  }
  deadline_place(slot);
}

void engine::deadline_insert(std::uint64_t id, waiter& w, clock::time_point at) {
  deadlines_.push_back({at, id, &w});
  deadline_up(deadlines_.size() - 1);
}

void engine::deadline_erase(waiter& w) noexcept {
  const auto slot = w.deadline_slot;
  w.deadline_slot = no_deadline;
  const auto last = deadlines_.size() - 1;
  if (slot != last) {
    deadlines_[slot] = deadlines_[last]; // (never reads the erased entry's waiter: it may be moved from)
    deadlines_.pop_back();
    if (slot > 0 && deadline_before(slot, (slot - 1) / 2))
      deadline_up(slot);
    else
      deadline_down(slot);
  } else {
    deadlines_.pop_back();
  }
  if (deadlines_.empty() && deadlines_.capacity() > 4096)
    deadlines_.shrink_to_fit(); // a departed barrier's index goes back too (a small one is kept for the next waits)
}

void engine::arm_deadline_timer() {
  if (deadlines_.empty()) {
    // Nothing to time out: no pending wake-up keeps the loop running (an
    // embedded loop's run() returns), and no I/O object outlives the waits.
    deadline_timer_.reset();
    armed_at_ = clock::time_point::max();
    return;
  }
  const auto at = deadlines_.front().at;
  if (at >= armed_at_)
    return; // it fires for this one or earlier
  if (!deadline_timer_)
    deadline_timer_.emplace(ex_);
  deadline_timer_->expires_at(at);
  armed_at_ = at;
  deadline_timer_->async_wait([weak = weak_from_this()](std::error_code ec) {
    if (ec)
      return; // re-armed or let go
    if (auto self = weak.lock())
      self->expire_deadlines();
  });
}

void engine::expire_deadlines() {
  armed_at_ = clock::time_point::max();
  const auto now = clock::now();
  bool any = false;
  // In deadline order; a completion may register or wake other waits (the
  // index is read again each time).
  while (!deadlines_.empty() && deadlines_.front().at <= now) {
    finish(deadlines_.front().id, true, false); // (leaves the index)
    any = true;
  }
  arm_deadline_timer();
  if (any)
    waits_changed();
}

std::uint64_t engine::watch(const std::string& key, owner_id owner, watch_fn fn) {
  rules::check_key(key, limits_);
  if (auto o = owners_.find(owner); o != owners_.end() && o->second.watches.size() >= limits_.max_waits_per_owner)
    throw store_error("too many watches on this connection (limit " + std::to_string(limits_.max_waits_per_owner) +
                      ")");
  const auto id = next_id_++;
  watchers_.emplace(id, watcher{key, owner, std::move(fn)});
  watched_[key].insert(id);
  owners_[owner].watches.insert(id);
  return id;
}

void engine::unwatch(std::uint64_t id) {
  auto it = watchers_.find(id);
  if (it == watchers_.end())
    return;
  if (auto k = watched_.find(it->second.key); k != watched_.end()) {
    k->second.erase(id);
    if (k->second.empty())
      watched_.erase(k);
  }
  const auto owner = it->second.owner;
  watchers_.erase(it);
  if (auto o = owners_.find(owner); o != owners_.end()) {
    o->second.watches.erase(id);
    release_owner_entry(owner);
  }
}

void engine::drop_owner(owner_id owner) {
  drop_waits_and_watches(owner);
  auto o = owned_keys_.find(owner);
  if (o == owned_keys_.end())
    return;
  auto keys = std::move(o->second);
  owned_keys_.erase(o);
  for (auto& k : keys) { // deleted as by delete_key: watchers see it, waiters wait on
    key_owner_.erase(k);
    if (data_.erase(k) != 0)
      changed(watch_event::kind::deleted, k, {});
  }
}

void engine::drop_waits_and_watches(owner_id owner) {
  auto it = owners_.find(owner);
  if (it == owners_.end())
    return;
  auto mine = std::move(it->second);
  owners_.erase(it);
  std::size_t freed = 0;
  for (auto id : mine.waits) {
    auto w = waiters_.find(id);
    if (w == waiters_.end())
      continue;
    waiter gone = std::move(w->second);
    waiters_.erase(w);
    freed += gone.bytes;
    forget(id, gone);
  }
  for (auto id : mine.watches)
    unwatch(id);
  trim_heap_after(freed); // a departed client's large waits go back to the system, not just to malloc
  if (!mine.waits.empty())
    waits_changed();
}

void engine::changed(watch_event::kind kind, const std::string& key, const std::string& value) {
  auto it = watched_.find(key);
  if (it == watched_.end())
    return;
  watch_event e{kind, key, value};
  std::vector<std::uint64_t> ids(it->second.begin(), it->second.end()); // a callback may unwatch
  std::sort(ids.begin(), ids.end()); // in the order the watches were made
  for (auto id : ids)
    if (auto w = watchers_.find(id); w != watchers_.end())
      w->second.fn(e);
}

} // namespace corodist::store::detail
