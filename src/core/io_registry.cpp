#include "core/io_registry.hpp"
#include "core/linger.hpp"

#include <corodist/core/io_registration.hpp>

namespace corodist::detail {

asio::execution_context::id io_registry::id;
asio::execution_context::id linger_service::id;

} // namespace corodist::detail

namespace corodist {

io_registration::io_registration(asio::execution_context& ctx, std::function<void(bool final)> close)
    : registry_(&asio::use_service<detail::io_registry>(ctx)) {
  registry_->add(this, [this, close = std::move(close)](bool final) {
    if (final)
      registry_ = nullptr; // the registry goes next (and `close` may end the owner)
    close(final);
  });
}

io_registration::~io_registration() {
  if (registry_)
    registry_->remove(this);
}

} // namespace corodist
