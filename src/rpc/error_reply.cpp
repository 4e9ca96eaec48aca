#include "rpc/error_reply.hpp"

#include <corodist/core/error.hpp>
#include <corodist/rpc/codec.hpp>
#include <corodist/rpc/errors.hpp>

#include <tuple>

namespace corodist::rpc::detail {

payload encode_failure(failure code, std::string_view type, std::string_view message) {
  encoder e;
  auto& pk = e.packer();
  pk.pack_array(3);
  pk.pack(static_cast<int>(code));
  pack_value(pk, type);
  pack_value(pk, message);
  return e.finish();
}

payload encode_exception(const std::exception_ptr& err, const std::string& self) {
  std::string type = "unknown", message = "a non-standard exception";
  try {
    std::rethrow_exception(err);
  } catch (const remote_error& e) { // relayed: it keeps its own type, and says where it was raised
    type = e.type();
    message = e.worker() == self ? e.message() : e.message() + " (raised on worker '" + e.worker() + "')";
  } catch (const std::exception& e) {
    type = demangle(typeid(e).name());
    message = e.what();
  } catch (...) {
  }
  return encode_failure(failure::exception, type, message);
}

std::exception_ptr decode_failure(const std::string& worker, const std::string& what, net::bytes&& payload) {
  try {
    codec_context ctx;
    auto p = parse_payload(std::move(payload), ctx);
    auto [code, type, message] = p.body.get().as<std::tuple<int, std::string, std::string>>();
    switch (static_cast<failure>(code)) {
    case failure::unknown_function:
      return std::make_exception_ptr(unknown_function_error(worker, message));
    case failure::bad_arguments:
      return std::make_exception_ptr(bad_arguments_error(worker, message));
    case failure::malformed:
      return std::make_exception_ptr(protocol_error(what + ": worker '" + worker + "' rejected it: " + message));
    case failure::deadline:
      return std::make_exception_ptr(timeout_error(what + ": " + message));
    case failure::cancelled:
      return std::make_exception_ptr(cancelled_error(what));
    default:
      return std::make_exception_ptr(remote_error(worker, type, message));
    }
  } catch (const std::exception& e) {
    return std::make_exception_ptr(
        protocol_error(what + ": malformed error reply from worker '" + worker + "': " + e.what()));
  }
}

} // namespace corodist::rpc::detail
