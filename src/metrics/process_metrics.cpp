// The process's metric families and how a recorder entry or a reducer
// iteration lands in them (docs/metrics.md lists them).
#include "metrics/process_metrics.hpp"

#include <chrono>

namespace corodist::metrics::detail {

namespace {

using seconds_d = std::chrono::duration<double>;

/// The key of a series in a layer's map: the label values, unit-separated
/// (built in a reused per-thread buffer: no allocation once it is large enough).
std::string_view make_key(std::string_view a, std::string_view b = {}) {
  thread_local std::string key;
  key.assign(a);
  key.push_back('\x1f');
  key.append(b);
  return key;
}

/// The entry's duration in seconds: from its start (or its record, when it
/// never started) to its end.
double duration_of(const record_entry& e) noexcept {
  const auto from = e.started != record_entry::clock::time_point{} ? e.started : e.queued;
  if (e.ended == record_entry::clock::time_point{} || e.ended < from)
    return 0.0;
  return std::chrono::duration_cast<seconds_d>(e.ended - from).count();
}

std::string_view error_type(const record_entry& e) noexcept {
  return e.error_type.empty() ? std::string_view("error") : std::string_view(e.error_type);
}

} // namespace

std::string_view size_class(std::uint64_t bytes) noexcept {
  constexpr std::uint64_t kib = 1024;
  if (bytes <= 4 * kib)
    return "<=4KiB";
  if (bytes <= 64 * kib)
    return "<=64KiB";
  if (bytes <= 1024 * kib)
    return "<=1MiB";
  if (bytes <= 16 * 1024 * kib)
    return "<=16MiB";
  return ">16MiB";
}

const prometheus::Histogram::BucketBoundaries& latency_buckets() {
  static const prometheus::Histogram::BucketBoundaries b{
      1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
      5e-2, 0.1,    0.25, 0.5,  1.0,    2.5,  5.0,  10.0,   30.0, 60.0};
  return b;
}

process_metrics& process_metrics::instance() {
  static auto* m = new process_metrics();
  return *m;
}

process_metrics::process_metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      rpc_calls_(prometheus::BuildCounter()
                     .Name("corodist_rpc_calls_total")
                     .Help("RPC calls ended (completed or failed), by side (caller: made here; callee: served here) "
                           "and function")
                     .Register(*registry_)),
      rpc_errors_(prometheus::BuildCounter()
                      .Name("corodist_rpc_call_errors_total")
                      .Help("RPC calls that failed, by side, function and error type")
                      .Register(*registry_)),
      rpc_duration_(prometheus::BuildHistogram()
                        .Name("corodist_rpc_call_duration_seconds")
                        .Help("RPC call latency (caller: issue to result; callee: serving), by side and function")
                        .Register(*registry_)),
      store_ops_(prometheus::BuildCounter()
                     .Name("corodist_store_ops_total")
                     .Help("Store client operations ended, by operation")
                     .Register(*registry_)),
      store_errors_(prometheus::BuildCounter()
                        .Name("corodist_store_op_errors_total")
                        .Help("Store client operations that failed, by operation and error type")
                        .Register(*registry_)),
      store_duration_(prometheus::BuildHistogram()
                          .Name("corodist_store_op_duration_seconds")
                          .Help("Store client operation latency, by operation")
                          .Register(*registry_)),
      collective_ops_(prometheus::BuildCounter()
                          .Name("corodist_collective_ops_total")
                          .Help("Collectives ended, by operation and payload size class")
                          .Register(*registry_)),
      collective_bytes_(prometheus::BuildCounter()
                            .Name("corodist_collective_bytes_total")
                            .Help("Payload bytes of the collectives ended, by operation and size class")
                            .Register(*registry_)),
      collective_errors_(prometheus::BuildCounter()
                             .Name("corodist_collective_errors_total")
                             .Help("Collectives that failed, by operation, size class and error type")
                             .Register(*registry_)),
      collective_duration_(prometheus::BuildHistogram()
                               .Name("corodist_collective_duration_seconds")
                               .Help("Collective latency (start to end), by operation and size class")
                               .Register(*registry_)),
      ddp_bucket_(prometheus::BuildHistogram()
                      .Name("corodist_ddp_bucket_ready_to_done_seconds")
                      .Help("Reducer buckets: from ready (last gradient in) to reduced, by bucket index")
                      .Register(*registry_)),
      ddp_iterations_(prometheus::BuildCounter()
                          .Name("corodist_ddp_iterations_total")
                          .Help("Synchronized reducer iterations")
                          .Register(*registry_)
                          .Add({})),
      ddp_communication_(prometheus::BuildCounter()
                             .Name("corodist_ddp_communication_seconds_total")
                             .Help("Reducer wall time with at least one collective in flight")
                             .Register(*registry_)
                             .Add({})),
      ddp_overlapped_(prometheus::BuildCounter()
                          .Name("corodist_ddp_overlapped_seconds_total")
                          .Help("Reducer communication time hidden behind the backward pass (before finalize)")
                          .Register(*registry_)
                          .Add({})),
      ddp_overlap_ratio_(prometheus::BuildGauge()
                             .Name("corodist_ddp_overlap_ratio")
                             .Help("Last synchronized iteration: overlapped / communication (0 to 1)")
                             .Register(*registry_)
                             .Add({})),
      ddp_finalize_wait_(prometheus::BuildHistogram()
                             .Name("corodist_ddp_finalize_wait_seconds")
                             .Help("Reducer finalize(): from its call to its return")
                             .Register(*registry_)
                             .Add({}, latency_buckets())) {}

template <class Make>
process_metrics::timed_series& process_metrics::find(series_map& m, std::string_view key, Make&& make) {
  // Each thread keeps the series it has used in a map of its own (no lock, no
  // atomic on a hit: the hot path); a miss looks in the shared map under the
  // lock. Series live as long as the process (nothing is ever erased).
  using local_map = std::unordered_map<std::string, timed_series*, key_hash, std::equal_to<>>;
  thread_local local_map mine[3];
  auto& local = mine[&m == &rpc_ ? 0 : &m == &store_ ? 1 : 2];
  if (auto it = local.find(key); it != local.end())
    return *it->second;
  timed_series* s = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto it = m.find(key);
    if (it == m.end())
      it = m.emplace(std::string(key), make()).first;
    s = &it->second;
  }
  local.emplace(std::string(key), s);
  return *s;
}

