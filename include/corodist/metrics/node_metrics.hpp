#pragma once
/// \file
/// A node's metrics in one place: the metrics of several processes of one
/// node (a job's local ranks), fetched from their own endpoints at each scrape
/// and served as one exposition with a `rank` label on every series.
/// `corodist-run --metrics-port` serves one.

#include <corodist/core/config.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace corodist::metrics {

/// One process's metrics endpoint (http://127.0.0.1:port/metrics) and its rank.
struct rank_endpoint {
  int rank = 0;
  std::uint16_t port = 0;
};

/// One rank's exposition text.
struct rank_exposition {
  int rank = 0;
  std::string text;
};

/// Merges expositions into one: every sample gets a `rank` label (first), each
/// family's HELP and TYPE lines come once (from the first rank that has the
/// family), followed by the family's samples of every rank. The text format of
/// prometheus-cpp's TextSerializer (HELP, TYPE, samples; comments skipped).
/// Throws corodist::error for a line that is not a sample, HELP or TYPE line.
std::string merge_expositions(const std::vector<rank_exposition>& parts);

/// GET http://`host`:`port`/metrics with civetweb's client; returns the body.
/// Throws corodist::error when the connection fails, the status is not 200,
/// or no response comes within `timeout`. Blocking.
std::string fetch_metrics(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);

/// Serves `GET /metrics` (civetweb) with the merged expositions of the
/// endpoints `source()` lists at each scrape; a rank whose endpoint does not
/// answer is left out of that scrape (its failure counted in
/// `corodist_node_scrape_errors_total`, labelled with the rank).
class node_metrics_server {
public:
  using source = std::function<std::vector<rank_endpoint>()>;

  /// Binds `bind`:`port` (0: a free port). `source` is called on civetweb's
  /// threads, one scrape at a time. Throws corodist::error when it cannot bind.
  node_metrics_server(std::uint16_t port, const std::string& bind, source s);
  /// Stops serving (joins civetweb's threads).
  ~node_metrics_server();
  node_metrics_server(const node_metrics_server&) = delete;
  node_metrics_server& operator=(const node_metrics_server&) = delete;

  /// The bound port.
  std::uint16_t port() const noexcept;

  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

} // namespace corodist::metrics
