#pragma once
/// \file
/// Errors of the DDP reducer. Failures of its collectives are the process
/// group's own (`collective_error`, `collective_timeout_error`).

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace corodist::ddp {

/// The ranks registered different parameters (count, sizes, dtypes or
/// devices). `what()` names the first mismatching parameter and the ranks.
class parameter_mismatch_error : public error {
public:
  /// `parameter`: the first mismatching index (or the count when the counts differ).
  parameter_mismatch_error(const std::string& message, std::size_t parameter)
      : error(message), parameter_(parameter) {}
  /// The first parameter that differs.
  std::size_t parameter() const noexcept { return parameter_; }

private:
  std::size_t parameter_;
};

/// `finalize()` was called while gradients were still missing (not marked
/// ready, and find_unused_parameters off). Names them; the process group is
/// aborted so that the other ranks fail promptly instead of waiting for this
/// rank's buckets until their deadline.
class missing_gradients_error : public error {
public:
  /// `message` is the whole text; `missing` the parameters never marked.
  missing_gradients_error(const std::string& message, std::vector<std::size_t> missing)
      : error(message), missing_(std::move(missing)) {}
  /// The parameters whose gradients were never marked ready.
  const std::vector<std::size_t>& missing() const noexcept { return missing_; }

private:
  std::vector<std::size_t> missing_;
};

} // namespace corodist::ddp
