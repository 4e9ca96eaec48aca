// The NCCL backend in a build without CUDA/NCCL: the type exists, creation throws.
#include <corodist/collective/nccl_group.hpp>
#include <corodist/core/error.hpp>

namespace corodist::collective {

struct nccl_group::impl {};

namespace {
const char* const why = "this corodist was built without NCCL (needs CUDA >= 12 and NCCL, e.g. in /usr/local/cuda; "
                        "reconfigure with -Dcuda=enabled -Dnccl=enabled)";
[[noreturn]] void unavailable() { throw usage_error(std::string("nccl_group: ") + why); }
} // namespace

bool nccl_group::built() noexcept { return false; }
std::string nccl_group::unavailable_reason() { return why; }
nccl_group::nccl_group(int rank, int size, std::chrono::milliseconds timeout, std::shared_ptr<impl> i)
    : process_group(rank, size, timeout), impl_(std::move(i)) {}
nccl_group::~nccl_group() = default;
asio::awaitable<std::shared_ptr<nccl_group>> nccl_group::create(asio::any_io_executor, std::shared_ptr<store::store>,
                                                                int, int, nccl_options) {
  unavailable();
  co_return nullptr;
}
asio::awaitable<std::shared_ptr<nccl_group>> nccl_group::create(asio::any_io_executor, std::shared_ptr<store::store>,
                                                                int, int) {
  unavailable();
  co_return nullptr;
}
std::shared_ptr<nccl_group> nccl_group::create_sync(asio::any_io_executor, std::shared_ptr<store::store>, int, int,
                                                    nccl_options) {
  unavailable();
}
work nccl_group::submit(collective_call) { unavailable(); }
std::uint64_t nccl_group::sequence_number() const noexcept { return 0; }
void nccl_group::abort(const std::string&) {}
bool nccl_group::aborted() const noexcept { return true; }
int nccl_group::cuda_device() const noexcept { return -1; }
void* nccl_group::stream() const noexcept { return nullptr; }

} // namespace corodist::collective
