#pragma once
/// \file
/// corodist::metrics::metrics_server: this process's metrics in Prometheus'
/// text format over HTTP (`GET /metrics`), opt-in. Once started, every flight
/// recorder entry that completes or fails (RPC calls on both sides, store
/// requests, collectives, reducer buckets) is counted and its latency observed
/// in a histogram; connection counts are read from the net layer at scrape
/// time. Before it starts nothing is counted and the layers pay nothing for
/// metrics. docs/metrics.md lists every metric.
///
/// Started by a call to `start`, or, with CORODIST_METRICS_PORT=P in the
/// environment, when the process first connects to a TCP store (every rank of
/// a job does, at rendezvous): P=0 picks a free port. With
/// CORODIST_METRICS_PORT_FILE=PATH the bound port is also written to PATH
/// (`corodist-run --metrics-port` reads it there). Metrics need the flight
/// recorder: with CORODIST_RECORDER=0 only the connection counts are served.

#include <corodist/core/config.hpp>

#include <cstdint>
#include <string>

namespace corodist::metrics {

/// The environment variable that starts the server at the first store connection.
inline constexpr const char* port_variable = "CORODIST_METRICS_PORT";
/// The environment variable naming a file the bound port is written to (decimal, one line).
inline constexpr const char* port_file_variable = "CORODIST_METRICS_PORT_FILE";

/// The process's metrics endpoint (one per process; static functions).
class metrics_server {
public:
  /// Starts counting and serves `GET /metrics` on `bind`:`port` (0: a free
  /// port), on civetweb's threads. Returns the bound port. A second call
  /// returns the port already bound (whatever it asks for).
  /// Throws corodist::error when the address cannot be bound.
  /// Thread-safe.
  static std::uint16_t start(std::uint16_t port, const std::string& bind = "127.0.0.1");

  /// The bound port; 0 while not serving. Thread-safe.
  static std::uint16_t port() noexcept;

  /// Stops serving and counting (the counts so far are kept for a later start).
  /// Thread-safe; does nothing when not serving.
  static void stop() noexcept;
};

/// Starts the server as CORODIST_METRICS_PORT asks (bound to 127.0.0.1, or to
/// CORODIST_METRICS_BIND when set) and writes the port to
/// CORODIST_METRICS_PORT_FILE when set. Returns the bound port; 0 when the
/// variable is unset, already acted on, or the start failed (logged as a
/// warning: metrics never stop a job). Only the first call in a process looks.
/// Thread-safe, never throws.
std::uint16_t start_from_environment() noexcept;

/// The text a scrape returns now (Prometheus text format 0.0.4); counting
/// must have started for the recorder-fed series to be there.
std::string scrape_text();

} // namespace corodist::metrics