void process_metrics::on_entry(const flight_recorder& r, const record_entry& e) noexcept {
  try {
    const std::string& layer = r.layer();
    if (layer == "rpc")
      on_rpc(e, duration_of(e));
    else if (layer == "store")
      on_store(e, duration_of(e));
    else if (layer == "collective")
      on_collective(e, duration_of(e));
  } catch (...) { // a metric lost, never an operation
  }
}

void process_metrics::on_rpc(const record_entry& e, double seconds) {
  const std::string_view side = e.op == "serve" ? "callee" : e.op == "call" ? "caller" : std::string_view();
  if (side.empty())
    return;
  auto& s = find(rpc_, make_key(side, e.detail), [&] {
    prometheus::Labels l{{"side", std::string(side)}, {"function", e.detail}};
    return timed_series{&rpc_calls_.Add(l), &rpc_duration_.Add(l, latency_buckets()), nullptr};
  });
  s.count->Increment();
  s.duration->Observe(seconds);
  if (e.state == record_state::failed)
    rpc_errors_.Add({{"side", std::string(side)}, {"function", e.detail}, {"type", std::string(error_type(e))}})
        .Increment();
}

void process_metrics::on_store(const record_entry& e, double seconds) {
  auto& s = find(store_, make_key(e.op), [&] {
    prometheus::Labels l{{"op", e.op}};
    return timed_series{&store_ops_.Add(l), &store_duration_.Add(l, latency_buckets()), nullptr};
  });
  s.count->Increment();
  s.duration->Observe(seconds);
  if (e.state == record_state::failed)
    store_errors_.Add({{"op", e.op}, {"type", std::string(error_type(e))}}).Increment();
}

void process_metrics::on_collective(const record_entry& e, double seconds) {
  const std::string_view cls = size_class(e.bytes);
  auto& s = find(collective_, make_key(e.op, cls), [&] {
    prometheus::Labels l{{"op", e.op}, {"size_class", std::string(cls)}};
    return timed_series{&collective_ops_.Add(l), &collective_duration_.Add(l, latency_buckets()),
                        &collective_bytes_.Add(l)};
  });
  s.count->Increment();
  s.bytes->Increment(static_cast<double>(e.bytes));
  s.duration->Observe(seconds);
  if (e.state == record_state::failed)
    collective_errors_.Add({{"op", e.op}, {"size_class", std::string(cls)}, {"type", std::string(error_type(e))}})
        .Increment();
}

void process_metrics::on_reducer(const reducer_iteration& it) noexcept {
  try {
    ddp_iterations_.Increment();
    ddp_communication_.Increment(std::chrono::duration_cast<seconds_d>(it.communication).count());
    ddp_overlapped_.Increment(std::chrono::duration_cast<seconds_d>(it.overlapped).count());
    ddp_overlap_ratio_.Set(it.communication.count() > 0 ? static_cast<double>(it.overlapped.count()) /
                                                              static_cast<double>(it.communication.count())
                                                        : 0.0);
    ddp_finalize_wait_.Observe(std::chrono::duration_cast<seconds_d>(it.finalize_wait).count());
    for (std::size_t b = 0; b < it.bucket_ready_to_done.size(); ++b) {
      prometheus::Histogram* h = nullptr;
      {
        std::lock_guard lock(mutex_);
        auto& slot = buckets_[b];
        if (!slot)
          slot = &ddp_bucket_.Add({{"bucket", std::to_string(b)}}, latency_buckets());
        h = slot;
      }
      h->Observe(std::chrono::duration_cast<seconds_d>(it.bucket_ready_to_done[b]).count());
    }
  } catch (...) {
  }
}

} // namespace corodist::metrics::detail
