// The reducer's public face outside the iteration: construction on its own
// loop or the caller's, destruction, the communication hook and the
// accessors (the iteration's calls are in gradient_marking.cpp).
#include "ddp/reducer_state.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>

#include <fmt/core.h>

#include <utility>

namespace corodist::ddp {

namespace cc = corodist::collective;

reducer::reducer(create_tag, asio::any_io_executor ex, std::shared_ptr<cc::process_group> group,
                 std::vector<parameter> params, reducer_options opts, bool own_loop) {
  std::unique_ptr<event_loop> loop;
  if (own_loop) {
    loop = std::make_unique<event_loop>();
    loop->start();
    ex = loop->get_executor();
  }
  impl_ = std::make_unique<impl>(std::move(ex), std::move(loop), std::move(group), std::move(params), std::move(opts));
}

reducer::reducer(std::shared_ptr<cc::process_group> group, std::vector<parameter> params, reducer_options opts)
    : reducer(create_tag{}, {}, std::move(group), std::move(params), std::move(opts), true) {
  run_blocking(impl_->ex, impl_->setup(), "ddp::reducer construction");
}

reducer::reducer(asio::any_io_executor ex, std::shared_ptr<cc::process_group> group, std::vector<parameter> params,
                 reducer_options opts)
    : reducer(create_tag{}, std::move(ex), std::move(group), std::move(params), std::move(opts), false) {
  run_blocking(impl_->ex, impl_->setup(), "ddp::reducer construction");
}

asio::awaitable<std::unique_ptr<reducer>> reducer::create(asio::any_io_executor ex,
                                                          std::shared_ptr<cc::process_group> group,
                                                          std::vector<parameter> params, reducer_options opts) {
  std::unique_ptr<reducer> r(
      new reducer(create_tag{}, std::move(ex), std::move(group), std::move(params), std::move(opts), false));
  co_await r->impl_->setup();
  co_return r;
}

reducer::~reducer() {
  if (impl_)
    impl_->shutdown();
}

void reducer::register_comm_hook(comm_hook hook) {
  if (impl_->iterations > 0)
    throw usage_error("ddp::reducer: register_comm_hook() after the first iteration");
  if (impl_->hook)
    throw usage_error("ddp::reducer: a communication hook is already registered");
  if (!hook)
    throw usage_error("ddp::reducer: register_comm_hook() with an empty hook");
  impl_->hook = std::move(hook);
}

cc::tensor_view reducer::gradient(std::size_t i) const {
  auto& d = *impl_;
  if (i >= d.n)
    throw usage_error(fmt::format("ddp::reducer: gradient({}) out of range ({} parameters)", i, d.n));
  const auto& p = d.params[i];
  if (d.opts.gradient_as_bucket_view)
    return cc::tensor_view(d.slot(i), p.count, p.type, p.where);
  return cc::tensor_view(p.grad, p.count, p.type, p.where);
}

const bucket_layout& reducer::layout() const noexcept { return impl_->layout; }

const iteration_stats& reducer::last_stats() const noexcept { return impl_->stats; }

const std::vector<std::size_t>& reducer::globally_unused() const noexcept { return impl_->globally_unused; }

std::uint64_t reducer::iterations() const noexcept { return impl_->iterations; }

bool reducer::rebuilt() const noexcept { return impl_->rebuilt; }

cc::process_group& reducer::group() const noexcept { return *impl_->pg; }

void reducer::set_group(std::shared_ptr<cc::process_group> g) {
  auto& d = *impl_;
  if (!g)
    throw usage_error("ddp::reducer: set_group() with a null process group");
  if (d.in_iteration)
    throw usage_error("ddp::reducer: set_group() inside an iteration (call it after finalize() returned or threw, "
                      "before the next prepare_for_backward())");
  // The loop touches the group only inside an iteration (none runs now);
  // prepare_for_backward() posts the next one, which publishes these writes.
  d.pg = std::move(g);
  d.world = d.pg->size();
}

} // namespace corodist::ddp
