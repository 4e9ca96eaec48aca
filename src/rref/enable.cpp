// rref::enable and friends: the RRef protocol attached to an RPC agent.
#include <corodist/core/error.hpp>
#include <corodist/core/run_on.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/debug_info.hpp>

#include "rref/reference_tracker.hpp"

namespace corodist::rref {

namespace detail {
protocol& protocol::of(rpc::message_port& port) {
  auto* p = port.extension<reference_tracker>();
  if (!p)
    throw usage_error("rref: RRefs are not enabled on this worker (call corodist::rref::enable(agent) before "
                      "agent.start())");
  return *p;
}
} // namespace detail

void enable(rpc::agent& a, enable_options opts) {
  auto& port = a.port();
  if (port.extension<detail::reference_tracker>())
    throw usage_error("rref::enable: RRefs are already enabled on this agent");
  auto tracker = std::make_shared<detail::reference_tracker>(port, &a, opts);
  tracker->install(); // throws usage_error after start()
  port.set_extension(tracker);
  port.add_shutdown_step("rref: let go of every UserRRef and unshared OwnerRRef",
                         [w = std::weak_ptr<detail::reference_tracker>(tracker)](corodist::deadline by)
                             -> asio::awaitable<void> {
                           if (auto c = w.lock())
                             co_await c->drain(by);
                         });
}

debug_info info(rpc::agent& a) {
  auto* tracker = a.port().extension<detail::reference_tracker>();
  if (!tracker)
    throw usage_error("rref::info: RRefs are not enabled on this agent");
  return run_on(a.port().get_executor(), [tracker] { return tracker->info(); }).get();
}

} // namespace corodist::rref
