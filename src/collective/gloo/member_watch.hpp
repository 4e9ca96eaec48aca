#pragma once
// The member keys of a gloo_group: each rank publishes "member/<rank>" under
// the group's prefix as an owned key (store::set_owned), which the store
// server deletes when that rank's connection to it closes (its process died,
// or the server's heartbeat deadline passed: a hung or partitioned rank).
// Each rank watches its peers' member keys: a `deleted` event reports the
// rank lost. A communication thread whose Gloo call failed asks which member
// keys are gone, to name the rank that was lost rather than the survivor
// that aborted first.

#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace corodist::collective::detail {

class member_watch : public std::enable_shared_from_this<member_watch> {
public:
  /// What a `deleted` event of rank `lost`'s member key calls (on the store's executor).
  using lost_fn = std::function<void(int lost, const std::string& why)>;

  /// `group_keys`: the store under the group's prefix; `label` names the group in log lines.
  member_watch(std::shared_ptr<store::store> group_keys, std::string label, int rank, int size);

  /// The key of `rank`'s membership ("member/<rank>", under the group's prefix).
  static std::string key(int rank);

  /// Publishes this rank's member key as an owned key. Returns false (and
  /// publishes nothing) when the store has no owned keys (`usage_error`), or
  /// is an in-process hash_store, whose ranks are threads.
  static asio::awaitable<bool> publish(std::shared_ptr<store::store> base, store::store& group_keys, int rank);

  /// Watches every peer's member key; once they are watched, a key already
  /// gone reports its rank at once. Run on the store's executor.
  asio::awaitable<void> start(lost_fn report);

  /// Blocks the calling thread (a communication thread, never an event
  /// loop's) for up to `limit`, polling the member keys: the lost rank
  /// (`prefer` first when its key is gone) or nullopt when every key stays.
  std::optional<int> missing(int prefer, std::chrono::milliseconds limit);

  /// No report after this returns; ends the watches (thread-safe).
  void detach();

  /// How often `missing` polls.
  static constexpr std::chrono::milliseconds poll_interval{10};

private:
  asio::awaitable<void> follow(int peer, std::shared_ptr<store::watch_stream> s);
  void report(int lost, const std::string& why);

  const std::shared_ptr<store::store> keys_;
  const std::string label_;
  const int rank_;
  const int size_;
  std::mutex mutex_;
  lost_fn report_;
  bool detached_ = false;
  std::vector<std::shared_ptr<store::watch_stream>> streams_; // on the store's executor
};

} // namespace corodist::collective::detail
