#pragma once
// The job's workers: this worker's claim of its name and rank in the store, the
// wait for everyone's record, and the table of workers every lookup reads (private).

#include <corodist/rpc/worker_info.hpp>
#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace corodist::rpc::detail {

/// Every worker of the job, by rank and by name. Immutable once published.
struct worker_table {
  std::vector<worker_info> by_rank;
  std::unordered_map<std::string, int> rank_of;
};

/// Publishes this worker and learns the others. The table is published once
/// (release) and read lock-free from any thread (acquire); before that,
/// lookups throw usage_error("not started").
class worker_registry {
public:
  /// `prefix`: the agent's key prefix in the store; `agent_name` names it in errors.
  worker_registry(std::string prefix, std::string agent_name);

  /// Claims `self.name` and `self.rank` (compare_set: exactly one worker wins
  /// each; a duplicate throws usage_error naming both ranks), publishes `self`,
  /// and waits up to `timeout` for all `world_size` records (timeout_error
  /// naming the missing ranks). Then the table is visible. Runs on the store's
  /// terms (any executor).
  asio::awaitable<void> join(store::store& s, worker_info self, int world_size, corodist::timeout timeout);

  /// The table, or null before join() finished.
  const worker_table* table() const noexcept { return table_.load(std::memory_order_acquire); }

  /// A worker by name or rank. Throws usage_error if there is none, or before join().
  const worker_info& lookup(worker_ref w) const;
  /// This worker. Throws usage_error before join().
  const worker_info& self() const;

private:
  const worker_table& require() const;

  std::string prefix_;
  std::string agent_name_;
  int self_rank_ = -1;
  std::unique_ptr<worker_table> owned_;
  std::atomic<const worker_table*> table_{nullptr};
};

/// The store record of a worker (msgpack [name, host, port]), and back.
std::string encode_worker_record(const worker_info& w);
worker_info decode_worker_record(int rank, const std::string& record);

} // namespace corodist::rpc::detail
