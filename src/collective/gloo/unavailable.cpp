// The Gloo backend in a build without Gloo: the type exists, creation throws.
#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/error.hpp>

namespace corodist::collective {

struct gloo_group::impl {};

namespace {
[[noreturn]] void unavailable() {
  throw usage_error("gloo_group: this corodist was built without Gloo (install libgloo-dev, e.g. with "
                    "scripts/setup.sh, and reconfigure with -Dgloo=enabled)");
}
} // namespace

bool gloo_group::built() noexcept { return false; }

gloo_group::gloo_group(int rank, int size, corodist::timeout timeout, std::unique_ptr<impl> i)
    : process_group(rank, size, timeout), impl_(std::move(i)) {}
gloo_group::~gloo_group() = default;

asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::create(std::shared_ptr<store::store>, int, int, gloo_options) {
  unavailable();
  co_return nullptr;
}
asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::create(asio::any_io_executor, std::string, gloo_options) {
  unavailable();
  co_return nullptr;
}
asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::create(std::shared_ptr<store::store>, int, int) {
  unavailable();
  co_return nullptr;
}
asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::create(asio::any_io_executor, std::string) {
  unavailable();
  co_return nullptr;
}
std::shared_ptr<gloo_group> gloo_group::create_sync(std::shared_ptr<store::store>, int, int, gloo_options) {
  unavailable();
}
std::shared_ptr<gloo_group> gloo_group::create_sync(event_loop&, std::string_view, gloo_options) { unavailable(); }
work gloo_group::submit(collective_call) { unavailable(); }
std::uint64_t gloo_group::sequence_number() const noexcept { return 0; }
void gloo_group::abort(const std::string&) {}
bool gloo_group::aborted() const noexcept { return true; }
const std::string& gloo_group::prefix() const noexcept {
  static const std::string none;
  return none;
}
std::string gloo_group::address() const { return {}; }
bool gloo_group::joins_pytorch() const noexcept { return false; }
asio::awaitable<std::shared_ptr<process_group>> gloo_group::split(int, int, split_options) {
  unavailable();
  co_return nullptr;
}
asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::pytorch_new_group(std::vector<int>, split_options) {
  unavailable();
  co_return nullptr;
}

} // namespace corodist::collective
