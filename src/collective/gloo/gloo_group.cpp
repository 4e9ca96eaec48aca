// The Gloo backend's public class and its creation: rendezvous through the
// store (in PyTorch's layout, with PyTorch's handshake, when joining a
// PyTorch job), the full mesh of connections, and the group's threads.
#include "collective/gloo/gloo_group_impl.hpp"
#include "collective/gloo/mesh_context.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/prefix_store.hpp>
#include <corodist/store/rendezvous.hpp>

#include "collective/gloo/pytorch_barrier.hpp"
#include "collective/record_call.hpp"
#include "collective/gloo/sigpipe_guard.hpp"
#include "core/log.hpp"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

namespace corodist::collective {

namespace {

using clock = std::chrono::steady_clock;

std::string random_token() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}{:08x}", rd(), rd(), rd());
}

// True if `host` resolves to an address this machine can bind (PyTorch's test
// for its default device).
bool bindable(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr)
    return false;
  bool ok = false;
  for (auto* ai = res; ai && !ok; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0)
      continue;
    ok = ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return ok;
}

gloo::transport::tcp::attr device_attr(const gloo_options& opts) {
  gloo::transport::tcp::attr a;
  if (!opts.host.empty()) {
    a.hostname = opts.host;
  } else if (!opts.interface.empty()) {
    a.iface = opts.interface;
  } else if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    a.iface = ifname;
  } else {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) == 0 && bindable(name))
      a.hostname = name;
    else
      a.hostname = "127.0.0.1";
  }
  return a;
}

} // namespace

// ---- the group's state and threads ----------------------------------------------

gloo_group::impl::impl(int r, int n, gloo_options o, std::shared_ptr<store::store> s,
                       std::shared_ptr<store::store> group_keys)
    : rank(r), size(n), opts(std::move(o)), store(std::move(s)) {
  label = opts.pytorch ? fmt::format("gloo group {} of a PyTorch job", opts.pytorch->group_index)
                       : fmt::format("gloo group '{}'", opts.prefix);
  recorder = flight_recorder::create("collective", recorder_name(opts));
  peers = detail::group_peers(size);
  // PyTorch's ranks use plain tags: there a mismatch is as it is between
  // PyTorch ranks. The call check finds calls that differ before data moves;
  // the probe then looks only for options that make a call's messages differ.
  if (opts.mismatch_probe_delay.count() > 0 && !opts.pytorch && size > 1)
    probe = std::make_shared<detail::stall_probe>(
        std::move(group_keys), label, checks(),
        [this](std::uint64_t seq, const std::string& text) { mismatch_found(seq, text); });
  worker_thread_options wo;
  wo.threads = opts.threads;
  wo.name = "corodist-gloo";
  wo.spin = opts.spin;
  // The communication threads (and Gloo's event-loop thread, which the
  // first of them starts) inherit a mask with SIGPIPE blocked.
  detail::sigpipe_guard no_sigpipe;
  comm = std::make_unique<worker_thread>(wo);
  watchdog = std::thread([this] { watch(); });
}

std::string gloo_group::impl::recorder_name(const gloo_options& o) {
  return o.pytorch ? fmt::format("{}/{}", o.pytorch->store_prefix, o.pytorch->group_index) : o.prefix;
}

// ---- creation -------------------------------------------------------------------

namespace {

// The store keys of one group: gloo's rendezvous keys, and (PyTorch) the
// barrier and sequence-number keys.
class group_stores {
public:
  group_stores(const std::shared_ptr<store::store>& base, const gloo_options& opts) {
    if (opts.pytorch) {
      // PyTorch 1.13: PrefixStore(str(group_count), store) for the group, and
      // ProcessGroupGloo's PrefixStore(str(device_index)) for Gloo's keys.
      job = opts.pytorch->store_prefix.empty()
                ? base
                : std::make_shared<store::prefix_store>(opts.pytorch->store_prefix, base);
      group = std::make_shared<store::prefix_store>(std::to_string(opts.pytorch->group_index), job);
      gloo = std::make_shared<store::prefix_store>("0", group);
    } else {
      job = base;
      group = std::make_shared<store::prefix_store>(opts.prefix, base);
      gloo = group;
    }
  }

