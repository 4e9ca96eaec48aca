#pragma once
// The store engine (private): the one place where the store's semantics and
// limits live. The native server's sessions, the PyTorch sessions, hash_store
// and file_store call an `engine`; file_store replays its file (shared with
// other processes) into one, and computes the records it writes with the
// same `rules`.
//
// An engine holds the data, PyTorch 2.x's queues, the waits (indexed per key
// and per owner, with deadlines) and the watches. Every operation checks its
// input against the engine's limits first: over a limit it throws
// store_error and changes nothing. Loop-affine: call it on its executor only.

#include <corodist/store/errors.hpp>
#include <corodist/core/unique_function.hpp>
#include <corodist/store/watch_event.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace corodist::store::detail {

/// What an engine accepts. The defaults accept everything (hash_store); a
/// store_server sets them from its server_options.
struct engine_limits {
  static constexpr std::size_t unlimited = static_cast<std::size_t>(-1);
  /// Bytes of one key.
  std::size_t max_key_size = unlimited;
  /// Bytes of one value, also of a value that `append` grows.
  std::size_t max_value_size = unlimited;
  /// Keys in one request (check, wait, multi_get, multi_set).
  std::size_t max_keys_per_request = unlimited;
  /// Waits one owner (a connection) may have pending; watches are counted apart, with the same bound.
  std::size_t max_waits_per_owner = unlimited;
  /// Bytes one owner's pending waits may hold (their keys, counted with the engine's index of them).
  std::size_t max_wait_bytes_per_owner = unlimited;
  /// Bytes every pending wait together may hold.
  std::size_t max_wait_bytes = unlimited;
};

/// The store's rules as pure functions: what an operation does to a value and
/// the text of its errors. The engine applies them to its map, file_store to
/// the records it appends to its file, clients to a request before sending it.
namespace rules {

/// "store: timed out after N ms waiting for keys: a, b" (the timeout_error text
/// of every store; at most 8 keys are named).
std::string timeout_message(const std::vector<std::string>& missing, std::chrono::milliseconds timeout);

/// Throws store_error naming max_key_size when `key` is longer.
void check_key(std::string_view key, const engine_limits& limits);

/// Throws store_error naming max_value_size when `value` is longer.
void check_value(std::string_view value, const engine_limits& limits);

/// Throws store_error when a request names more keys than max_keys_per_request.
void check_key_count(std::size_t count, const engine_limits& limits);

/// Throws store_error unless `keys` and `values` have the same length (multi_set).
void check_multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);

/// Parses a decimal int64 (c10d stores counters as text); throws store_error naming `key`.
std::int64_t parse_counter(const std::string& key, const std::string& text);

/// The counter `add` leaves at `key`: `current` (null: missing, counted as 0)
/// plus `delta`. Throws store_error if the value is not an integer or the sum overflows.
std::int64_t added(const std::string& key, const std::string* current, std::int64_t delta);

/// As added(), reading the value as PyTorch's TCPStore master does
/// (std::stoll: leading white space, a sign, and bytes after the digits are
/// ignored), and wrapping a sum past the int64 range as that master does.
/// Throws store_error for a value with no leading integer or one outside int64.
std::int64_t added_like_stoll(const std::string& key, const std::string* current, std::int64_t delta);

/// Whether c10d's compareSet stores `desired`: when `current` equals
/// `expected`, or when the key is missing (null) and `expected` is empty.
bool compare_set_stores(const std::string* current, const std::string& expected);

/// What compareSet answers when it does not store: the current value, or
/// `expected` when the key is missing.
const std::string& compare_set_unchanged(const std::string* current, const std::string& expected);

/// The value `append` leaves at `key`: `current` (null: none) followed by
/// `value`. Throws store_error if it would exceed max_value_size.
std::string appended(const std::string& key, const std::string* current, std::string_view value,
                     const engine_limits& limits);

} // namespace rules

class engine : public std::enable_shared_from_this<engine> {
public:
  /// Who registered a wait or watch (a connection id; 0 = in-process).
  using owner_id = std::uint64_t;
  /// Completion of a wait: gets its keys back, and the missing ones (none: every key exists).
  using wait_done = corodist::unique_function<void(std::vector<std::string>&& keys,
                                                           std::vector<std::string>&& missing)>;
  using watch_fn = std::function<void(const watch_event&)>;

