#pragma once
// The key-value state machine shared by hash_store and store_server: data,
// waiters per key (with deadlines) and watchers per key. Loop-affine.

#include <corodist/core/detail/unique_function.hpp>
#include <corodist/store/watch_event.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <functional>
#include <memory>
#include <string>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace corodist::store::detail {

/// Bounds on what pending waits may hold. A wait over a bound is refused with
/// store_error (the request fails; nothing else is affected).
struct wait_limits {
  static constexpr std::size_t unlimited = static_cast<std::size_t>(-1);
  /// Waits one owner (a connection) may have pending.
  std::size_t max_waits_per_owner = unlimited;
  /// Bytes one owner's pending waits may hold (keys, counted with their index).
  std::size_t max_bytes_per_owner = unlimited;
  /// Bytes every pending wait together may hold.
  std::size_t max_bytes = unlimited;
};

class kv_state : public std::enable_shared_from_this<kv_state> {
public:
  /// Who registered a wait or watch (a connection id; 0 = in-process).
  using owner_id = std::uint64_t;
  /// Completion of a wait: gets its keys back, and the missing ones (none: every key exists).
  using wait_done = corodist::detail::unique_function<void(std::vector<std::string>&& keys,
                                                           std::vector<std::string>&& missing)>;
  using watch_fn = std::function<void(const watch_event&)>;

  explicit kv_state(asio::any_io_executor ex, wait_limits limits = {}) : ex_(std::move(ex)), limits_(limits) {}
  ~kv_state();

  void set(const std::string& key, std::string value);
  const std::string* find(const std::string& key) const;
  /// Throws store_error if the current value is not a decimal integer.
  std::int64_t add(const std::string& key, std::int64_t delta);
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired);
  bool erase(const std::string& key);
  bool contains_all(const std::vector<std::string>& keys) const;
  std::size_t size() const noexcept { return data_.size(); }
  void append(const std::string& key, const std::string& value);
  std::vector<std::string> list(const std::string& prefix) const;

  /// Queues (PyTorch 2.x QUEUE_PUSH/POP/LEN): a non-empty queue counts as an
  /// existing key for wait and check; a push completes at most one wait on it.
  void queue_push(const std::string& key, std::string value);
  /// Pops the front of `key`'s queue if any; `size_before` receives the length before.
  std::optional<std::string> queue_pop(const std::string& key, std::size_t& size_before);
  std::size_t queue_len(const std::string& key) const;

  /// Calls `done(keys, {})` once every key exists (at once if they do), or
  /// `done(keys, missing)` when `timeout` passes (zero: never). Throws
  /// store_error, registering nothing, if the wait would pass a wait_limits bound.
  void wait(std::vector<std::string> keys, std::chrono::milliseconds timeout, owner_id owner, wait_done done);
  /// Waits of `owner` still pending.
  std::size_t pending_waits(owner_id owner) const;
  /// Bytes held by the pending waits of `owner` (as counted against wait_limits).
  std::size_t wait_bytes(owner_id owner) const;
  /// Bytes held by every pending wait.
  std::size_t wait_bytes() const noexcept { return wait_bytes_; }

  /// Calls `fn` for every later change of `key`; returns the watch id.
  std::uint64_t watch(const std::string& key, owner_id owner, watch_fn fn);
  void unwatch(std::uint64_t id);
  /// Drops every wait and watch of `owner` without calling them. Costs what
  /// the owner holds, not what the store holds.
  void drop_owner(owner_id owner);

private:
  struct waiter {
    std::vector<std::string> keys;
    std::size_t missing = 0;
    std::size_t bytes = 0;
    owner_id owner = 0;
    wait_done done;
    std::unique_ptr<asio::steady_timer> timer;
  };
  struct watcher {
    std::string key;
    owner_id owner = 0;
    watch_fn fn;
  };
  // What one owner holds: its waits and watches, and the bytes of its waits.
  struct owned {
    std::unordered_set<std::uint64_t> waits;
    std::unordered_set<std::uint64_t> watches;
    std::size_t wait_bytes = 0;
  };

  bool present(const std::string& key) const;
  void changed(watch_event::kind kind, const std::string& key, const std::string& value);
  void key_created(const std::string& key, bool wake_one = false);
  void finish(std::uint64_t id, bool timed_out);
  /// Unlinks waiter `id` from the key index and its owner (O(keys · log waiters)).
  void forget(std::uint64_t id, waiter& w);
  void release_owner_entry(owner_id owner);

  asio::any_io_executor ex_;
  wait_limits limits_;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::uint64_t, waiter> waiters_;
  std::unordered_map<std::string, std::set<std::uint64_t>> waiting_on_; // key -> waiter ids, oldest first
  std::unordered_map<owner_id, owned> owners_;
  std::size_t wait_bytes_ = 0;
  std::unordered_map<std::uint64_t, watcher> watchers_;
  std::unordered_map<std::string, std::unordered_set<std::uint64_t>> watched_; // key -> watch ids
  std::uint64_t next_id_ = 1;
};

/// "timed out after N ms waiting for keys: a, b" (the timeout_error text of every store).
std::string timeout_message(const std::vector<std::string>& missing, std::chrono::milliseconds timeout);

/// Throws store_error unless `keys` and `values` have the same length (multi_set).
void check_multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);

/// Parses a decimal int64 (c10d stores counters as text); throws store_error.
std::int64_t parse_counter(const std::string& key, const std::string& text);

} // namespace corodist::store::detail
