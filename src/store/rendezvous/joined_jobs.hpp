#pragma once
// The rendezvous this process has joined (private): a second rendezvous of
// the same job (the same server address or file, rank and world size) gets
// the store of the first while that store lives, instead of joining again.
// PyTorch's env:// and tcp:// rendezvous share one TCPStore the same way
// (multi_tenant), so that an RPC agent and process groups of one process meet
// in one rendezvous.

#include <corodist/core/future.hpp>
#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace corodist::store::detail {

/// One job of this process as the registry knows it.
struct job_id {
  std::string target; ///< "tcp://HOST:PORT" (env:// and tcp:// alike) or "file://PATH"
  int rank = 0;
  int world_size = 0;
};

/// This process's right and duty to join `job` itself: held while its
/// rendezvous runs. Other rendezvous of the job wait for it; `joined` records
/// the store they then share. Destroyed without `joined` (the rendezvous
/// failed or was abandoned), it hands the job to the next of them.
class job_claim {
public:
  job_claim(std::string key, corodist::promise<void> settle) : key_(std::move(key)), settle_(std::move(settle)) {}
  job_claim(job_claim&& o) noexcept : key_(std::move(o.key_)), settle_(std::exchange(o.settle_, std::nullopt)) {}
  job_claim& operator=(job_claim&&) = delete;
  ~job_claim();

  /// The rendezvous succeeded with `s`: later rendezvous of the job get it while it lives.
  void joined(const std::shared_ptr<store>& s);

private:
  std::string key_;
  std::optional<corodist::promise<void>> settle_; // what the waiting rendezvous await; empty once settled
};

/// What `find_or_claim` found: the store of this process's earlier rendezvous
/// of the job (still alive), or else the claim to join it.
struct job_lookup {
  std::shared_ptr<store> shared;
  std::optional<job_claim> claim;
};

/// Returns the live store of an earlier rendezvous of `job` in this process,
/// waiting first for one still in progress (on any thread or event loop);
/// else the claim to join it. Thread-safe.
[[nodiscard]] asio::awaitable<job_lookup> find_or_claim(const job_id& job);

/// A phrase naming the other jobs at `job`'s target that this process is in
/// (live or joining), "rank 0 of a world of 2", or "" when none. For error messages.
std::string other_jobs_at(const job_id& job);

/// "pid 4242 on node1": who claims a rank in a rendezvous (this process).
std::string this_process();

} // namespace corodist::store::detail
