// The current served call of each thread (deadline propagation).
#include <corodist/rpc/detail/call_state.hpp>

namespace corodist::rpc::detail {

namespace {
thread_local const call_state* current = nullptr;
} // namespace

const call_state* current_call() noexcept { return current; }

current_call_scope::current_call_scope(const call_state* s) noexcept : previous_(current) { current = s; }

current_call_scope::~current_call_scope() { current = previous_; }

} // namespace corodist::rpc::detail