  std::shared_ptr<store::store> job;   // PyTorch: where store_based_barrier_key lives
  std::shared_ptr<store::store> group; // the group's prefix
  std::shared_ptr<store::store> gloo;  // Gloo's rendezvous keys
};

std::string create_text(const gloo_options& opts, int rank, int size) {
  return opts.pytorch ? fmt::format("gloo_group create (PyTorch group {}, rank {} of {})", opts.pytorch->group_index,
                                    rank, size)
                      : fmt::format("gloo_group create (prefix '{}', rank {} of {})", opts.prefix, rank, size);
}

// Names the ranks whose address key is missing (after a rendezvous timeout).
asio::awaitable<std::string> missing_ranks(store::store& gloo_keys, int size) {
  std::string missing;
  int n = 0;
  for (int r = 0; r < size; ++r) {
    std::vector<std::string> keys{std::to_string(r)};
    if (co_await gloo_keys.check(std::move(keys)))
      continue;
    if (++n <= 16)
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (n > 16)
    missing += fmt::format(", ... ({} in all)", n);
  co_return missing;
}

// PyTorch 1.13's init_process_group (and new_group) steps after the Gloo
// rendezvous: the store-based barrier over the whole job, then the sequence
// number that the group's rank 0 publishes.
asio::awaitable<void> pytorch_handshake(const group_stores& s, const gloo_options& opts, int rank, int size) {
  const int world = opts.pytorch->world_size > 0 ? opts.pytorch->world_size : size;
  const auto what = create_text(opts, rank, size);
  co_await detail::pytorch_store_barrier(*s.job, opts.pytorch->group_index, world, opts.timeout, what);
  if (rank == 0) {
    std::uint64_t seq = std::random_device{}();
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
      bytes[static_cast<std::size_t>(i)] = static_cast<char>((seq >> (8 * i)) & 0xff);
    co_await s.group->set("SEQ_NUM_STORE_KEY", std::move(bytes));
  } else {
    (void)co_await s.group->get("SEQ_NUM_STORE_KEY", opts.timeout);
  }
}

} // namespace

bool gloo_group::built() noexcept { return true; }

gloo_group::gloo_group(int rank, int size, corodist::timeout timeout, std::unique_ptr<impl> i)
    : process_group(rank, size, timeout), impl_(std::move(i)) {}

gloo_group::~gloo_group() = default;

asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::create(std::shared_ptr<store::store> store, int rank,
                                                                int size, gloo_options opts) {
  if (!store)
    throw usage_error("gloo_group::create: the store is null");
  if (size < 1 || rank < 0 || rank >= size)
    throw usage_error(fmt::format("gloo_group::create: need 0 <= rank < size (rank {}, size {})", rank, size));
  opts.timeout = group_timeout(opts.timeout, gloo_options::default_timeout, "gloo_group::create");
  if (opts.threads < 1)
    throw usage_error("gloo_group::create: threads must be at least 1");
  if (opts.bucket_bytes == 0)
    throw usage_error("gloo_group::create: bucket_bytes must be positive");
  if (opts.mismatch_probe_delay.count() < 0)
    throw usage_error("gloo_group::create: mismatch_probe_delay must not be negative");
  if (opts.pytorch && opts.pytorch->group_index < 0)
    throw usage_error("gloo_group::create: pytorch.group_index must be >= 0");
  if (opts.pytorch && opts.pytorch->world_size != 0 && opts.pytorch->world_size < size)
    throw usage_error(fmt::format("gloo_group::create: pytorch.world_size ({}) is smaller than the group ({} ranks)",
                                  opts.pytorch->world_size, size));
  if (const char* env = std::getenv("CORODIST_CHECK_COLLECTIVES"); env && (std::strcmp(env, "1") == 0 ||
                                                                          std::strcmp(env, "true") == 0))
    opts.check_calls = true;
  const auto what = create_text(opts, rank, size);
  const group_stores stores(store, opts);

  if (!opts.pytorch) {
    // Refuse a prefix that another group already uses on this store.
    const auto token = random_token();
    const auto claim = "claimed/" + std::to_string(rank);
    auto got = co_await stores.group->compare_set(claim, "", token);
    if (got != token)
      throw usage_error(what + ": the prefix is already used by another group on this store; give each group "
                               "sharing a store its own gloo_options::prefix");
  }

  auto state = std::make_unique<impl>(rank, size, opts, store, stores.group);
  auto* st = state.get();
  auto gloo_keys = stores.gloo;
  std::exception_ptr failure;
  bool timed_out = false;
  // The job is named before the co_await: GCC 12 destroys a closure (or
  // aggregate) temporary inside a co_await expression twice.
  auto connect = [st, gloo_keys, &opts, rank, size] {
    auto attr = device_attr(opts);
    st->device = detail::abortable_device::create(attr);
    st->address = st->device->str();
    auto ctx = std::make_shared<detail::mesh_context>(rank, size);
    ctx->setTimeout(opts.timeout.length());
    detail::gloo_store adapter(gloo_keys, opts.timeout.length());
    ctx->connect_mesh(adapter, st->device);
    st->context = ctx;
    st->record_endpoints(*ctx);
    st->connected.store(true, std::memory_order_release);
  };
  try {
    auto connected = st->comm->submit(std::move(connect));
    // Not cancellable (an unconnected slot): the job uses `st` and `opts`
    // until Gloo's connect ends (within opts.timeout); a cancellation takes
    // effect at the next co_await.
    co_await connected.async_get(asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
  } catch (const timeout_error&) {
    timed_out = true;
    failure = std::current_exception();
  } catch (...) {
    failure = std::current_exception();
  }
  if (timed_out) {
    auto missing = co_await missing_ranks(*gloo_keys, size);
    throw timeout_error(fmt::format("{}: {} within {} ms; missing ranks: {}", what,
                                    missing.empty() ? "the rendezvous did not complete" : "not every rank joined",
                                    opts.timeout.length().count(), missing.empty() ? "none (a connection timed out)" : missing));
  }
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      throw collective_error(what + ": connecting to the other ranks failed: " + e.what(), "create", rank, 0);
    }
  }
  // The member key, before the barrier: once it passes, every rank's key
  // exists, and one that vanishes later means that rank was lost.
  bool members = false;
  if (!opts.pytorch && size > 1)
    members = co_await detail::member_watch::publish(store, *stores.group, rank);
  if (opts.pytorch) {
    co_await pytorch_handshake(stores, opts, rank, size);
  } else {
    // Every rank has connected before any returns: a rank that aborts right
    // after creating cannot fail a peer that is still finishing its connects.
    try {
      co_await stores.group->barrier("connected", size, opts.timeout);
    } catch (const timeout_error&) {
      throw timeout_error(fmt::format("{}: not every rank finished connecting within {} ms", what,
                                      opts.timeout.length().count()));
    }
  }
  if (members) {
    st->members = std::make_shared<detail::member_watch>(stores.group, st->label, rank, size);
    detail::member_watch::lost_fn lost = [st](int r, const std::string& why) { st->member_lost(r, why); };
    co_await st->members->start(std::move(lost));
  }
  CORODIST_LOG_DEBUG("{}: connected ({})", what, st->address);
  co_return std::shared_ptr<gloo_group>(new gloo_group(rank, size, opts.timeout, std::move(state)));
}

asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::create(std::shared_ptr<store::store> store, int rank,
                                                                int size) {
  return create(std::move(store), rank, size, gloo_options{});
}

asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::create(asio::any_io_executor ex, std::string url) {
  return create(std::move(ex), std::move(url), gloo_options{});
}

asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::create(asio::any_io_executor ex, std::string url,
                                                                gloo_options opts) {
  store::rendezvous_options ro;
  ro.timeout = opts.timeout;
  auto r = co_await store::async_rendezvous(std::move(ex), std::move(url), ro);
  co_return co_await create(std::move(r.store), r.rank, r.world_size, std::move(opts));
}

std::shared_ptr<gloo_group> gloo_group::create_sync(std::shared_ptr<store::store> store, int rank, int size,
                                                    gloo_options opts) {
  if (!store)
    throw usage_error("gloo_group::create_sync: the store is null");
  auto ex = store->get_executor();
  return run_blocking(ex, create(std::move(store), rank, size, std::move(opts)),
                      "gloo_group::create_sync (co_await gloo_group::create on the loop)");
}

std::shared_ptr<gloo_group> gloo_group::create_sync(event_loop& loop, std::string_view url, gloo_options opts) {
  if ((!loop.embedded() && !loop.running()) || loop.context().stopped())
    throw usage_error("gloo_group::create_sync: the event loop is not running (call loop.start() first)");
  return run_blocking(loop.get_executor(), create(loop.get_executor(), std::string(url), std::move(opts)),
                      "gloo_group::create_sync (co_await gloo_group::create on the loop)");
}

work gloo_group::submit(collective_call call) { return impl_->submit(std::move(call)); }

std::uint64_t gloo_group::sequence_number() const noexcept {
  std::lock_guard lk(impl_->mutex);
  return impl_->next_seq;
}

void gloo_group::abort(const std::string& reason) { impl_->abort("aborted by the user: " + reason); }

bool gloo_group::aborted() const noexcept { return impl_->aborted_flag.load(std::memory_order_acquire); }

const std::string& gloo_group::prefix() const noexcept { return impl_->opts.prefix; }

std::string gloo_group::address() const { return impl_->address; }

} // namespace corodist::collective
