#pragma once
/// \file
/// corodist::flight_recorder: a bounded ring of an object's recent operations
/// (a process group's collectives, an RPC agent's calls on both sides, a store
/// client's requests, a reducer's buckets), kept so that a hang or a failure
/// can be explained after the fact: what ran, with which shape, against whom,
/// in which state, since when. Every live recorder of a process is listed in
/// one JSON document (`dump_flight_recorders`), which `corodist-run`'s hang
/// verdict gathers from every rank and which the timeline is drawn from.
///
/// Cost: a record is a mutex and a few string copies into a reused slot (no
/// allocation once the slot's strings are large enough); bench/README.md
/// has the figures with the recorder on and off. CORODIST_RECORDER=0 in the
/// environment turns recording off for the whole process (every call below
/// then does nothing); CORODIST_RECORDER_SIZE=N sets the default capacity.

#include <corodist/core/config.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace corodist {

/// Where a recorded operation is.
enum class record_state : std::uint8_t {
  queued,    ///< issued, not started (a collective behind another one)
  started,   ///< running or waiting on its peers
  completed, ///< done
  failed,    ///< ended with an error (`record_entry::error`)
};

/// "queued", "started", "completed", "failed".
std::string_view to_string(record_state s) noexcept;

/// One recorded operation.
struct record_entry {
  using clock = std::chrono::steady_clock;

  std::uint64_t id = 0;     ///< the recorder's own count of records, from 1
  std::uint64_t seq = 0;    ///< the operation's number in its owner (a group's collective number, from 0; a call's id)
  std::string op;           ///< "allreduce", "call", "serve", "get", "bucket", ...
  std::string detail;       ///< its shape: "float32 x 1000, sum", a function name, a key
  std::string peer;         ///< whom it involves: "ranks 0-3", "w1", "127.0.0.1:29500"
  std::string where;        ///< the caller's source line, when known ("train.cpp:42")
  std::uint64_t bytes = 0;  ///< payload size, when known
  std::uint64_t flow = 0;   ///< links the spans of one operation across processes (an RPC's caller and callee); 0: none
  record_state state = record_state::queued;
  std::string error;        ///< the failure's text (state failed)
  std::string error_type;   ///< the failure's kind, for counting ("timeout", "peer_lost", "remote", ...)
  clock::time_point queued{};  ///< when it was recorded
  clock::time_point started{}; ///< when it started (epoch: not yet)
  clock::time_point ended{};   ///< when it completed or failed (epoch: not yet)
};

/// What a record names; strings are copied into the ring.
struct record_fields {
  std::uint64_t seq = 0;
  std::string_view op = {};
  std::string_view detail = {};
  std::string_view peer = {};
  std::string_view where = {};
  std::uint64_t bytes = 0;
  std::uint64_t flow = 0;
  /// Record as started (the usual case) rather than queued.
  bool started = true;
};

/// Settings of a recorder.
struct flight_recorder_options {
  /// Entries kept (the oldest are overwritten). CORODIST_RECORDER_SIZE in
  /// the environment changes this default for the process.
  std::size_t capacity = default_capacity;

  static constexpr std::size_t default_capacity = 2048;
};

/// A bounded ring of one object's operations. Thread-safe: any thread may
/// record and dump. Made with `create`; listed process-wide while alive.
class flight_recorder {
public:
  using handle = std::uint64_t;

  /// A recorder for `layer` ("collective", "rpc", "store", "ddp", ...) and the
  /// object's `name` (a group's prefix, an agent's worker name, a store's
  /// address), listed by `dump_flight_recorders` until the last reference
  /// goes. Returns null when recording is off (CORODIST_RECORDER=0); every
  /// layer checks for that.
  static std::shared_ptr<flight_recorder> create(std::string layer, std::string name,
                                                 flight_recorder_options opts = {});

  /// Whether `create` makes recorders: false when CORODIST_RECORDER=0 was set
  /// when the process first asked, or after `set_enabled(false)`.
  static bool enabled() noexcept;
  /// Turns the making of recorders on or off for the objects created from now
  /// on (those made before keep theirs). Thread-safe.
  static void set_enabled(bool on) noexcept;

  ~flight_recorder();
  flight_recorder(const flight_recorder&) = delete;
  flight_recorder& operator=(const flight_recorder&) = delete;

  /// Records an operation; returns the handle that later calls name it by.
  handle record(const record_fields& f);
  /// The operation has started (a queued one).
  void start(handle h);
  /// Sets the entry's `seq` and `flow`, known only once the operation is under
  /// way (an RPC call's request id, once it is sent). Nothing if `h` was overwritten.
  void set_link(handle h, std::uint64_t seq, std::uint64_t flow);
  /// The operation has completed.
  void complete(handle h);
  /// The operation has failed with `error` (`type`: its kind, as metrics count it).
  void fail(handle h, std::string_view error, std::string_view type = "error");

  /// A copy of the entries, oldest first.
  std::vector<record_entry> entries() const;
  /// A copy of the entries that have not ended (queued or started), oldest first.
  std::vector<record_entry> pending() const;
  /// Records made so far (entries().size() is at most the capacity).
  std::uint64_t recorded() const;

  const std::string& layer() const noexcept { return layer_; }
  const std::string& name() const noexcept { return name_; }
  std::size_t capacity() const noexcept { return ring_.size(); }

  /// Called with every entry that completes or fails (after the ring is
  /// updated, outside its lock), from the thread that ended it. One observer
  /// per process (the metrics); null removes it. Not for the hot paths' use
  /// by more than one reader: the observer must be cheap.
  using observer = std::function<void(const flight_recorder&, const record_entry&)>;
  static void set_observer(observer obs);

private:
  flight_recorder(std::string layer, std::string name, std::size_t capacity);
  void end(handle h, record_state state, std::string_view error, std::string_view type);

  const std::string layer_;
  const std::string name_;
  mutable std::mutex mutex_;
  std::vector<record_entry> ring_;
  std::uint64_t next_ = 1;
};

/// One JSON document of every live recorder of this process:
/// `{"pid", "host", "unix_ns", "steady_ns", "label", "recorders": [{"layer",
/// "name", "capacity", "recorded", "entries": [{"id", "seq", "op", "detail",
/// "peer", "where", "bytes", "flow", "state", "error", "error_type", "queued_ns",
/// "started_ns", "ended_ns", "age_ms"}]}]}` — times in steady-clock
/// nanoseconds (`unix_ns` and `steady_ns` are the same instant on both
/// clocks), `age_ms` how long the entry has waited (queued or started) or
/// took (ended). Never throws for lack of recorders (an empty list).
std::string dump_flight_recorders();

/// An entry that has not ended, with its recorder's layer and name.
struct pending_record {
  std::string layer;
  std::string name;
  record_entry entry;
};

/// The entries of every live recorder of this process that are queued or
/// started (oldest first per recorder): what a hang watch scans.
std::vector<pending_record> pending_flight_records();

/// Names this process in dumps ("rank 3"); the debug responder sets it.
void set_flight_recorder_label(std::string label);

/// Writes `dump_flight_recorders()` to CORODIST_RECORDER_DUMP_DIR (made if
/// missing; else the system's temporary directory) as
/// corodist-recorder-<pid>.json and logs
/// where, citing `reason` (a timeout's text). At most once a second per
/// process (later calls in that second return the same path). Returns the
/// path; empty when recording is off or the file cannot be written (logged).
std::string write_flight_recorder_dump(std::string_view reason);

} // namespace corodist
