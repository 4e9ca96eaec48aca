// Setting a reducer up: the checks of its parameters (locally, then that
// every rank registered the same), rank 0's initial values and buffers, the
// bucket layout, and the one rebuild of the layout from rank 0's observed order.
#include "ddp/reducer_state.hpp"

#include <corodist/core/error.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <limits>
#include <utility>

namespace corodist::ddp {

namespace cc = corodist::collective;
using detail::param_name;
using detail::unmarked;

namespace {

std::string describe(std::int64_t count, std::int64_t type, std::int64_t dev) {
  const auto t = static_cast<cc::dtype>(type);
  const cc::device d{dev >= 1000 ? cc::device::kind_type::cuda : cc::device::kind_type::cpu,
                     static_cast<int>(dev % 1000)};
  return fmt::format("{} x {} on {}", cc::to_string(t), count, d.to_string());
}

} // namespace

reducer::impl::impl(asio::any_io_executor e, std::unique_ptr<event_loop> loop, std::shared_ptr<cc::process_group> g,
                    std::vector<parameter> ps, reducer_options o)
    : own_loop(std::move(loop)), ex(std::move(e)), pg(std::move(g)), params(std::move(ps)), opts(std::move(o)) {
  if (!pg)
    throw usage_error("ddp::reducer: no process group");
  world = pg->size();
  n = params.size();
  static std::atomic<std::uint64_t> reducers{0};
  const auto name = "reducer " + std::to_string(reducers++);
  recorder = flight_recorder::create("ddp", name);
  mark_recorder = flight_recorder::create("ddp", name + "/marks");
  call.timeout = opts.timeout;
  validate_locally();
  marks = std::make_unique<std::atomic<std::uint8_t>[]>(n);
  slots = std::make_unique<std::atomic<std::uint32_t>[]>(n);
  for (std::size_t i = 0; i < n; ++i) {
    marks[i].store(unmarked, std::memory_order_relaxed);
    slots[i].store(0, std::memory_order_relaxed);
  }
  ready_order.reserve(n);
  used_map.assign(n, 0);
  wake.emplace(ex);
}

void reducer::impl::validate_locally() const {
  if (n == 0)
    throw usage_error("ddp::reducer: no parameters registered");
  if (n >= std::numeric_limits<std::uint32_t>::max())
    throw usage_error("ddp::reducer: too many parameters");
  if (opts.bucket_cap_bytes == 0 || opts.first_bucket_bytes == 0)
    throw usage_error("ddp::reducer: bucket_cap_bytes and first_bucket_bytes must be positive");
  int first_cuda = -1;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& p = params[i];
    if (p.count == 0)
      throw usage_error("ddp::reducer: " + param_name(p, i) +
                        " has no elements (or a gradient of another size than its values)");
    if (p.values == nullptr)
      throw usage_error("ddp::reducer: " + param_name(p, i) + " has no values (null pointer)");
    if (!opts.gradient_as_bucket_view && p.grad == nullptr)
      throw usage_error("ddp::reducer: " + param_name(p, i) +
                        " has no gradient (null pointer; only gradient_as_bucket_view keeps gradients in buckets)");
    if (!cc::is_floating(p.type))
      throw usage_error("ddp::reducer: " + param_name(p, i) + " has dtype " + std::string(cc::to_string(p.type)) +
                        ": gradients must be floating (float32, float64, float16, bfloat16)");
    if (p.where.kind == cc::device::kind_type::cuda)
      if (auto why = cc::cuda_stream::unavailable_reason(); !why.empty())
        throw usage_error("ddp::reducer: " + param_name(p, i) + " lives on " + p.where.to_string() + ": " + why);
    if (p.where.kind == cc::device::kind_type::cuda) {
      if (first_cuda < 0)
        first_cuda = p.where.index;
      else if (opts.stream && p.where.index != first_cuda)
        throw usage_error(fmt::format("ddp::reducer: reducer_options::stream is one device's stream, but the CUDA "
                                      "parameters live on cuda:{} and {} (leave it null: each device's legacy "
                                      "default stream)",
                                      first_cuda, p.where.to_string()));
    }
  }
  for (const auto& b : opts.buffers)
    if (b.data() == nullptr && b.count() > 0)
      throw usage_error("ddp::reducer: a registered buffer has a null pointer");
}

