// Every exception type of the public headers but one cancellation derives from corodist::error, so
// that `catch (const corodist::error& e)` sees it and `e.what()` prints it.
// The list below is checked at compile time; the test also scans
// include/corodist/ for exception classes and fails on one missing here, so a
// new type cannot skip the check.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/core/error.hpp>
#include <corodist/ddp/errors.hpp>
#include <corodist/rpc/codec.hpp>
#include <corodist/rpc/detail/codec.hpp>
#include <corodist/rpc/errors.hpp>
#include <corodist/store/errors.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>

namespace {

template <typename... E>
struct exception_list {
  static constexpr bool all_rooted = (std::is_base_of_v<corodist::error, E> && ...);
};

namespace cc = corodist::collective;

using checked = exception_list<
    corodist::error, corodist::timeout_error, corodist::connection_error, corodist::peer_lost_error,
    corodist::protocol_error, corodist::usage_error, corodist::remote_error, corodist::store::store_error,
    corodist::rpc::unknown_function_error, corodist::rpc::bad_arguments_error, corodist::rpc::bad_result_error,
    corodist::rpc::value_type_error, corodist::rpc::detail::argument_error, cc::collective_error,
    cc::rank_lost_error, cc::collective_timeout_error, cc::cuda_error, corodist::ddp::parameter_mismatch_error,
    corodist::ddp::missing_gradients_error>;
static_assert(checked::all_rooted, "an exception type of corodist does not derive from corodist::error");

// The one exception that is not a failure: a cancellation ends as every
// cancelled operation does (docs/core.md), a std::system_error with
// operation_aborted; rpc::cancelled_error only names an RPC's.
static_assert(std::is_base_of_v<std::system_error, corodist::rpc::cancelled_error> &&
                  !std::is_base_of_v<corodist::error, corodist::rpc::cancelled_error>,
              "rpc::cancelled_error is a std::system_error (operation_aborted), as every cancellation");

// The names above, as a header declares them (collective_failure is the one
// mixin: each of its two exceptions is a corodist::error).
const std::set<std::string> known = {
    "error", "timeout_error", "connection_error", "peer_lost_error", "protocol_error", "usage_error",
    "remote_error", "store_error", "unknown_function_error", "bad_arguments_error", "bad_result_error",
    "value_type_error", "argument_error", "collective_error", "rank_lost_error", "collective_timeout_error",
    "cuda_error", "parameter_mismatch_error", "missing_gradients_error", "collective_failure",
    "cancelled_error"};

} // namespace

BOOST_AUTO_TEST_SUITE(error_root)

BOOST_AUTO_TEST_CASE(every_public_exception_type_derives_from_corodist_error) {
  const std::regex declared(R"(\b(?:class|struct)\s+(\w+(?:error|failure|exception))\s*(?:final\s*)?[:{])");
  std::set<std::string> found;
  for (const auto& f : std::filesystem::recursive_directory_iterator(std::string(CORODIST_SOURCE_DIR) + "/include")) {
    if (f.path().extension() != ".hpp")
      continue;
    std::ifstream in(f.path());
    std::stringstream text;
    text << in.rdbuf();
    const auto s = text.str();
    for (std::sregex_iterator it(s.begin(), s.end(), declared), end; it != end; ++it) {
      found.insert((*it)[1]);
      BOOST_TEST(known.count((*it)[1]) == 1u, "exception type " << (*it)[1] << " in " << f.path()
                                                                 << " is not checked for its root here");
    }
  }
  BOOST_TEST(found.size() >= known.size() - 1); // the scan sees the headers
  // what() works through the mixin too, without a dynamic_cast.
  const cc::collective_timeout_error e("allreduce #3 timed out", "allreduce", 1, 3);
  const cc::collective_failure& f = e;
  BOOST_TEST(std::string(f.what()) == "allreduce #3 timed out");
  BOOST_TEST(&f.as_error() == static_cast<const corodist::error*>(&e));
}

BOOST_AUTO_TEST_SUITE_END()
