#pragma once
/// \file
/// corodist::store::debug_responder: a rank's answer to "what are you doing?"
/// over the job's store. It serves this process's flight recorders
/// (corodist/core/flight_recorder.hpp) to whoever asks — `corodist-run`'s
/// hang verdict, `corodist-debug`, `collect_hang_verdict`, or a collective
/// that has waited long enough to want the names of the ranks not there —
/// and tells the store when one of its operations has waited longer than
/// `hang_after`, which is what wakes `corodist-run`'s verdict.
///
/// Keys (under the store it is given; under `corodist-run`, the
/// generation's prefix store): `debug/rank/<r>` (pid and host, owned),
/// `debug/world_size`, `debug/request` (a counter: each ask adds one),
/// `debug/dump/<r>/<n>` (rank r's answer to ask n), `debug/stuck` (a
/// counter: each newly stuck operation adds one).

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>
#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <string_view>
#include <string>
#include <vector>

namespace corodist::store {

/// Settings of a debug responder.
struct debug_responder_options {
  /// An operation (collective, RPC call, store wait) running longer than
  /// this is reported stuck (once per operation). Zero: never report.
  /// CORODIST_HANG_AFTER_MS in the environment overrides it (corodist-run's
  /// `--hang-after` sets it for its ranks).
  std::chrono::milliseconds hang_after = default_hang_after;
  /// How often the recorders are scanned for stuck operations.
  std::chrono::milliseconds scan_every = default_scan_every;

  static constexpr std::chrono::milliseconds default_hang_after{std::chrono::seconds(30)};
  static constexpr std::chrono::milliseconds default_scan_every{std::chrono::seconds(1)};
};

/// A rank's debug responder; runs on the store's executor until stopped or
/// destroyed. Started by `rendezvous("env://")` under a launcher that hosts
/// the store (corodist-run, torchrun) unless CORODIST_RESPONDER=0; other
/// programs start it themselves.
class debug_responder : public std::enable_shared_from_this<debug_responder> {
public:
  /// Starts answering for `rank` of `world_size` on `job_store` and returns at
  /// once: it answers the asks made after its key `debug/rank/<rank>`
  /// appears (written on the store's executor). Sets the flight recorders'
  /// label to "rank <rank>". Becomes `current()`. Throws `usage_error` for a
  /// null store or a rank outside the world. Thread-safe.
  static std::shared_ptr<debug_responder> start(std::shared_ptr<store> job_store, int rank, int world_size,
                                                debug_responder_options opts = {});

  /// As `start`, returning once the responder listens (every later ask is
  /// answered). Throws as `start`, and `store_error` when it cannot listen
  /// (the store failed; logged). Cancellation: terminal, through the store
  /// operations it awaits (`operation_aborted`; the responder is not started).
  [[nodiscard]] static asio::awaitable<std::shared_ptr<debug_responder>>
  async_start(std::shared_ptr<store> job_store, int rank, int world_size, debug_responder_options opts = {});

  /// The responder this process started last, while it runs; null if none.
  static std::shared_ptr<debug_responder> current();

  ~debug_responder();

  /// Stops answering (an ask in progress completes). Idempotent, thread-safe.
  void stop();

  /// The job's store while it lives (the responder does not keep it alive: it
  /// stops when the store goes); null after.
  std::shared_ptr<store> job_store() const noexcept { return store_.lock(); }
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }

  /// Private: use `start`.
  debug_responder(std::shared_ptr<store> job_store, int rank, int world_size, debug_responder_options opts);

  struct state; ///< what the responder's coroutines share (src/store/debug/debug_responder.cpp)

private:
  const std::weak_ptr<store> store_;
  const int rank_;
  const int world_size_;
  const debug_responder_options opts_;
  std::shared_ptr<state> state_;
};

/// The key of the debug protocol named `name` ("request", "dump/3/7", ...)
/// under the store a responder serves.
std::string debug_key(std::string_view name);

/// One rank's answer to an ask.
struct rank_dump {
  int rank = -1;
  /// The rank's `dump_flight_recorders()` document; empty when it did not answer.
  std::string json;
  /// Why there is no answer ("did not answer within 5000 ms"), or what else
  /// is known of the rank (a launcher adds "exited with code 1").
  std::string problem;
  /// Half the ask's round trip: the bound on the clock offset below.
  std::chrono::nanoseconds offset_error{0};
  /// The rank's system clock minus the asker's, estimated from the ask's
  /// round trip (the timeline aligns ranks with it).
  std::chrono::nanoseconds clock_offset{0};
};

/// Asks every rank of the job on `job_store` for its recorders and returns
/// their answers, rank by rank (`world_size` ranks; 0: the responders' own
/// `debug/world_size`), after all answered or `limit` passed (a missing one
/// carries `problem`). Throws `store_error`/`connection_error` when the
/// store fails, `timeout_error` when no world size is known within `limit`.
/// Cancellation: terminal, through the store operations it awaits.
[[nodiscard]] asio::awaitable<std::vector<rank_dump>> gather_dumps(std::shared_ptr<store> job_store, int world_size,
                                                                   corodist::timeout limit);

/// As above, waiting only for the answers of the ranks in `only` (a launcher
/// knows which of its ranks have ended); the others' answers are taken if
/// they came meanwhile, else their `problem` is "not waited for". Throws and
/// cancels as above.
[[nodiscard]] asio::awaitable<std::vector<rank_dump>> gather_dumps(std::shared_ptr<store> job_store, int world_size,
                                                                   corodist::timeout limit, std::vector<int> only);

} // namespace corodist::store
