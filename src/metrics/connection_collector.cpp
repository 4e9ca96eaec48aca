// The connection counts at scrape time.
#include "metrics/connection_collector.hpp"

#include <corodist/net/connection_counters.hpp>

#include <string>

namespace corodist::metrics::detail {

namespace {

prometheus::MetricFamily one(std::string name, std::string help, prometheus::MetricType type, double value) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter)
    m.counter.value = value;
  else
    m.gauge.value = value;
  f.metric.push_back(std::move(m));
  return f;
}

} // namespace

std::vector<prometheus::MetricFamily> connection_collector::Collect() const {
  const auto c = net::connection_counters_snapshot();
  using t = prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  out.push_back(one("corodist_connections_opened_total", "Connections started (both directions)", t::Counter,
                    static_cast<double>(c.opened)));
  out.push_back(one("corodist_connections_closed_total", "Started connections closed, for any reason", t::Counter,
                    static_cast<double>(c.closed)));
  out.push_back(one("corodist_connections_lost_total",
                    "Connections closed by a fault (peer silent for peer_timeout, not reading, broken frame, read "
                    "error)",
                    t::Counter, static_cast<double>(c.lost)));
  out.push_back(one("corodist_connections_open", "Connections open now", t::Gauge,
                    static_cast<double>(c.opened >= c.closed ? c.opened - c.closed : 0)));
  out.push_back(one("corodist_heartbeats_missed_total",
                    "Heartbeat checks that found a peer silent for over half its peer_timeout", t::Counter,
                    static_cast<double>(c.heartbeats_missed)));
  return out;
}

} // namespace corodist::metrics::detail
