#pragma once
// A collective's entry in its group's flight recorder: the fields of the
// record made at issue (the work_state updates it as it starts and ends).

#include <corodist/collective/process_group.hpp>
#include <corodist/core/flight_recorder.hpp>

#include "collective/work_state.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>

namespace corodist::collective::detail {

/// The peers of a group's collectives: "ranks 0-3" (a group of 4), "rank 0" (of 1).
std::string group_peers(int size);

/// Appends "train.cpp:42" (the file's base name and the line) to `out`;
/// nothing for an unknown location (line 0).
void site_to(fmt::memory_buffer& out, const std::source_location& where);

/// "train.cpp:42", or "" for an unknown location.
std::string site_text(const std::source_location& where);

/// Records `call` in `recorder` through `state` (queued; a null recorder
/// records nothing): op the kind's name, seq `seq` (the collective's
/// number, or the point-to-point call's own: send, recv and
/// batch_isend_irecv are numbered apart from the collectives), detail "float32 x 1000, sum", peer `peers` (a
/// collective's: group_peers) or the point-to-point peers ("rank 1"), the
/// call site and the payload's bytes. No allocation beyond the ring's while
/// the texts fit their inline buffers.
void record_call(work_state& state, const std::shared_ptr<flight_recorder>& recorder, const collective_call& call,
                 std::uint64_t seq, std::string_view peers);

} // namespace corodist::collective::detail
