// gloo_group's staging of CUDA buffers through pinned host memory.
#include "collective/gloo/cuda_staging.hpp"

#include <corodist/core/error.hpp>

#include <fmt/format.h>

#include <thread>

namespace corodist::collective::detail {

namespace {

using clock = std::chrono::steady_clock;

// Waits (polling, on the communication thread) until `e` is done or `deadline`.
void wait_until(const cuda_event& e, clock::time_point deadline, const char* what) {
  auto pause = std::chrono::microseconds(5);
  while (!e.ready()) {
    if (clock::now() >= deadline)
      throw timeout_error(fmt::format("Timed out waiting for the {} of CUDA buffers staged through host memory", what));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(200));
  }
}

// Whether tensor k of `call` is read (input) and written (output) by the
// collective. Point-to-point calls list their entries' buffers in `tensors`.
bool is_input(const collective_call& call, std::size_t k) {
  switch (call.kind) {
  case collective_kind::allgather:
  case collective_kind::reduce_scatter:
  case collective_kind::all_to_all_single:
  case collective_kind::gather:
  case collective_kind::scatter:
  case collective_kind::allgatherv: return k == 0;
  case collective_kind::all_to_all: return k < call.tensors.size() / 2;
  case collective_kind::send:
  case collective_kind::recv:
  case collective_kind::batch_isend_irecv: return call.p2p.at(k).dir == p2p_op::direction::send;
  default: return true;
  }
}
bool is_output(const collective_call& call, std::size_t k) {
  switch (call.kind) {
  case collective_kind::allgather:
  case collective_kind::reduce_scatter:
  case collective_kind::all_to_all_single:
  case collective_kind::gather:
  case collective_kind::scatter:
  case collective_kind::allgatherv: return k == 1;
  case collective_kind::all_to_all: return k >= call.tensors.size() / 2;
  case collective_kind::send:
  case collective_kind::recv:
  case collective_kind::batch_isend_irecv: return call.p2p.at(k).dir == p2p_op::direction::recv;
  default: return true;
  }
}

} // namespace

cuda_stream staging_pool::stream(int device) {
  std::lock_guard lk(mutex_);
  auto it = streams_.find(device);
  if (it == streams_.end())
    it = streams_.emplace(device, cuda_stream::create(device)).first;
  return it->second;
}

device_buffer staging_pool::take(std::size_t bytes) {
  {
    std::lock_guard lk(mutex_);
    // The smallest kept buffer that fits, unless it is more than twice as large.
    if (auto it = free_.lower_bound(bytes); it != free_.end() && it->first <= 2 * bytes + 4096) {
      auto b = std::move(it->second);
      free_.erase(it);
      return b;
    }
  }
  return device_buffer::allocate(device::cpu(), bytes);
}

void staging_pool::give(device_buffer b) {
  std::lock_guard lk(mutex_);
  if (free_.size() >= kept_max)
    free_.erase(free_.begin());
  free_.emplace(b.bytes(), std::move(b));
}

std::unique_ptr<cuda_staging> cuda_staging::stage(collective_call& call, std::shared_ptr<staging_pool> pool) {
  if (call.tensors.empty() || call.tensors[0].where().kind != device::kind_type::cuda)
    return nullptr;
  const int dev = call.tensors[0].where().index;
  auto s = pool->stream(dev);
  std::unique_ptr<cuda_staging> st(new cuda_staging(pool, s));
  s.wait(cuda_stream::borrow(dev, call.stream).record()); // after the caller's work on the buffers
  for (std::size_t k = 0; k < call.tensors.size(); ++k) {
    auto& t = call.tensors[k];
    staged x{t, pool->take(t.bytes()), is_output(call, k)};
    if (is_input(call, k))
      s.copy(x.host.data(), t.data(), t.bytes());
    t = tensor_view(x.host.data(), t.count(), t.type(), device::cpu());
    st->buffers_.push_back(std::move(x));
  }
  st->copied_ = s.record();
  return st;
}

cuda_staging::~cuda_staging() {
  try { // a collective that failed or never ran: its copies may still run into these buffers
    if (!copied_.ready())
      copied_.synchronize();
  } catch (...) {
  }
  for (auto& b : buffers_)
    if (b.host.data())
      pool_->give(std::move(b.host));
}

void cuda_staging::before(clock::time_point deadline) { wait_until(copied_, deadline, "copies to the host"); }

void cuda_staging::after(clock::time_point deadline) {
  for (const auto& b : buffers_)
    if (b.output)
      stream_.copy(b.device_view.data(), b.host.data(), b.device_view.bytes());
  stream_.record(copied_);
  wait_until(copied_, deadline, "copies back to the device");
}

} // namespace corodist::collective::detail
