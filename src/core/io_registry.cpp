#include "core/io_registry.hpp"

namespace corodist::detail {
asio::execution_context::id io_registry::id;
} // namespace corodist::detail
