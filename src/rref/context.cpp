// rref::enable and friends: the RRef protocol attached to an RPC agent.
#include <corodist/core/error.hpp>
#include <corodist/core/run_on.hpp>
#include <corodist/rref/context.hpp>

#include "rref/rref_context.hpp"

namespace corodist::rref {

namespace detail {
protocol& protocol::of(rpc::message_port& port) {
  auto* p = port.extension<rref_context>();
  if (!p)
    throw usage_error("rref: RRefs are not enabled on this worker (call corodist::rref::enable(agent) before "
                      "agent.start())");
  return *p;
}
} // namespace detail

void enable(rpc::agent& a, context_options opts) {
  auto& port = a.port();
  if (port.extension<detail::rref_context>())
    throw usage_error("rref::enable: RRefs are already enabled on this agent");
  auto ctx = std::make_shared<detail::rref_context>(port, &a, opts);
  ctx->install(); // throws usage_error after start()
  port.set_extension(ctx);
  port.add_shutdown_step("rref: let go of every UserRRef and unshared OwnerRRef",
                         [w = std::weak_ptr<detail::rref_context>(ctx)](std::chrono::milliseconds budget)
                             -> asio::awaitable<void> {
                           if (auto c = w.lock())
                             co_await c->drain(budget);
                         });
}

debug_info info(rpc::agent& a) {
  auto* ctx = a.port().extension<detail::rref_context>();
  if (!ctx)
    throw usage_error("rref::info: RRefs are not enabled on this agent");
  return run_on(a.port().get_executor(), [ctx] { return ctx->info(); }).get();
}

} // namespace corodist::rref
