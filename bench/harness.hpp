#pragma once
/// \file
/// corodist-bench harness: result records, latency percentiles, the table/JSON
/// reporter, the suite registry, and the raw-socket floor every case is
/// compared against.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace corodist::bench {

/// "Not applicable": a NaN field is omitted from JSON and printed as "-".
inline constexpr double not_applicable = std::numeric_limits<double>::quiet_NaN();

/// A peer's figures for the same case, measured in the same run with the same
/// pinning (PyTorch, gRPC C++, ...). Fields left NaN were not measured.
struct peer_result {
  std::string name;                           ///< e.g. "pytorch", "grpc"
  double p50_us = not_applicable;             ///< compared with the case's p50_us
  double ops_per_s = not_applicable;          ///< compared with ops_per_s (when no p50)
  double gbytes_per_s = not_applicable;       ///< compared with gbytes_per_s (when neither)
  std::string status;                         ///< empty when measured, else e.g. "not installed"
  /// False when the peer's figure measures something else than ours (no
  /// speedup is given); `note` then says what, next to the row.
  bool comparable = true;
  std::string note;

  /// A peer that could not be measured: reported with `why`, never as zero.
  static peer_result missing(std::string name, std::string why = "not installed") {
    peer_result p;
    p.name = std::move(name);
    p.status = std::move(why);
    return p;
  }
};

/// One result row. Fields left NaN do not apply to the case.
struct record {
  std::string suite;
  std::string name;
  double p50_us = not_applicable;
  double p99_us = not_applicable;
  double ops_per_s = not_applicable;
  double gbytes_per_s = not_applicable; ///< 1e9 bytes per second
  double raw_p50_us = not_applicable;   ///< filled from the context when NaN
  double raw_gbytes_per_s = not_applicable; ///< filled from the context when NaN
  std::vector<std::pair<std::string, double>> extra; ///< extra JSON keys (not in the table)
  /// Extra JSON keys with text values (not in the table, but for "error":
  /// the type of the exception an error-path case ends with, printed after
  /// the row).
  std::vector<std::pair<std::string, std::string>> text;
  /// "" for an operation; kind_error_path for how long a failure takes to
  /// surface (an error, or a deadline's overrun): plotted apart from the
  /// operations, with no ratio to the floor. Written to the JSON as "kind".
  std::string kind;
  /// Peers of this case. Each becomes one table row and one JSON line with the
  /// case's own figures repeated and `peer`, `peer_p50_us` / `peer_ops_per_s` /
  /// `peer_gbytes_per_s`, `speedup_vs_peer` (or `peer_status`); none: one row.
  std::vector<peer_result> peers;
};

/// record::kind of a case that times a failure path.
inline constexpr const char* kind_error_path = "error_path";

/// How much better corodist is than `peer` on `r` (> 1: corodist is better):
/// the peer's p50 over ours when the peer has a p50, else our ops/s over the
/// peer's, else our GB/s over the peer's; NaN when there is nothing to compare
/// (or the peer is not `comparable`).
double speedup_vs_peer(const record& r, const peer_result& peer);

/// Collects latency samples (stored as integer nanoseconds) and answers
/// percentiles in microseconds. Reserve up-front so recording never allocates.
class latency_recorder {
public:
  /// Creates a recorder with room for `capacity` samples.
  explicit latency_recorder(std::size_t capacity = 0) { samples_ns_.reserve(capacity); }

  /// Reserves room for `capacity` samples in total.
  void reserve(std::size_t capacity) { samples_ns_.reserve(capacity); }

  /// Records one sample.
  void add(std::chrono::nanoseconds sample) {
    samples_ns_.push_back(sample.count());
    sorted_ = false;
  }

  /// Records one sample given in microseconds.
  void add_us(double sample_us);

  /// Records every sample of `other`.
  void add_all(const latency_recorder& other) {
    samples_ns_.insert(samples_ns_.end(), other.samples_ns_.begin(), other.samples_ns_.end());
    sorted_ = false;
  }

  /// Number of samples recorded.
  std::size_t size() const noexcept { return samples_ns_.size(); }

  /// Drops all samples (keeps the capacity).
  void clear() noexcept {
    samples_ns_.clear();
    sorted_ = true;
  }

  /// The `q`-quantile (q in [0, 1], e.g. 0.5, 0.99) in microseconds, linearly
  /// interpolated between neighbouring samples; NaN when empty. Sorts the
  /// samples on first use after an `add` (not thread-safe).
  double percentile(double q) const;

  /// Mean in microseconds; NaN when empty.
  double mean_us() const;

private:
  mutable std::vector<std::int64_t> samples_ns_;
  mutable bool sorted_ = true;
};

/// Builds a latency record: p50/p99 from `latency`, ops_per_s = samples / elapsed_s.
record latency_record(std::string suite, std::string name, const latency_recorder& latency,
                      double elapsed_s);

