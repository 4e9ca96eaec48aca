#pragma once
// The state behind a gloo_group, shared by the files that do its jobs:
// creation (gloo_group.cpp), the issue queue (issue_queue.cpp), the watchdog
// and abort (watchdog.cpp), and the stall probe (stall_probe.cpp).

#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/flight_recorder.hpp>
#include <corodist/core/worker_thread.hpp>

#include "collective/gloo/abortable_device.hpp"
#include "collective/gloo/cuda_staging.hpp"
#include "collective/gloo/member_watch.hpp"
#include "collective/gloo/ops.hpp"
#include "collective/gloo/stall_probe.hpp"
#include "collective/gloo/gloo_store.hpp"
#include "collective/work_state.hpp"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include <sys/socket.h>

namespace corodist::collective {

namespace detail {
class mesh_context;

/// One issued collective of a gloo_group, from issue to completion.
struct pending_op {
  using clock = std::chrono::steady_clock;

  std::uint64_t seq = 0;
  collective_call call;
  clock::time_point deadline;
  std::shared_ptr<work_state> state;
  // Call checks: the peers' headers arrive here, ours leaves from here; both
  // posted at issue, so that the exchange runs while the communication
  // thread wakes up.
  std::shared_ptr<header_inbox> inbox;
  std::shared_ptr<header_outbox> header;
  /// When a communication thread started it (clock::rep; 0: not yet).
  std::atomic<clock::rep> started{0};
  /// The watchdog's: probe it once it has run this long (grows per probe).
  clock::duration probe_after{};
  /// The watchdog's: warn that it waits once it has run this long (grows per warning).
  clock::duration warn_after{};
  /// The stall probe's finding (under the group's mutex): the ranks' calls differ.
  std::string mismatch;
  /// Its timeout's text and the abort's reason, made once (timeout_texts)
  /// by whichever thread finds the deadline passed first.
  std::once_flag timeout_once;
  std::string timeout_text;
  std::string timeout_reason;
  /// CUDA buffers: their host copies (null for host buffers).
  std::unique_ptr<cuda_staging> staging;
  /// Point-to-point calls: one Gloo buffer per entry of call.p2p, posted at issue.
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> p2p_buffers;
};

} // namespace detail

struct gloo_group::impl {
  using clock = std::chrono::steady_clock;
  using pending_op = detail::pending_op;

  /// Starts the communication threads and the watchdog (gloo_group.cpp);
  /// `group_keys` is the store under the group's prefix (the stall probe's).
  impl(int r, int n, gloo_options o, std::shared_ptr<store::store> s, std::shared_ptr<store::store> group_keys);
  ~impl() { shutdown(); }

  // ---- the issue queue (issue_queue.cpp) ----

  /// Numbers `call`, queues it for a communication thread, and returns its
  /// work. CUDA buffers are staged through pinned host memory first.
  work submit(collective_call call);
  /// Runs `op` on a communication thread and completes its work.
  void run(pending_op& op);
  /// Runs monitored_barrier `op` and completes its work (naming the ranks
  /// that did not arrive; that aborts the group).
  void run_monitored_barrier(pending_op& op, const detail::gloo_call& gc);
  /// Completes `op`'s work with the error of a Gloo call that threw `what`
  /// (a timeout, an abort, or a failure that aborts the group).
  void failed(pending_op& op, const char* what);
  /// Completes `op`'s work with `e` (null: success) and drops it from `inflight`.
  void finish(const pending_op& op, std::exception_ptr e);
  /// For a barrier: waits until every collective issued before `op` has
  /// finished (two threads let a barrier overtake them); false at the deadline.
  bool wait_for_earlier(const pending_op& op);
  /// True when collectives exchange call headers first.
  bool checks() const noexcept { return opts.check_calls && !opts.pytorch && size > 1; }