asio::awaitable<void> reducer::impl::setup() {
  co_await verify_across_ranks();
  // CUDA parameters: the reducer's stream and the caller's on each device, an event per parameter.
  produced.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& w = params[i].where;
    if (w.kind != cc::device::kind_type::cuda)
      continue;
    if (!devices.contains(w.index))
      devices.emplace(w.index, detail::cuda_device_state{cc::cuda_stream::create(w.index),
                                                         cc::cuda_stream::borrow(w.index, opts.stream),
                                                         cc::cuda_event::create(w.index)});
    produced[i] = cc::cuda_event::create(w.index);
  }
  // Initial state from rank 0, coalesced per device (comm.h's broadcast_coalesced of the state dict).
  std::map<std::pair<int, int>, std::vector<cc::tensor_view>> state;
  for (const auto& p : params)
    state[{static_cast<int>(p.where.kind), p.where.index}].emplace_back(p.values, p.count, p.type, p.where);
  for (const auto& b : opts.buffers)
    if (b.count() > 0)
      state[{static_cast<int>(b.where().kind), b.where().index}].push_back(b);
  for (auto& [where, views] : state)
    co_await pg->broadcast_coalesced(std::move(views), 0, setup_call);
  apply_layout(bucket_layout::compute(params, {}, opts.first_bucket_bytes, opts.bucket_cap_bytes), false);
  order_producers(); // the first backward writes into zeroed buckets (bucket views)
}

asio::awaitable<void> reducer::impl::verify_across_ranks() {
  const auto allgather = [this](std::vector<cc::tensor_view> t, cc::call_options c) {
    return pg->allgather(t[0], t[1], c);
  };
  // The collectives' memory is shared with control_collective, which keeps it
  // until they end (a cancelled construction does not stop them).
  const auto w = static_cast<std::size_t>(world);
  auto count_io = std::make_shared<std::vector<std::int64_t>>(1 + w); // this rank's count, then every rank's
  (*count_io)[0] = static_cast<std::int64_t>(n);
  std::vector<cc::tensor_view> count_views{cc::tensor_view(count_io->data(), 1, cc::dtype::int64),
                                           cc::tensor_view(count_io->data() + 1, w, cc::dtype::int64)};
  co_await control_collective(std::move(count_views), allgather, setup_call, count_io);
  const std::span<const std::int64_t> counts(count_io->data() + 1, w);
  for (int r = 1; r < world; ++r)
    if (counts[static_cast<std::size_t>(r)] != counts[0]) {
      std::string ranks;
      for (int q = 1; q < world; ++q)
        if (counts[static_cast<std::size_t>(q)] != counts[0])
          ranks += fmt::format(", rank {} has {}", q, counts[static_cast<std::size_t>(q)]);
      throw parameter_mismatch_error(
          fmt::format("ddp::reducer: the ranks registered different numbers of parameters: rank 0 has {}{}",
                      counts[0], ranks),
          static_cast<std::size_t>(std::min(counts[0], (*count_io)[0])));
    }
  auto shape_io = std::make_shared<std::vector<std::int64_t>>(3 * n * (1 + w)); // this rank's shapes, then every rank's
  const std::span<std::int64_t> mine(shape_io->data(), 3 * n), all(shape_io->data() + 3 * n, 3 * n * w);
  for (std::size_t i = 0; i < n; ++i) {
    mine[3 * i] = static_cast<std::int64_t>(params[i].count);
    mine[3 * i + 1] = static_cast<std::int64_t>(params[i].type);
    mine[3 * i + 2] = (params[i].where.kind == cc::device::kind_type::cuda ? 1000 : 0) + params[i].where.index;
  }
  std::vector<cc::tensor_view> shape_views{cc::tensor_view(mine.data(), mine.size(), cc::dtype::int64),
                                           cc::tensor_view(all.data(), all.size(), cc::dtype::int64)};
  co_await control_collective(std::move(shape_views), allgather, setup_call, shape_io);
  for (std::size_t i = 0; i < n; ++i) {
    auto at = [&](int r, std::size_t k) { return all[static_cast<std::size_t>(r) * 3 * n + 3 * i + k]; };
    std::string differ;
    for (int r = 1; r < world; ++r)
      if (at(r, 0) != at(0, 0) || at(r, 1) != at(0, 1) || at(r, 2) != at(0, 2))
        differ += fmt::format(", rank {} has {}", r, describe(at(r, 0), at(r, 1), at(r, 2)));
    if (!differ.empty())
      throw parameter_mismatch_error(fmt::format("ddp::reducer: {} differs between ranks: rank 0 has {}{}",
                                                 param_name(params[i], i), describe(at(0, 0), at(0, 1), at(0, 2)),
                                                 differ),
                                     i);
  }
}

