#pragma once
/// \file
/// The names corodist-run and an env:// rendezvous share for the job's
/// generations: the variable that tells a worker its generation, the store key
/// holding the current one, and the key prefix of a generation's workers.

#include <corodist/core/config.hpp>

#include <cstdint>
#include <string>

namespace corodist::store {

/// The environment variable corodist-run sets for each worker (beyond
/// torchrun's): the worker's generation, as decimal text.
inline constexpr const char* generation_variable = "CORODIST_GENERATION";

/// The store key (under no prefix) where corodist-run keeps the job's current
/// generation, as decimal text; an env:// rendezvous of an older generation is
/// refused.
inline constexpr const char* generation_key = "corodist/run/generation";

/// Returns the prefix of every key of generation `g`'s workers,
/// "corodist/gen/G" (their env:// rendezvous hands them a prefix_store on it).
/// Throws std::bad_alloc only; any thread.
inline std::string generation_prefix(std::int64_t g) { return "corodist/gen/" + std::to_string(g); }

} // namespace corodist::store
