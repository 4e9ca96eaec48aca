#pragma once
/// \file
/// The store layer's errors.

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>

namespace corodist::store {

/// A store operation failed: a bad key or value, a limit exceeded, a request
/// the server refused, a rendezvous URL or job that cannot work.
class store_error : public error {
public:
  using error::error;
};

} // namespace corodist::store
