// nccl_group, the public face of the NCCL backend: argument checks, then
// every call forwarded to the communicator of libcorodist-cuda, the plugin
// loaded on first use (collective/cuda/cuda_plugin.hpp).
#include <corodist/collective/errors.hpp>
#include <corodist/collective/nccl_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>

#include "collective/cuda/cuda_plugin.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace corodist::collective {

namespace {

#if CORODIST_HAS_NCCL
constexpr bool nccl_built = true;
#else
constexpr bool nccl_built = false;
#endif

constexpr const char* not_built = "this corodist was built without NCCL (needs CUDA >= 12 and NCCL, e.g. in "
                                  "/usr/local/cuda; reconfigure with -Dcuda=enabled -Dnccl=enabled)";

// The plugin, or usage_error when this build has none.
const detail::cuda_plugin* plugin_or_throw(std::string& why) {
  if (!nccl_built)
    throw usage_error(std::string("nccl_group: ") + not_built);
  return detail::load_cuda_plugin(why);
}

} // namespace

bool nccl_group::built() noexcept { return nccl_built; }

std::string nccl_group::unavailable_reason() {
  if (!nccl_built)
    return not_built;
  std::string why;
  const auto* plugin = detail::load_cuda_plugin(why);
  return plugin ? plugin->unavailable_reason() : why;
}

nccl_group::nccl_group(int rank, int size, corodist::timeout timeout,
                       std::shared_ptr<detail::nccl_backend> backend)
    : process_group(rank, size, timeout), backend_(std::move(backend)) {}

nccl_group::~nccl_group() { backend_->group_destroyed(); }

asio::awaitable<std::shared_ptr<nccl_group>> nccl_group::create(asio::any_io_executor ex,
                                                                std::shared_ptr<store::store> store, int rank,
                                                                int size, nccl_options opts) {
  std::string why;
  const auto* plugin = plugin_or_throw(why);
  if (!store)
    throw usage_error("nccl_group::create: the store is null");
  if (size < 1 || rank < 0 || rank >= size)
    throw usage_error(fmt::format("nccl_group::create: need 0 <= rank < size (rank {}, size {})", rank, size));
  opts.timeout = group_timeout(opts.timeout, nccl_options::default_timeout, "nccl_group::create");
  if (opts.poll_interval.count() <= 0 || opts.max_poll_interval < opts.poll_interval)
    throw usage_error("nccl_group::create: poll intervals must be positive (max >= first)");
  if (!plugin)
    throw collective_error(fmt::format("nccl_group create (prefix '{}', rank {} of {}): {}", opts.prefix, rank, size,
                                       why),
                           "create", rank, 0);
  const auto timeout = opts.timeout;
  auto backend = co_await plugin->create_nccl(std::move(ex), std::move(store), rank, size, std::move(opts));
  co_return std::shared_ptr<nccl_group>(new nccl_group(rank, size, timeout, std::move(backend)));
}

asio::awaitable<std::shared_ptr<nccl_group>> nccl_group::create(asio::any_io_executor ex,
                                                                std::shared_ptr<store::store> store, int rank,
                                                                int size) {
  return create(std::move(ex), std::move(store), rank, size, nccl_options{});
}

std::shared_ptr<nccl_group> nccl_group::create_sync(asio::any_io_executor ex, std::shared_ptr<store::store> store,
                                                    int rank, int size, nccl_options opts) {
  auto run_on = ex;
  return run_blocking(run_on, create(std::move(ex), std::move(store), rank, size, std::move(opts)),
                      "nccl_group::create_sync (co_await nccl_group::create on the loop)");
}

asio::awaitable<std::shared_ptr<nccl_group>> nccl_group::shrink(std::vector<int> lost, nccl_options opts) {
  const auto what = fmt::format("nccl_group::shrink (rank {} of {})", rank(), size());
  if (lost.empty())
    throw usage_error(what + ": no rank to leave out (create a new group to re-form the same ranks)");
  std::sort(lost.begin(), lost.end());
  for (std::size_t i = 0; i < lost.size(); ++i) {
    if (lost[i] < 0 || lost[i] >= size())
      throw usage_error(fmt::format("{}: rank {} is not a rank of this group", what, lost[i]));
    if (i > 0 && lost[i] == lost[i - 1])
      throw usage_error(fmt::format("{}: rank {} is given twice", what, lost[i]));
  }
  if (static_cast<int>(lost.size()) == size())
    throw usage_error(what + ": no rank would be left");
  if (std::binary_search(lost.begin(), lost.end(), rank()))
    throw usage_error(what + ": this rank is among those left out (only the remaining ranks call shrink)");
  opts.timeout = group_timeout(opts.timeout, nccl_options::default_timeout, what);
  if (opts.poll_interval.count() <= 0 || opts.max_poll_interval < opts.poll_interval)
    throw usage_error(what + ": poll intervals must be positive (max >= first)");
  if (opts.device != -1 && opts.device != cuda_device())
    throw usage_error(fmt::format("{}: the new group stays on cuda:{}, not {}", what, cuda_device(), opts.device));
  const auto timeout = opts.timeout;
  auto backend = co_await backend_->shrink(lost, std::move(opts));
  const int new_rank = rank() - static_cast<int>(std::lower_bound(lost.begin(), lost.end(), rank()) - lost.begin());
  const int new_size = size() - static_cast<int>(lost.size());
  co_return std::shared_ptr<nccl_group>(new nccl_group(new_rank, new_size, timeout, std::move(backend)));
}

asio::awaitable<std::shared_ptr<nccl_group>> nccl_group::shrink(std::vector<int> lost) {
  auto opts = backend_->options();
  opts.prefix += "/shrunk";
  return shrink(std::move(lost), std::move(opts));
}

asio::awaitable<std::shared_ptr<process_group>> nccl_group::split(int color, int key, split_options opts) {
  const auto what = fmt::format("nccl_group::split (rank {} of {}, color {}, key {})", rank(), size(), color, key);
  if (color < 0 && color != no_color)
    throw usage_error(what + ": the color must be >= 0, or no_color");
  const auto timeout = group_timeout(opts.timeout, this->timeout(), what);
  auto child = co_await backend_->split(color, key, timeout, std::move(opts.name));
  if (!child)
    co_return nullptr;
  const int r = child->rank();
  const int n = child->size();
  co_return std::shared_ptr<nccl_group>(new nccl_group(r, n, timeout, std::move(child)));
}

std::string nccl_group::shrink_unavailable_reason() const { return backend_->shrink_unavailable_reason(); }

work nccl_group::submit(collective_call call) { return backend_->submit(std::move(call)); }

std::uint64_t nccl_group::sequence_number() const noexcept { return backend_->sequence_number(); }

void nccl_group::abort(const std::string& reason) { backend_->abort(reason); }

bool nccl_group::aborted() const noexcept { return backend_->aborted(); }

int nccl_group::cuda_device() const noexcept { return backend_->cuda_device(); }

void* nccl_group::stream() const noexcept { return backend_->stream(); }

} // namespace corodist::collective