void reducer::impl::apply_layout(bucket_layout l, bool keep_gradients) {
  std::vector<std::vector<std::uint64_t>> mem(l.buckets.size());
  std::vector<cc::device_buffer> dmem(l.buckets.size());
  std::vector<void*> base(l.buckets.size());
  for (std::size_t b = 0; b < l.buckets.size(); ++b) {
    const auto& k = l.buckets[b];
    if (k.where.kind == cc::device::kind_type::cuda) {
      dmem[b] = cc::device_buffer::allocate(k.where, k.bytes());
      on_device(k.where).stream.zero(dmem[b].data(), k.bytes());
      base[b] = dmem[b].data();
    } else {
      mem[b].assign((k.bytes() + 7) / 8, 0);
      base[b] = mem[b].data();
    }
  }
  std::vector<std::size_t> bof = l.bucket_of(n), off(n, 0);
  for (const auto& b : l.buckets)
    for (std::size_t k = 0; k < b.parameters.size(); ++k)
      off[b.parameters[k]] = b.offsets[k];
  if (keep_gradients && !bucket_of.empty()) {
    for (std::size_t i = 0; i < n; ++i) {
      const auto bytes = params[i].bytes();
      void* to = static_cast<std::byte*>(base[bof[i]]) + off[i] * cc::element_size(params[i].type);
      if (params[i].where.kind == cc::device::kind_type::cuda)
        on_device(params[i].where).stream.copy(to, slot(i), bytes);
      else
        std::memcpy(to, slot(i), bytes);
    }
    for (auto& [dev, d] : devices) // the old buckets go once the moves are done
      d.stream.synchronize();
  }
  layout = std::move(l);
  bucket_detail.clear();
  for (std::size_t b = 0; b < layout.buckets.size(); ++b)
    bucket_detail.push_back(fmt::format("bucket {} ({} params)", b, layout.buckets[b].parameters.size()));
  storage = std::move(mem);
  device_storage = std::move(dmem);
  bucket_of = std::move(bof);
  offset_of = std::move(off);
  pending.assign(layout.buckets.size(), 0);
}

asio::awaitable<void> reducer::impl::rebuild() {
  auto order_io = std::make_shared<std::vector<std::int64_t>>();
  auto& order = *order_io;
  order.reserve(n);
  std::vector<char> seen(n, 0);
  for (auto i : ready_order) {
    order.push_back(static_cast<std::int64_t>(i));
    seen[i] = 1;
  }
  for (std::size_t i = n; i-- > 0;)
    if (!seen[i])
      order.push_back(static_cast<std::int64_t>(i));
  const auto began = clock_type::now();
  const auto broadcast = [this](std::vector<cc::tensor_view> t, cc::call_options c) {
    return pg->broadcast(t[0], 0, c);
  };
  std::vector<cc::tensor_view> order_views{cc::tensor_view(order.data(), n, cc::dtype::int64)};
  co_await control_collective(std::move(order_views), broadcast, call, order_io);
  comm.push_back({began, clock_type::now()});
  std::vector<std::size_t> o(n);
  for (std::size_t k = 0; k < n; ++k) {
    const auto v = order[k];
    if (v < 0 || static_cast<std::size_t>(v) >= n)
      throw error("ddp::reducer: rank 0 sent a bad bucket order");
    o[k] = static_cast<std::size_t>(v);
  }
  apply_layout(bucket_layout::compute(params, o, opts.first_bucket_bytes, opts.bucket_cap_bytes),
               opts.gradient_as_bucket_view);
  rebuilt = true;
  rebuilt_now = true;
}

} // namespace corodist::ddp
