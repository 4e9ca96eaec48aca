#pragma once
// The bound on what decoding a msgpack value may allocate (private): the
// objects it would make are counted first, without making any.

#include <cstddef>

namespace corodist::rpc::detail {

/// The most objects `n` bytes of msgpack may decode into: max(4 x n, 16 MiB)
/// of msgpack::object, as parse_payload allows a message body.
std::size_t object_budget(std::size_t n) noexcept;

/// Counts the objects the one msgpack value in `data[0, n)` decodes into,
/// stopping once past `budget` (then the count returned is over it). Throws
/// protocol_error if the bytes are not one complete msgpack value. Any thread.
std::size_t count_objects(const char* data, std::size_t n, std::size_t budget);

} // namespace corodist::rpc::detail
