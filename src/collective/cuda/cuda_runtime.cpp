// The CUDA plugin's runtime table: the CUDA calls behind cuda_stream,
// cuda_event and device_buffer, each checked and turned into cuda_error.
#include <corodist/collective/dtype.hpp>
#include <corodist/collective/errors.hpp>

#include "collective/cuda/cuda_convert.hpp"
#include "collective/cuda/cuda_plugin.hpp"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

namespace corodist::collective::detail {

namespace {

// cuda_convert.cu numbers the dtypes as collective::dtype does.
static_assert(static_cast<int>(dtype::float32) == 0 && static_cast<int>(dtype::float64) == 1 &&
              static_cast<int>(dtype::float16) == 2 && static_cast<int>(dtype::bfloat16) == 3);

// Throws cuda_error for a failed call: "cudaMemcpyAsync on cuda:0: <text> (<name>)".
void check(cudaError_t e, const char* call, int device) {
  if (e == cudaSuccess)
    return;
  (void)cudaGetLastError(); // clear a non-sticky error
  throw cuda_error(fmt::format("{} on {}: {} ({})", call, device >= 0 ? fmt::format("cuda:{}", device) : "the host",
                               cudaGetErrorString(e), cudaGetErrorName(e)));
}

// Makes `device` current for one call and restores the caller's device after
// it (mark_grad_ready runs on the caller's thread, whose device is its own).
// A failure to switch throws, unless `quietly` (the calls that cannot fail).
class use {
public:
  explicit use(int device, bool quietly = false) {
    if (device < 0)
      return;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      (void)cudaGetLastError();
      current = -1;
    }
    if (current == device)
      return;
    if (const auto e = cudaSetDevice(device); e != cudaSuccess) {
      if (!quietly)
        check(e, "cudaSetDevice", device);
      (void)cudaGetLastError();
      return;
    }
    previous_ = current;
  }
  ~use() {
    if (previous_ >= 0)
      cudaSetDevice(previous_);
  }
  use(const use&) = delete;
  use& operator=(const use&) = delete;

private:
  int previous_ = -1;
};

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void* stream_create(int device) {
  const use on(device);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", device);
  return s;
}

void stream_destroy(int device, void* s) noexcept {
  const use on(device, true);
  cudaStreamDestroy(as_stream(s));
}

void stream_synchronize(int device, void* s) {
  const use on(device);
  check(cudaStreamSynchronize(as_stream(s)), "cudaStreamSynchronize", device);
}

void stream_wait_event(int device, void* s, void* e) {
  const use on(device);
  check(cudaStreamWaitEvent(as_stream(s), as_event(e), 0), "cudaStreamWaitEvent", device);
}

void* event_create(int device) {
  const use on(device);
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", device);
  return e;
}

void event_destroy(int device, void* e) noexcept {
  const use on(device, true);
  cudaEventDestroy(as_event(e));
}

void event_record(int device, void* e, void* s) {
  const use on(device);
  check(cudaEventRecord(as_event(e), as_stream(s)), "cudaEventRecord", device);
}

bool event_query(int device, void* e) {
  const use on(device);
  const auto r = cudaEventQuery(as_event(e));
  if (r == cudaErrorNotReady)
    return false;
  check(r, "cudaEventQuery", device);
  return true;
}

void event_synchronize(int device, void* e) {
  const use on(device);
  check(cudaEventSynchronize(as_event(e)), "cudaEventSynchronize", device);
}

void copy_async(int device, void* dst, const void* src, std::size_t bytes, void* s) {
  const use on(device);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(s)), "cudaMemcpyAsync", device);
}

void zero_async(int device, void* dst, std::size_t bytes, void* s) {
  const use on(device);
  check(cudaMemsetAsync(dst, 0, bytes, as_stream(s)), "cudaMemsetAsync", device);
}

void convert_async(int device, const void* src, std::uint8_t st, void* dst, std::uint8_t dt, std::size_t n,
                   int divisor, void* s) {
  const use on(device);
  const auto r = launch_convert(src, st, dst, dt, n, divisor, as_stream(s));
  if (r == cudaErrorNotSupported) // the dtypes were checked: the build has no kernels
    throw cuda_error("cuda_stream::convert: this corodist was built without nvcc, so without its CUDA kernels");
  check(r, "the convert kernel's launch", device);
}

void* allocate(int device, std::size_t bytes) {
  void* p = nullptr;
  if (device < 0) {
    check(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable), "cudaHostAlloc", device);
    return p;
  }
  const use on(device);
  check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc", device);
  return p;
}

void release(int device, void* p) noexcept {
  if (device < 0) {
    cudaFreeHost(p);
    return;
  }
  const use on(device, true);
  cudaFree(p);
}

void* allocate_async(int device, std::size_t bytes, void* s) {
  const use on(device);
  void* p = nullptr;
  check(cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, as_stream(s)), "cudaMallocAsync", device);
  return p;
}

void release_async(int device, void* p, void* s) noexcept {
  const use on(device, true);
  cudaFreeAsync(p, as_stream(s));
}

const cuda_runtime table{
    &device_count,   &stream_create, &stream_destroy, &stream_synchronize, &stream_wait_event,
    &event_create,   &event_destroy, &event_record,   &event_query,        &event_synchronize,
    &copy_async,     &zero_async,    &convert_async,  &allocate,           &release,
    &allocate_async, &release_async, cudaStreamLegacy,
};

} // namespace

const cuda_runtime* plugin_runtime() noexcept { return &table; }

} // namespace corodist::collective::detail
