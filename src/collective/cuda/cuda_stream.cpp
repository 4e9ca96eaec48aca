// cuda_stream, cuda_event and device_buffer: thin owners of CUDA handles whose
// every call goes through the CUDA plugin's runtime table (cuda_plugin.hpp),
// so that libcorodist itself links no CUDA library.
#include <corodist/collective/cuda_event.hpp>
#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/errors.hpp>
#include <corodist/core/error.hpp>

#include "collective/cuda/cuda_plugin.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace corodist::collective {

namespace detail {

struct cuda_stream_handle {
  const cuda_runtime* rt;
  int device;
  void* native;
  bool owned;
  ~cuda_stream_handle() {
    if (owned)
      rt->stream_destroy(device, native);
  }
};

struct cuda_event_handle {
  const cuda_runtime* rt;
  int device;
  void* native;
  ~cuda_event_handle() { rt->event_destroy(device, native); }
};

} // namespace detail

namespace {

void check_device(const detail::cuda_runtime& rt, int device) {
  static const int n = rt.device_count(); // does not change while the process runs
  if (device < 0 || device >= n)
    throw usage_error(fmt::format("CUDA device {} does not exist ({} found)", device, n));
}

} // namespace

// ---- cuda_event ------------------------------------------------------------------------

cuda_event cuda_event::create(int device) {
  const auto& rt = detail::cuda_runtime_or_throw();
  check_device(rt, device);
  return cuda_event(std::make_shared<detail::cuda_event_handle>(&rt, device, rt.event_create(device)));
}

int cuda_event::device() const noexcept { return handle_ ? handle_->device : -1; }

bool cuda_event::ready() const { return !handle_ || handle_->rt->event_query(handle_->device, handle_->native); }

asio::awaitable<void> cuda_event::wait(corodist::timeout limit, std::chrono::microseconds first_poll,
                                       std::chrono::microseconds max_poll) const {
  if (ready())
    co_return;
  const auto deadline = limit.from();
  asio::steady_timer timer(co_await asio::this_coro::executor);
  auto interval = std::max(first_poll, std::chrono::microseconds(1));
  while (!ready()) {
    if (deadline.expired())
      throw timeout_error(fmt::format("cuda_event::wait: the work on cuda:{} did not complete within {}",
                                      handle_->device, limit.str()));
    timer.expires_after(interval);
    co_await timer.async_wait(asio::use_awaitable);
    interval = std::min(interval * 2, std::max(max_poll, interval));
  }
}

void cuda_event::synchronize() const {
  if (handle_)
    handle_->rt->event_synchronize(handle_->device, handle_->native);
}

void* cuda_event::native() const noexcept { return handle_ ? handle_->native : nullptr; }

// ---- cuda_stream -----------------------------------------------------------------------

std::string cuda_stream::unavailable_reason() {
  try {
    (void)detail::cuda_runtime_or_throw();
    return {};
  } catch (const cuda_error& e) {
    return e.what();
  }
}

int cuda_stream::device_count() noexcept {
  try {
    return detail::cuda_runtime_or_throw().device_count();
  } catch (...) {
    return 0;
  }
}

cuda_stream cuda_stream::create(int device) {
  const auto& rt = detail::cuda_runtime_or_throw();
  check_device(rt, device);
  return cuda_stream(std::make_shared<detail::cuda_stream_handle>(&rt, device, rt.stream_create(device), true));
}

cuda_stream cuda_stream::borrow(int device, void* handle) {
  const auto& rt = detail::cuda_runtime_or_throw();
  check_device(rt, device);
  return cuda_stream(
      std::make_shared<detail::cuda_stream_handle>(&rt, device, handle ? handle : rt.legacy_stream, false));
}

int cuda_stream::device() const noexcept { return handle_->device; }

void* cuda_stream::native() const noexcept { return handle_->native; }

cuda_event cuda_stream::record() const {
  auto e = cuda_event::create(handle_->device);
  record(e);
  return e;
}

