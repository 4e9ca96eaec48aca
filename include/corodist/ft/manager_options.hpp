#pragma once
/// \file
/// corodist::ft::manager_options: the settings of a fault-tolerance manager.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/collective/gloo_group.hpp>
#include <corodist/ft/group_spec.hpp>

#include <chrono>
#include <string>

namespace corodist::ft {

/// Settings of an ft::manager. Defaults are the named constants.
struct manager_options {
  static constexpr const char* default_prefix = "corodist/ft";
  static constexpr int default_min_replicas = 1;
  static constexpr std::chrono::milliseconds default_quorum_timeout = std::chrono::seconds(60);
  static constexpr std::chrono::milliseconds default_poll_interval = std::chrono::milliseconds(10);
  static constexpr std::chrono::milliseconds default_group_timeout = std::chrono::seconds(60);

  /// This replica's name, stable across its restarts (e.g. "replica3"): no
  /// blank, no newline, at most 128 bytes. Required.
  std::string replica_id;
  /// Key prefix of the job's fault-tolerance state in the store: replicas
  /// that train together use the same one.
  std::string prefix = default_prefix;
  /// A quorum forms only with at least this many replicas: fewer wait for
  /// joiners (up to `quorum_timeout`, then start_step fails).
  int min_replicas = default_min_replicas;
  /// The job's first quorum waits for this many replicas (up to
  /// `quorum_timeout`); 0: min_replicas. Set it to the job's size so that
  /// every replica starts in the first quorum, and min_replicas lower so
  /// that the job goes on after a loss.
  int initial_replicas = 0;
  /// Time limit of one `start_step` (the quorum, the group's re-forming, the
  /// recovery) and of one `should_commit` (`inherit()`: default_quorum_timeout;
  /// `never()`: none).
  corodist::timeout quorum_timeout = default_quorum_timeout;
  /// While it waits for the others, a replica checks this often whether a
  /// replica it waits for was lost (its store connection closed).
  std::chrono::milliseconds poll_interval = default_poll_interval;
  /// Options of the Gloo groups the manager forms (by default; see
  /// `make_group`): `prefix` is replaced by one per quorum; `timeout`
  /// (creation and each collective) defaults to `default_group_timeout`
  /// rather than Gloo's 30 min.
  collective::gloo_options group = [] {
    collective::gloo_options o;
    o.timeout = default_group_timeout;
    return o;
  }();
  /// Forms the process group of each quorum that needs a new one. Empty (the
  /// default): a gloo_group under the request's prefix with `group`'s options.
  /// ft::nccl_group_factory makes one for NCCL (ncclCommShrink when members
  /// were only lost). The group it returns must have the request's rank and size.
  group_factory make_group;
};

} // namespace corodist::ft