class progress;

/// What every suite receives: the run settings, the raw floor, and the sinks.
struct context {
  bool quick = false;
  bool pinned = false;
  bool peers = true;                        ///< run the peers (PyTorch, gRPC); false: --no-peers
  double raw_p50_us = not_applicable;       ///< raw 64 B TCP ping-pong p50
  double raw_gbytes_per_s = not_applicable; ///< raw TCP bulk throughput
  std::string backend;                      ///< "io_uring" or "epoll"
  std::FILE* table_out = stdout;            ///< human table (never null)
  std::FILE* json_out = nullptr;            ///< JSON lines, or null for none
  progress* status = nullptr;               ///< the progress display, told of every case; or null

  /// Fills the record's NaN raw_* fields from the context, prints one table
  /// row (flushed) and writes one JSON line to `json_out` if set.
  void report(record r);

  /// Prints the banner (backend, date, settings, raw floor) and the column header.
  void print_header() const;
};

/// "io_uring" when built with CORODIST_IO_URING, else "epoll".
const char* backend_name() noexcept;

// ---- suite registry -------------------------------------------------------

using suite_fn = void (*)(context&);

struct suite_entry {
  std::string name;
  suite_fn fn = nullptr;
  int order = 0;
  int cases = 0; ///< records the suite reports (for the progress display); 0 = unknown
};

/// Registers a suite at static-initialisation time:
/// `static corodist::bench::suite_registrar reg("net", &run_net_suite, 20, 4);`
struct suite_registrar {
  /// Adds `fn` under `name`; suites run by ascending `order`; `cases` is how
  /// many records it reports (0 if it varies), shown as "case 3/8" while it runs.
  suite_registrar(const char* name, suite_fn fn, int order, int cases = 0);
};

/// The progress display on stderr: which suite and case, how many are left,
/// the elapsed time. On a terminal one status line is redrawn every second
/// and cleared while a table row is printed; otherwise one line per event.
/// Thread-safe.
class progress {
public:
  /// Starts the display (and, on a terminal, its ticker) for `suites`, run in that order.
  explicit progress(std::vector<suite_entry> suites);
  /// Stops the ticker and clears the status line.
  ~progress();
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;

  /// The suite at `index` (into the constructor's list) starts.
  void suite_started(std::size_t index);
  /// What the current suite is doing now, e.g. "PyTorch RPC peer" (until the next case).
  void note(std::string what);
  /// Clears the status line before a table row is printed.
  void pause();
  /// A case was reported (its row printed): counts it and redraws.
  void case_reported(const std::string& name);

private:
  struct state;
  std::unique_ptr<state> s_;
};
/// All registered suites, sorted by order (ties: by name).
std::vector<suite_entry> registered_suites();

// ---- raw-socket floor (implemented in raw_suite.cpp) -----------------------

struct pingpong_result {
  latency_recorder latency; ///< one sample per timed round trip
  double elapsed_s = 0;     ///< wall time of the timed round trips
  std::size_t round_trips = 0;
};

/// Blocking-socket TCP ping-pong over 127.0.0.1 (TCP_NODELAY, echo server on
/// its own thread): `warmup` untimed round trips, then up to `samples` timed
/// ones (fewer if the timed loop passes `max_seconds`). Throws on socket
/// errors and on any 10 s stall.
pingpong_result raw_pingpong(std::size_t message_bytes, std::size_t warmup,
                             std::size_t samples, double max_seconds = 30.0);

struct bulk_result {
  std::uint64_t bytes = 0;   ///< bytes received in the measured window
  double seconds = 0;        ///< first byte to last byte, at the receiver
  double gbytes_per_s = 0;   ///< bytes / seconds / 1e9
};

/// Blocking-socket TCP bulk transfer over 127.0.0.1: a sender thread send()s
/// `total_bytes` in `chunk_bytes` calls; the calling thread recv()s into a
/// `chunk_bytes` buffer and times first byte to last byte.
bulk_result raw_bulk(std::uint64_t total_bytes, std::size_t chunk_bytes);

struct fanin_result {
  double ops_per_s = not_applicable;
  double seconds = 0;
  std::size_t messages = 0;
};

/// `connections` loopback TCP connections, one thread per side with epoll
/// and blocking recv/send, one `message_bytes` message in flight on each
/// connection until `total` have round-tripped: the socket floor for the
/// many-clients cases.
fanin_result raw_fanin(int connections, std::size_t message_bytes, std::size_t total);

/// Raw 64 B ping-pong p50 in microseconds (same sample counts as the raw suite).
double measure_raw_floor(bool quick);

/// Raw bulk throughput in GB/s (same volume as the raw suite).
double measure_raw_bulk(bool quick);

} // namespace corodist::bench
