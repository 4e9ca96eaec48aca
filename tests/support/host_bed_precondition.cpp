// host_bed::available, the Boost.Test precondition of the suites that need a
// host bed: apart from host_bed.cpp, so that the bed builds without Boost.Test
// (corodist-bench uses it).
#include "support/host_bed.hpp"

#include <boost/test/unit_test.hpp>

#include <type_traits>

namespace corodist::test {

static_assert(std::is_same_v<boost::unit_test::test_unit_id, unsigned long>,
              "host_bed::available's parameter is a test_unit_id");

boost::test_tools::assertion_result host_bed::available(unsigned long) {
  const auto reason = unavailable_reason();
  boost::test_tools::assertion_result r(reason.empty());
  if (!r)
    r.message() << "skipped: no host test bed: " << reason;
  return r;
}

} // namespace corodist::test