  explicit engine(asio::any_io_executor ex, engine_limits limits = {}) : ex_(std::move(ex)), limits_(limits) {}
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  const engine_limits& limits() const noexcept { return limits_; }

  /// The value of `key`, or null when it is missing.
  const std::string* get(const std::string& key) const;
  /// The values of `keys`, an empty string for each missing one (PyTorch's MULTI_GET).
  std::vector<std::string> values(const std::vector<std::string>& keys) const;
  /// Whether every key exists (a non-empty queue counts as one).
  bool check(const std::vector<std::string>& keys) const;
  /// Number of keys stored.
  std::size_t size() const noexcept { return data_.size(); }
  /// The keys that start with `prefix`, sorted.
  std::vector<std::string> list(const std::string& prefix) const;

  void set(std::string key, std::string value);
  /// As `set`, and `key` is owned by `owner` (a connection) from now on:
  /// `drop_owner(owner)` deletes it unless a later write (set, set_owned of
  /// another owner, add, append, compare_set that stores, delete) took the
  /// ownership away. `owner` 0 (in-process) owns nothing: a plain set.
  void set_owned(std::string key, std::string value, owner_id owner);
  /// The owner of `key`, or 0 when it has none (or is missing).
  owner_id owner_of(const std::string& key) const;
  /// How add reads the stored counter.
  enum class counter_text {
    strict,    ///< rules::added: a decimal integer and nothing else; no overflow
    like_stoll ///< rules::added_like_stoll: as PyTorch's master
  };
  /// See rules::added (or rules::added_like_stoll).
  std::int64_t add(const std::string& key, std::int64_t delta, counter_text text = counter_text::strict);
  /// c10d's compareSet (see rules::compare_set_stores); returns its answer.
  /// A key it creates completes the waits on it unless `wake_waiters` is
  /// false (PyTorch's master wakes none; they complete at the key's next
  /// set or add).
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired,
                          bool wake_waiters = true);
  /// Deletes `key`; returns whether it existed.
  bool erase(const std::string& key);
  /// See rules::appended.
  void append(const std::string& key, std::string_view value);
  /// Sets every `keys[i]` to `values[i]`, after checking all of them.
  void multi_set(std::vector<std::string> keys, std::vector<std::string> values);

  /// Queues (PyTorch 2.x QUEUE_PUSH/POP/LEN): a non-empty queue counts as an
  /// existing key for wait and check; a push completes at most one wait on it.
  void queue_push(const std::string& key, std::string value);
  /// Pops the front of `key`'s queue if any; `size_before` receives the length before.
  std::optional<std::string> queue_pop(const std::string& key, std::size_t& size_before);
  std::size_t queue_len(const std::string& key) const;

  /// Calls `done(keys, {})` once every key exists (at once if they do), or
  /// `done(keys, missing)` when `timeout` passes (zero: never). Throws
  /// store_error, registering nothing, if the wait would pass a limit.
  void wait(std::vector<std::string> keys, std::chrono::milliseconds timeout, owner_id owner, wait_done done);
  /// Throws store_error when wait(keys, ..., owner) would be refused for a
  /// limit (key count, key size, the bytes its keys would hold); registers
  /// nothing. Lets a decoder refuse a wait while the keys are still views
  /// into the request, before it copies them.
  void admit_wait(std::span<const std::string_view> keys, owner_id owner) const;
  /// Waits of `owner` still pending.
  std::size_t pending_waits(owner_id owner) const;
  /// Waits pending, of every owner.
  std::size_t pending_waits() const noexcept { return waiters_.size(); }
  /// Bytes held by the pending waits of `owner` (as counted against the limits).
  std::size_t wait_bytes(owner_id owner) const;
  /// Bytes held by every pending wait.
  std::size_t wait_bytes() const noexcept { return wait_bytes_; }

  /// Calls `fn` for every later change of `key`; returns the watch id. Throws
  /// store_error over max_key_size or when `owner` has max_waits_per_owner watches.
  std::uint64_t watch(const std::string& key, owner_id owner, watch_fn fn);
  void unwatch(std::uint64_t id);
  /// Watches registered, of every owner.
  std::size_t watch_count() const noexcept { return watchers_.size(); }
  /// Drops every wait and watch of `owner` without calling them, then deletes
  /// the keys it still owns (their watchers see `deleted`). Costs what the
  /// owner holds, not what the engine holds.
  void drop_owner(owner_id owner);

  /// Calls `fn` (on the executor) each time the pending waits change: one is
  /// registered, completes, times out or is dropped. One observer; null: none.
  void observe_waits(std::function<void()> fn) { waits_changed_ = std::move(fn); }

