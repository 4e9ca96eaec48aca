#pragma once
// The net layer's connection counts (net::connection_counters_snapshot) as
// metric families, read at scrape time: the connections pay one relaxed
// increment per open, close and missed heartbeat, whether or not anyone scrapes.

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

namespace corodist::metrics::detail {

class connection_collector : public prometheus::Collectable {
public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

} // namespace corodist::metrics::detail
