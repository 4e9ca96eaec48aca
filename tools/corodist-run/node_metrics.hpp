#pragma once
/// \file
/// corodist-run --metrics-port: the node's metrics endpoint. Each local rank
/// starts its own metrics server on a free port (CORODIST_METRICS_PORT=0) and
/// writes the port to a file of a folder this launcher made
/// (CORODIST_METRICS_PORT_FILE=DIR/rank-R); a scrape of the launcher's
/// /metrics fetches every rank's text and serves them merged, each series
/// labelled with its rank.

#include <corodist/metrics/node_metrics.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace corodist::tools::launch {

class node_metrics {
public:
  /// Makes the ports folder (under the system's temporary directory) and
  /// serves on `bind`:`port` (0: a free port). Throws corodist::error when
  /// it cannot bind, std::filesystem::filesystem_error when the folder cannot be made.
  node_metrics(std::uint16_t port, const std::string& bind);
  /// Stops serving and removes the ports folder.
  ~node_metrics();
  node_metrics(const node_metrics&) = delete;
  node_metrics& operator=(const node_metrics&) = delete;

  /// The bound port.
  std::uint16_t port() const noexcept { return server_->port(); }

  /// The variables a rank of number `rank` is started with; removes the port
  /// file of its previous run (a restarted rank is scraped once it has a new one).
  std::vector<std::pair<std::string, std::string>> rank_env(int rank) const;

private:
  std::vector<corodist::metrics::rank_endpoint> endpoints() const;

  std::string dir_;
  std::unique_ptr<corodist::metrics::node_metrics_server> server_;
};

} // namespace corodist::tools::launch