private:
  using clock = std::chrono::steady_clock;
  static constexpr std::size_t no_deadline = static_cast<std::size_t>(-1);
  struct waiter {
    std::vector<std::string> keys;
    std::size_t missing = 0;
    std::size_t bytes = 0;
    owner_id owner = 0;
    wait_done done;
    std::size_t deadline_slot = no_deadline; // its place in deadlines_ (none: no timeout)
  };
  // One entry of the deadline index: a binary min-heap on (at, id), each
  // waiter knowing its slot, so that a wait that completes or is dropped
  // leaves in O(log waits) and the earliest is at the front.
  struct deadline {
    clock::time_point at;
    std::uint64_t id = 0;
    waiter* w = nullptr; // (the waiters' map is node-based: stable)
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

  const std::string* find(const std::string& key) const;
  void store(const std::string& key, std::string value, bool wake_waiters = true);
  bool present(const std::string& key) const;
  /// The bytes a wait on `keys` would hold (0 when every key exists, as it
  /// then completes at once); throws store_error if that passes a limit of
  /// `owner` or of the server.
  template <typename Keys>
  std::size_t wait_cost(const Keys& keys, owner_id owner) const;
  void drop_waits_and_watches(owner_id owner);
  /// Takes `key`'s ownership away from its owner, if it has one.
  void disown(const std::string& key);
  void changed(watch_event::kind kind, const std::string& key, const std::string& value);
  void key_created(const std::string& key, bool wake_one = false);
  /// Completes waiter `id`; `notify`: tell the observer (a batch tells it once, after).
  void finish(std::uint64_t id, bool timed_out, bool notify = true);
  /// Unlinks waiter `id` from the key index and its owner (O(keys · log waiters)).
  void forget(std::uint64_t id, waiter& w);
  void release_owner_entry(owner_id owner);
  // The deadline index (deadlines_) and its one timer.
  bool deadline_before(std::size_t a, std::size_t b) const noexcept;
  void deadline_place(std::size_t slot) noexcept; // deadlines_[slot] moved: tell its waiter
  void deadline_up(std::size_t slot) noexcept;
  void deadline_down(std::size_t slot) noexcept;
  void deadline_insert(std::uint64_t id, waiter& w, clock::time_point at);
  void deadline_erase(waiter& w) noexcept;
  /// Arms the timer for the earliest deadline if it is not armed for it or
  /// earlier; with no deadline left, lets the timer go.
  void arm_deadline_timer();
  /// Times out every wait whose deadline has passed (the timer fired).
  void expire_deadlines();
  void waits_changed() const {
    if (waits_changed_)
      waits_changed_();
  }

  asio::any_io_executor ex_;
  engine_limits limits_;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::uint64_t, waiter> waiters_;
  std::vector<deadline> deadlines_; // min-heap of the waits with a timeout
  // The one timer of every wait's deadline, made while a deadline is pending
  // (a store may outlive its event loop: no I/O object held when idle).
  std::optional<asio::steady_timer> deadline_timer_;
  clock::time_point armed_at_ = clock::time_point::max(); // max: not armed
  std::unordered_map<std::string, std::set<std::uint64_t>> waiting_on_; // key -> waiter ids, oldest first
  std::unordered_map<owner_id, owned> owners_;
  std::size_t wait_bytes_ = 0;
  std::unordered_map<std::uint64_t, watcher> watchers_;
  std::unordered_map<std::string, std::unordered_set<std::uint64_t>> watched_; // key -> watch ids
  std::uint64_t next_id_ = 1;
  std::function<void()> waits_changed_;
  std::unordered_map<std::string, owner_id> key_owner_;                     // owned key -> its owner
  std::unordered_map<owner_id, std::unordered_set<std::string>> owned_keys_; // owner -> the keys it owns
};

} // namespace corodist::store::detail
