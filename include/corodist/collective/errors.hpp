#pragma once
/// \file
/// Errors of collectives: each names the collective, the rank that reports it
/// and the collective's sequence number in its group.

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>

#include <cstdint>
#include <string>

namespace corodist::collective {

/// Where a collective failed: its name, the reporting rank, its sequence
/// number. A base of both collective errors (`catch (const collective_failure&)`
/// sees either); each of them is also a `corodist::error`, whose message
/// `what()` gives here too.
class collective_failure {
public:
  /// `op`: the collective's name; `rank`: the reporting rank; `seq`: its number.
  collective_failure(std::string op, int rank, std::uint64_t seq) : op_(std::move(op)), rank_(rank), seq_(seq) {}
  virtual ~collective_failure() = default;

  /// The whole message (the exception's `what()`).
  virtual const char* what() const noexcept = 0;
  /// The exception itself, as the root of corodist's exceptions (to rethrow
  /// or pass on as one).
  virtual const corodist::error& as_error() const noexcept = 0;

  /// The collective's name ("allreduce", "broadcast", ..., or "create").
  const std::string& op() const noexcept { return op_; }
  /// The rank that reports the failure.
  int rank() const noexcept { return rank_; }
  /// The collective's sequence number in its group (0 for the first).
  std::uint64_t seq() const noexcept { return seq_; }

private:
  std::string op_;
  int rank_;
  std::uint64_t seq_;
};

/// A collective failed: a peer died or closed its connection, the ranks
/// called different collectives or different sizes / dtypes, or the group
/// was aborted by an earlier failure. `what()` says which, naming the
/// collective, this rank and the sequence number.
class collective_error : public error, public collective_failure {
public:
  /// `message` is the whole text; `op`, `rank` and `seq` are also kept apart.
  collective_error(const std::string& message, std::string op, int rank, std::uint64_t seq)
      : error(message), collective_failure(std::move(op), rank, seq) {}

  const char* what() const noexcept override { return error::what(); }
  const corodist::error& as_error() const noexcept override { return *this; }
};

/// A rank of the group was lost: its process died (its connections were
/// reset or closed) or its member key vanished from the store (its
/// connection to the store closed, or the store server's heartbeat deadline
/// passed: a hung or partitioned rank). The group is aborted: every pending
/// and later collective fails with this error. `what()` names the collective,
/// this rank, and "rank 2 lost: <reason>"; form a new group over the
/// survivors to go on.
class rank_lost_error : public collective_error {
public:
  /// `message` is the whole text; `lost` is the lost rank; `op`, `rank`
  /// (the reporting rank) and `seq` as for `collective_error`.
  rank_lost_error(const std::string& message, int lost, std::string op, int rank, std::uint64_t seq)
      : collective_error(message, std::move(op), rank, seq), lost_(lost) {}

  /// The rank that was lost (not the reporting rank, which
  /// `collective_failure::rank()` and `reporting_rank()` give).
  int rank() const noexcept { return lost_; }
  /// The rank that reports the failure.
  int reporting_rank() const noexcept { return collective_failure::rank(); }

private:
  int lost_;
};

/// A collective did not finish before its deadline (a rank never joined it,
/// or it was too slow). The group is aborted: later collectives fail with
/// `collective_error`. Also a `corodist::timeout_error`.
class collective_timeout_error : public timeout_error, public collective_failure {
public:
  /// `message` is the whole text; `op`, `rank` and `seq` are also kept apart.
  collective_timeout_error(const std::string& message, std::string op, int rank, std::uint64_t seq)
      : timeout_error(message), collective_failure(std::move(op), rank, seq) {}

  const char* what() const noexcept override { return timeout_error::what(); }
  const corodist::error& as_error() const noexcept override { return *this; }
};

/// A CUDA runtime call failed, or CUDA cannot be used here (this build has
/// no CUDA, the CUDA plugin cannot be loaded, no device is present): `what()`
/// names the call and gives CUDA's text ("cudaMemcpyAsync on cuda:0: an
/// illegal memory access was encountered (cudaErrorIllegalAddress)").
class cuda_error : public error {
public:
  explicit cuda_error(const std::string& message) : error(message) {}
};

} // namespace corodist::collective
