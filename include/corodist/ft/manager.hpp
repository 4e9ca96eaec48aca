#pragma once
/// \file
/// corodist::ft::manager: keeps a data-parallel job training through the loss
/// and the return of replicas — a per-step quorum over the store, the process
/// group re-formed over the live replicas, one commit decision per step, and
/// live recovery of a joining replica's state from a healthy one.

#include <corodist/core/config.hpp>

#include <corodist/collective/process_group.hpp>
#include <corodist/collective/tensor_view.hpp>
#include <corodist/ft/manager_options.hpp>
#include <corodist/ft/quorum.hpp>
#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace corodist::ft {

/// One replica's side of a fault-tolerant data-parallel job (torchft's
/// `Manager`). Every replica calls, once per step:
///
///     auto q = co_await mgr->start_step();   // quorum; new group; recovery
///     if (q.reconfigured) red.set_group(mgr->group());
///     ... forward, backward, co_await red.finalize() (catch failures: ok = false) ...
///     if (co_await mgr->should_commit(ok)) optimizer_step();
///
/// `start_step` agrees through the store on the live replicas (those whose
/// manager holds its store connection), forms a new process group over them
/// (Gloo by default; manager_options::make_group, e.g. nccl_group_factory)
/// when the membership changed or the last step failed, and sends the registered
/// state from a member at the highest step to the members behind it (a new
/// or restarted replica) with broadcasts over that group. `should_commit`
/// returns the same answer on every member: true only when every member of
/// the quorum reported success, so no replica applies a half-reduced step.
///
/// Liveness: each manager holds an owned key in the store (store::set_owned),
/// which the store server deletes when the replica's connection is lost
/// (kill, hang or partition, found by the connection's heartbeat within
/// CORODIST_PEER_TIMEOUT_MS); a replica waiting for a lost one goes on
/// without it. A replica whose own store connection was closed fails with
/// `connection_error` and must be restarted (it then rejoins).
///
/// Threads: use from one coroutine at a time; it runs on the caller's
/// executor. Not copyable.
class manager {
public:
  /// Registers this replica (its owned liveness key) in `store`, which must
  /// support owned keys (a tcp_store of a store_server, or a hash_store).
  /// Throws `usage_error` for bad options or a store without owned keys.
  /// (Name the options first: GCC 12 destroys a braced temporary inside `co_await` twice.)
  /// Cancellation: terminal (the awaiting coroutine's, see docs/core.md) at
  /// its store operations: ends with `operation_aborted` and no manager; a
  /// liveness key already written is owned by this store connection.
  [[nodiscard]] static asio::awaitable<std::unique_ptr<manager>> create(std::shared_ptr<store::store> store,
                                                                       manager_options opts);

  /// Releases the group and deletes this replica's liveness key (best effort).
  ~manager();
  manager(const manager&) = delete;
  manager& operator=(const manager&) = delete;

  /// Registers a buffer of the state a recovering replica receives (parameters,
  /// optimizer state, buffers). Every replica registers the same buffers
  /// (sizes, dtypes) in the same order, before the first `start_step`; they
  /// stay alive and in place while the manager lives. Throws `usage_error`
  /// after the first step or for a non-host buffer.
  void register_state(std::string name, collective::tensor_view buffer);

  /// Forms this step's quorum: waits (up to quorum_timeout) until every
  /// member of the last quorum has arrived or was lost, takes in the replicas
  /// waiting to join, re-forms the group when the membership changed or the
  /// last step failed, and, when a member is behind, sends the state from a
  /// member at the highest step (this replica's registered buffers and
  /// `step()` are then overwritten). Returns the quorum. Throws
  /// `timeout_error` (fewer than min_replicas, or replicas that neither came
  /// nor were lost), `connection_error` (this replica's store connection was
  /// lost: restart it), `usage_error` (a step already started).
  /// Cancellation: terminal (the awaiting coroutine's, see docs/core.md) at
  /// its store waits, group creation and state transfer: ends with
  /// `operation_aborted` and no step started; what this replica wrote to the
  /// round stays in the store, so the other members may count it in a
  /// quorum, which this replica's next start_step then serves (or the round
  /// after, when the others gave up forming that quorum's group first); a
  /// group being formed is dropped.
  [[nodiscard]] asio::awaitable<quorum> start_step();

  /// Reports whether this replica's step succeeded (its reductions finished)
  /// and returns the quorum's decision, the same on every member: true when
  /// every member reported success, false when one failed or was lost before
  /// reporting. On true `step()` grows by one. Throws `timeout_error` after
  /// quorum_timeout, `connection_error` as start_step, `usage_error`
  /// without a started step.
  /// Cancellation: terminal, as start_step: ends with `operation_aborted`;
  /// the step is over without a decision here (`step()` unchanged), while
  /// this replica's vote, if already written, counts for the others.
  [[nodiscard]] asio::awaitable<bool> should_commit(bool ok = true);

  /// The process group of the current quorum (null before the first step).
  /// Replaced by `start_step` when `quorum::reconfigured`.
  std::shared_ptr<collective::process_group> group() const noexcept;

  /// The number of committed steps (received with the state on recovery).
  std::uint64_t step() const noexcept;

  /// The last quorum (empty before the first step).
  const quorum& current() const noexcept;

  /// This replica's name.
  const std::string& replica_id() const noexcept;

private:
  struct impl;
  explicit manager(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

} // namespace corodist::ft
