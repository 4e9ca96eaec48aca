// Fuzz target: the RPC decoder -- a call or reply payload (prefix, attachment
// table, msgpack body) parsed with its bounds, read as a call, and its
// arguments decoded into a function of several parameter types, attachments
// included; then the same body decoded as a reply of a container type.
#include <corodist/rpc/codec.hpp>
#include <corodist/rpc/detail/codec.hpp> // make_handler: rpc's own handler is under test

#include "rpc/call_format.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rpc = corodist::rpc;

namespace {
struct sample {
  int x = 0;
  std::string label;
  std::vector<double> values;
  rpc::attachment blob;
  MSGPACK_DEFINE(x, label, values, blob);
};

const rpc::detail::handler& function() {
  static const auto h = rpc::detail::make_handler(
      [](const rpc::call_context&, int a, std::string b, std::vector<std::int64_t> c, rpc::attachment d,
         std::map<std::string, sample> e) { return a + static_cast<int>(b.size() + c.size() + d.size() + e.size()); });
  return h;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  corodist::net::bytes bytes(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size);
  try {
    rpc::codec_context ctx;
    auto parsed = rpc::parse_payload(std::move(bytes), ctx);
    rpc::codec_scope scope(ctx);
    try {
      auto call = rpc::detail::view_call(parsed.body.get());
      auto bound = function()(*call.args, rpc::call_context(), [] { return std::make_unique<rpc::encoder>(); });
      if (bound.plain)
        (void)bound.plain();
    } catch (const std::exception&) {
    }
    try {
      (void)rpc::decode_value<std::vector<sample>>(parsed.body.get());
    } catch (const std::exception&) {
    }
  } catch (const std::exception&) {
  }
  return 0;
}
