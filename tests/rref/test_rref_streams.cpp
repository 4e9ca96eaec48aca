// Streams and RRefs: a stream function on an RRef's owner, opened with the
// RRef as its argument (encoded as a call's arguments are: the owner sees its
// own value), streams the owned value's elements. Linked into the rref test
// executable.
#include <boost/test/unit_test.hpp>

#include <corodist/rpc/agent.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/remote.hpp>

#include "rpc/rpc_fixtures.hpp"

#include <numeric>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
namespace rr = corodist::rref;
using corodist::test::cluster;

BOOST_AUTO_TEST_SUITE(rref_streams)

BOOST_AUTO_TEST_CASE(owner_streams_the_value_of_an_rref_argument, *utf::timeout(60)) {
  cluster c(2, {}, false);
  for (int r = 0; r < 2; ++r) {
    rr::enable(c[r]);
    c[r].register_function("make_vec", [](int n) {
      std::vector<int> v(static_cast<std::size_t>(n));
      std::iota(v.begin(), v.end(), 0);
      return v;
    });
    c[r].register_stream("elements", [](rpc::stream_writer<int>& w,
                                        rr::rref<std::vector<int>> ref) -> asio::awaitable<void> {
      if (!ref.is_owner())
        throw std::logic_error("not the owner");
      auto v = ref.local_value(); // (there: the test waited for it)
      for (int x : *v)
        co_await w.write(x);
    });
  }
  c.start_all();
  auto ref = rr::remote<std::vector<int>>(c[0], "w1", "make_vec", 1000);
  BOOST_TEST(ref.to_here().get().size() == 1000u); // made on its owner
  {
    auto r = c[0].open_stream<int>("w1", "elements", ref);
    for (int i = 0; i < 1000; ++i)
      BOOST_TEST(r.next_sync().value_or(-1) == i);
    BOOST_TEST(!r.next_sync());
  }
  ref = {};
  c.shutdown_all();
}

BOOST_AUTO_TEST_SUITE_END()
