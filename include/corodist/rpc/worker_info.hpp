#pragma once
/// \file
/// corodist::rpc::worker_info: a worker's identity and address.

#include <corodist/core/config.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace corodist::rpc {

/// A worker of the job, as published in the store at start().
struct worker_info {
  std::string name;
  int rank = -1;
  std::string host;
  std::uint16_t port = 0;
};

/// Names the target of a call: a worker name or a rank. Implicit, so calls
/// read `rpc.rpc_async<int>("w1", ...)` or `rpc.rpc_async<int>(1, ...)`. Holds
/// a view: valid only during the call that receives it.
class worker_ref {
public:
  /// By name.
  worker_ref(const char* name) : name_(name) {}
  /// By name.
  worker_ref(std::string_view name) : name_(name) {}
  /// By name.
  worker_ref(const std::string& name) : name_(name) {}
  /// By rank.
  worker_ref(int rank) : rank_(rank) {}
  /// By the worker's own info.
  worker_ref(const worker_info& w) : rank_(w.rank) {}

  /// True if the worker is named by rank.
  bool by_rank() const noexcept { return rank_ >= 0; }
  /// The rank (by_rank()) ...
  int rank() const noexcept { return rank_; }
  /// ... or the name.
  std::string_view name() const noexcept { return name_; }

private:
  std::string_view name_;
  int rank_ = -1;
};

} // namespace corodist::rpc
