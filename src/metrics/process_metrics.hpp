#pragma once
// The process's metrics: one prometheus-cpp registry and its families, fed by
// the flight recorders' observer (rpc, store, collective entries) and by the
// reducer's hook; the connection counts are a collectable of their own
// (connection_collector.hpp). Private to the metrics layer: no prometheus
// header reaches a public one.

#include <corodist/core/flight_recorder.hpp>
#include <corodist/metrics/reducer_metrics.hpp>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace corodist::metrics::detail {

/// The size class of a collective's payload ("<=4KiB" ... ">16MiB").
std::string_view size_class(std::uint64_t bytes) noexcept;

/// The latency buckets (seconds) of every duration histogram: 10 µs to 60 s.
const prometheus::Histogram::BucketBoundaries& latency_buckets();

class process_metrics {
public:
  /// The process's metrics (made on first use, never destroyed: recorders may
  /// end entries while the process exits).
  static process_metrics& instance();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  /// The recorders' observer: counts one ended entry. Never throws.
  void on_entry(const flight_recorder& r, const record_entry& e) noexcept;
  /// Counts one reducer iteration. Never throws.
  void on_reducer(const reducer_iteration& it) noexcept;

private:
  process_metrics();

  /// The series of one (operation, shape) of a layer, made on its first entry.
  struct timed_series {
    prometheus::Counter* count = nullptr;
    prometheus::Histogram* duration = nullptr;
    prometheus::Counter* bytes = nullptr; // collectives only
  };
  struct key_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  using series_map = std::unordered_map<std::string, timed_series, key_hash, std::equal_to<>>;

  void on_rpc(const record_entry& e, double seconds);
  void on_store(const record_entry& e, double seconds);
  void on_collective(const record_entry& e, double seconds);
  /// The series under `key` in `m`, made by `make()` the first time.
  template <class Make>
  timed_series& find(series_map& m, std::string_view key, Make&& make);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& rpc_calls_;
  prometheus::Family<prometheus::Counter>& rpc_errors_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Family<prometheus::Counter>& store_ops_;
  prometheus::Family<prometheus::Counter>& store_errors_;
  prometheus::Family<prometheus::Histogram>& store_duration_;
  prometheus::Family<prometheus::Counter>& collective_ops_;
  prometheus::Family<prometheus::Counter>& collective_bytes_;
  prometheus::Family<prometheus::Counter>& collective_errors_;
  prometheus::Family<prometheus::Histogram>& collective_duration_;
  prometheus::Family<prometheus::Histogram>& ddp_bucket_;
  prometheus::Counter& ddp_iterations_;
  prometheus::Counter& ddp_communication_;
  prometheus::Counter& ddp_overlapped_;
  prometheus::Gauge& ddp_overlap_ratio_;
  prometheus::Histogram& ddp_finalize_wait_;

  std::mutex mutex_; // the maps below (the series themselves are thread-safe)
  series_map rpc_;
  series_map store_;
  series_map collective_;
  std::unordered_map<std::size_t, prometheus::Histogram*> buckets_;
};

} // namespace corodist::metrics::detail
