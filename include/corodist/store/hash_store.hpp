#pragma once
/// \file
/// corodist::store::hash_store: an in-process store (c10d's HashStore).

#include <corodist/core/config.hpp>

#include <corodist/store/basic_store.hpp>

namespace corodist::store {

/// A store held in memory by this process; ranks that are threads of one
/// process share it. State lives on `ex`; any thread may await its operations.
/// It has the store server's semantics (the same engine) without its limits.
class hash_store : public basic_store {
public:
  /// Creates an empty store whose state lives on `ex`.
  explicit hash_store(asio::any_io_executor ex);
  ~hash_store() override;
};

} // namespace corodist::store