void cuda_stream::record(const cuda_event& e) const {
  if (!e.valid() || e.device() != handle_->device)
    throw usage_error(fmt::format("cuda_stream::record: the event is {}, the stream is on cuda:{}",
                                  e.valid() ? fmt::format("on cuda:{}", e.device()) : "empty", handle_->device));
  handle_->rt->event_record(handle_->device, e.native(), handle_->native);
}

void cuda_stream::wait(const cuda_event& e) const {
  if (e.valid())
    handle_->rt->stream_wait_event(handle_->device, handle_->native, e.native());
}

void cuda_stream::copy(void* dst, const void* src, std::size_t bytes) const {
  if (bytes > 0)
    handle_->rt->copy_async(handle_->device, dst, src, bytes, handle_->native);
}

void cuda_stream::zero(void* dst, std::size_t bytes) const {
  if (bytes > 0)
    handle_->rt->zero_async(handle_->device, dst, bytes, handle_->native);
}

void cuda_stream::convert(const tensor_view& src, const tensor_view& dst, int divisor) const {
  const auto floating = [](dtype t) { return is_floating(t); };
  if (!floating(src.type()) || !floating(dst.type()))
    throw usage_error(fmt::format("cuda_stream::convert: {} to {}: only float32, float64, float16 and bfloat16",
                                  to_string(src.type()), to_string(dst.type())));
  if (src.count() != dst.count())
    throw usage_error(fmt::format("cuda_stream::convert: {} elements into {}", src.count(), dst.count()));
  if (src.where() != device::cuda(handle_->device) || dst.where() != device::cuda(handle_->device))
    throw usage_error(fmt::format("cuda_stream::convert: the views are on {} and {}, the stream on cuda:{}",
                                  src.where().to_string(), dst.where().to_string(), handle_->device));
  if (divisor < 1)
    throw usage_error("cuda_stream::convert: the divisor must be positive");
  handle_->rt->convert_async(handle_->device, src.data(), static_cast<std::uint8_t>(src.type()), dst.data(),
                             static_cast<std::uint8_t>(dst.type()), src.count(), divisor, handle_->native);
}

void cuda_stream::synchronize() const { handle_->rt->stream_synchronize(handle_->device, handle_->native); }

// ---- device_buffer ---------------------------------------------------------------------

device_buffer device_buffer::allocate(device where, std::size_t bytes) {
  const auto& rt = detail::cuda_runtime_or_throw();
  const int dev = where.kind == device::kind_type::cuda ? where.index : -1;
  if (dev >= 0)
    check_device(rt, dev);
  device_buffer b;
  b.runtime_ = &rt;
  b.data_ = rt.allocate(dev, bytes);
  b.bytes_ = bytes;
  b.where_ = where;
  return b;
}

device_buffer device_buffer::allocate_async(const cuda_stream& s, std::size_t bytes) {
  const auto& rt = detail::cuda_runtime_or_throw();
  device_buffer b;
  b.runtime_ = &rt;
  b.data_ = rt.allocate_async(s.device(), bytes, s.native());
  b.bytes_ = bytes;
  b.where_ = device::cuda(s.device());
  b.order_ = s;
  return b;
}

device_buffer::device_buffer(device_buffer&& o) noexcept
    : runtime_(o.runtime_), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), where_(o.where_),
      order_(std::move(o.order_)) {
  o.order_.reset();
}

device_buffer& device_buffer::operator=(device_buffer&& o) noexcept {
  if (this != &o) {
    release();
    runtime_ = o.runtime_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    where_ = o.where_;
    order_ = std::move(o.order_);
    o.order_.reset();
  }
  return *this;
}

device_buffer::~device_buffer() { release(); }

void device_buffer::release() noexcept {
  if (!data_)
    return;
  const int dev = where_.kind == device::kind_type::cuda ? where_.index : -1;
  if (order_)
    runtime_->release_async(dev, data_, order_->native());
  else
    runtime_->release(dev, data_);
  data_ = nullptr;
  order_.reset();
}

void device_buffer::leak() noexcept {
  data_ = nullptr;
  bytes_ = 0;
  order_.reset();
}

} // namespace corodist::collective