  std::string where(const pending_op& op) const;
  collective_error error_of(const pending_op& op, const std::string& what) const;
  collective_timeout_error timeout_of(const pending_op& op, const std::string& what) const;
  std::string timed_out_text(const pending_op& op) const;
  /// `op` timed out: returns {the error's text, the abort's reason}, made
  /// once per collective: timed_out_text, the ranks not waiting in it
  /// (absent_text), "; the group is aborted"; the reason adds where and the
  /// path of the flight recorders' dump written for it. Blocks for at most
  /// absent_limit (the store); never call it on an event loop's thread.
  std::pair<std::string, std::string> timeout_texts(pending_op& op);
  /// With the stall probe: "; rank 2 is not in allreduce #3 (last seen
  /// waiting in #2)" for each rank whose published waiting key does not
  /// name `op` (bounded by absent_limit); "" when every rank does, or
  /// without the probe's keys.
  std::string absent_text(const pending_op& op);
  /// How long a timeout looks in the store for the ranks waiting.
  static constexpr std::chrono::milliseconds absent_limit{1000};

  // ---- point-to-point (point_to_point.cpp) ----

  /// Numbers a send/recv/batch with the point-to-point counter, posts its
  /// sends and receives to Gloo at once (so that exchanges in any order
  /// progress), and queues the wait for them on the point-to-point thread.
  work submit_p2p(collective_call call);
  /// On the point-to-point thread: waits for `op`'s buffers (bounded by the
  /// earliest deadline pending), then completes its work.
  void wait_p2p(pending_op& op);
  /// Completes `op`'s work with the error of a Gloo wait that threw `what`.
  void p2p_failed(pending_op& op, std::size_t entry, const char* what);
  /// Completes a point-to-point `op` (null: success) and drops it from `p2p_queue`.
  void finish_p2p(const pending_op& op, std::exception_ptr e);
  /// "rank 1 posted no matching recv(float32 x 4 from rank 0, tag 0) within 5000 ms".
  std::string p2p_timeout_text(const pending_op& op, std::size_t entry) const;

  // ---- the watchdog and abort (watchdog.cpp) ----

  /// Aborts the group (once): records `why`, fails what waits, and ends the
  /// group's connections. With `lost` >= 0 the abort is for rank `lost`
  /// (`why` then says why it counts as lost): collectives fail with rank_lost_error.
  void abort(const std::string& why, int lost = -1);
  /// Under `lk` (the group's mutex, held): if a rank was lost while the group
  /// was idle, aborts the group for it now (unlocking around the abort).
  void abort_if_lost_while_idle(std::unique_lock<std::mutex>& lk);
  /// Aborts the group for rank `lost` (`why`: "connection reset", ...).
  void rank_lost(int lost, const std::string& why);
  /// Rank `lost`'s member key vanished: aborts the group if a collective is
  /// pending, else notes it for the next collective issued (a peer that
  /// left after the last collective ends no group, and logs nothing).
  void member_lost(int lost, const std::string& why);
  /// The error of `op` in an aborted group (rank_lost_error after rank_lost).
  std::exception_ptr aborted_error(const pending_op& op) const;
  /// After a Gloo call failed with `what` (a peer ended a connection): the
  /// rank lost and why, when the member keys say a rank was lost; else nullopt.
  std::optional<std::pair<int, std::string>> lost_peer(const char* what);
  /// The peer whose listening address `what` (a Gloo pair's error) names, or -1.
  int peer_named(const char* what) const;
  /// The first abort's reason.
  std::string reason() const;
  /// Ends every connection of the group and fails every Gloo buffer in use,
  /// so that every blocked Gloo call fails at once.
  void signal_pairs(const std::string& why);
  /// After connecting: the addresses that identify the group's sockets.
  void record_endpoints(const detail::mesh_context& mesh);
  /// The watchdog thread's body.
  void watch();
  /// Aborts what is in flight, joins the watchdog, stops the communication threads.
  void shutdown() noexcept;

