#pragma once
/// \file
/// corodist::store::timeline_json: a job's flight recorders as one Chrome
/// trace / Perfetto document (the trace-event JSON format), with the ranks'
/// clocks aligned on the collector's. Open it in https://ui.perfetto.dev or
/// chrome://tracing.
///
/// Per rank a process (pid = the rank, named "rank N"); per recorder a thread
/// track named "<layer> <name>"; every entry a complete event ("X": name =
/// its op and detail, args seq, detail, peer, bytes, state, error), an entry
/// that took no time (a reducer's gradient mark) an instant event; the spans
/// that share a flow id (an RPC's caller and callee) linked by flow events.
/// The clock offsets used and their error bounds are in "otherData".

#include <corodist/core/config.hpp>

#include <corodist/store/debug_responder.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace corodist::store {

/// Which part of the job a timeline shows, on the collector's system clock:
/// entries that overlap [from, to] (an entry still running lasts until its
/// rank's dump). The default: everything the dumps hold.
struct timeline_window {
  std::chrono::system_clock::time_point from = std::chrono::system_clock::time_point::min();
  std::chrono::system_clock::time_point to = std::chrono::system_clock::time_point::max();
};

/// The trace-event document of `dumps` (each rank's `dump_flight_recorders()`
/// text and clock offset, as `gather_dumps` returns them) within `window`.
/// A rank without a dump, or whose dump does not parse, has no track and is
/// listed with its problem in "otherData.ranks"; the others are unaffected.
/// Times ("ts", "dur") are in microseconds from "otherData.time_origin_unix_ns"
/// (the earliest event, collector's clock). Pure; any thread; throws only
/// std::bad_alloc.
std::string timeline_json(const std::vector<rank_dump>& dumps, timeline_window window = {});

} // namespace corodist::store