  // ---- the stall probe (stall_probe.cpp) ----

  /// On the watchdog, under `mutex`: starts a probe of the oldest collective
  /// that has run past its probe time (unless a probe runs).
  void probe_stalled(clock::time_point now);
  /// On the watchdog, under `mutex`: warns about the oldest collective that
  /// has waited past its warning time (arrival_warning.hpp), then again
  /// after twice as long, and so on.
  void warn_stalled(clock::time_point now);
  /// The probe's report: the ranks' calls of collective `seq` differ (`text`); aborts.
  void mismatch_found(std::uint64_t seq, const std::string& text);

  /// The recorder's name of a group with options `o`: its prefix, or
  /// "<store prefix>/<group index>" for a group of a PyTorch job.
  static std::string recorder_name(const gloo_options& o);

  /// How long a collective that a peer's abort failed looks in the store
  /// for the difference that peer found.
  static constexpr std::chrono::milliseconds found_by_peer_limit{500};

  // ---- state ----

  const int rank;
  const int size;
  const gloo_options opts;
  std::shared_ptr<store::store> store; // kept alive (a rendezvous' rank 0 holds the server)
  std::string label;
  /// The group's flight recorder (layer "collective", named by `recorder_name`,
  /// the same on every rank); null when recording is off.
  std::shared_ptr<flight_recorder> recorder;
  /// The peers of its collectives, as recorded ("ranks 0-3").
  std::string peers;
  std::shared_ptr<detail::abortable_device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::atomic<bool> connected{false};
  std::string address;
  std::vector<sockaddr_storage> local_ends;  // this rank's side of each connection
  std::vector<sockaddr_storage> remote_ends; // the peers' listening addresses

  mutable std::mutex mutex;
  std::uint64_t next_seq = 0;
  bool aborted = false;
  std::atomic<bool> aborted_flag{false};
  std::string abort_reason;
  int lost_rank = -1;          // the rank lost, when that aborted the group
  int idle_lost = -1;          // a member key that vanished while nothing was pending
  std::string idle_lost_why;
  std::string lost_reason;     // why it counts as lost
  /// The member keys' watch; null when the store has no owned keys.
  std::shared_ptr<detail::member_watch> members;
  /// How long a failed Gloo call looks for a vanished member key.
  static constexpr std::chrono::milliseconds member_poll_limit{500};
  std::map<std::uint64_t, std::shared_ptr<pending_op>> inflight;
  /// Point-to-point calls issued and not completed, in issue order, and
  /// their counter (they are not numbered with the collectives).
  std::map<std::uint64_t, std::shared_ptr<pending_op>> p2p_queue;
  std::uint64_t next_p2p = 0;
  /// The point-to-point thread (made at the first send or receive).
  std::unique_ptr<worker_thread> p2p_waiter;
  bool stopping = false;
  clock::time_point watchdog_wakes_at = clock::time_point::max();
  std::condition_variable watchdog_cv;
  std::condition_variable finished_cv; // a collective finished (barriers wait for earlier ones)
  std::thread watchdog;
  std::unique_ptr<worker_thread> comm;
  /// Null unless stalled collectives are compared (mismatch_probe_delay > 0,
  /// not a PyTorch job, more than one rank).
  std::shared_ptr<detail::stall_probe> probe;
  /// True while a warning gathers the ranks' recorders (one at a time).
  std::shared_ptr<std::atomic<bool>> warning_gather = std::make_shared<std::atomic<bool>>(false);
  /// Streams and pinned buffers of the CUDA buffers' staging.
  std::shared_ptr<detail::staging_pool> staging = std::make_shared<detail::staging_pool>();
  bool watchdog_parked = false;       // idle: the next collective issued wakes the watchdog
  std::uint64_t seq_at_last_look = 0; // next_seq when the watchdog last looked (with the stall probe)
};

} // namespace corodist::collective
