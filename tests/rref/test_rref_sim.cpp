// The RRef protocol (the real reference_tracker) in a deterministic simulated
// network: thousands of seeded schedules of random programs -- remote() to
// random workers, RRefs passed to random workers (onward, and back to their
// owner), to_here at random moments, handles dropped at random moments --
// while messages are delayed, reordered, duplicated, or dropped and sent again.
//
// Checked after every event: no owner deletes a value while any reference to
// it lives (a handle, a message carrying it, a to_here waiting). Checked at the
// end, when every handle is dropped and the network has drained: every to_here
// got the right value, and every worker holds nothing.
//
// CORODIST_RREF_SEEDS (default 10,000) sets the number of seeds,
// CORODIST_RREF_SEED=N replays one (the command is printed with any failure).
#define BOOST_TEST_MODULE corodist_rref
#include <boost/test/unit_test.hpp>

#include <corodist/rref/remote.hpp>

#include "rref/sim_network.hpp"

#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace utf = boost::unit_test;
namespace rr = corodist::rref;
namespace sim = corodist::test::sim;

namespace {

constexpr corodist::rpc::message_kind kind_pass = 0x0700; // a user message carrying an rref

struct held {
  rr::rref<int> ref;
  int expected;
};

struct waiting_fetch {
  corodist::future<int> value;
  int expected;
  rr::rref_id id;
  int worker;
};

// One schedule. Returns "" if every check passed, else what failed.
std::string run_seed(std::uint64_t seed, int actions) {
  std::mt19937_64 pick(seed * 0x9e3779b97f4a7c15ull + 1);
  const int workers = 2 + static_cast<int>(seed % 3); // 2, 3 or 4
  sim::network net(workers, seed);
  std::vector<std::vector<held>> handles(static_cast<std::size_t>(workers));
  std::vector<waiting_fetch> fetches;
  std::map<rr::rref_id, int> passes_in_flight; // user messages carrying an rref, by RRef
  std::map<rr::rref_id, int> owner_of;         // RRef -> owner rank
  std::map<rr::rref_id, bool> created;          // the owner has had its value
  std::string failure;

  for (int r = 0; r < workers; ++r) {
    net.at(r).add_function("mk", [r](int k) { return k * 1000 + r; });
    net.at(r).set_handler(kind_pass, "test: an rref passed on", [&, r](corodist::rpc::inbound_message&& m,
                                                                        corodist::rpc::responder&&) {
      corodist::rpc::codec_context ctx;
      net.at(r).decode_context(m.from, ctx);
      auto parsed = corodist::rpc::parse_payload(std::move(m.payload), ctx);
      corodist::rpc::codec_scope scope(ctx);
      auto [expected, ref] = parsed.body.get().as<std::tuple<int, rr::rref<int>>>();
      --passes_in_flight[ref.id()];
      handles[static_cast<std::size_t>(r)].push_back(held{ref, expected});
    });
  }
  auto rnd = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(pick); };

  // No value that is still referenced may be gone from its owner.
  auto check = [&](const std::string& when) {
    if (!failure.empty())
      return;
    std::map<rr::rref_id, int> refs = passes_in_flight;
    for (auto& hs : handles)
      for (auto& h : hs)
        ++refs[h.ref.id()];
    for (auto& f : fetches)
      if (!f.value.is_ready())
        ++refs[f.id];
    for (auto& [id, owner] : owner_of) {
      const bool has = net.tracker(owner).holds_value(id);
      if (has)
        created[id] = true;
      if (created[id] && !has && refs[id] > 0) {
        std::ostringstream o;
        o << "after " << when << ": the owner (worker " << owner << ") deleted R" << id.str() << " while "
          << refs[id] << " reference(s) to it lived";
        failure = o.str();
      }
    }
  };

  for (int a = 0; a < actions && failure.empty(); ++a) {
    const int w = rnd(workers);
    auto& mine = handles[static_cast<std::size_t>(w)];
    const int what = rnd(100);
    std::string did;
    if (what < 20 || mine.empty()) { // remote() or a local RRef
      if (rnd(5) == 0) {
        const int v = rnd(100000);
        auto r = rr::detail::make_rref_on(net.at(w), v);
        owner_of[r.id()] = w;
        mine.push_back(held{r, v});
        did = "make_rref on " + std::to_string(w);
      } else {
        const int owner = rnd(workers);
        const int k = rnd(1000);
        auto r = rr::detail::remote_on<int>(net.at(w), corodist::timeout::inherit(), owner, "mk", k);
        owner_of[r.id()] = owner;
        mine.push_back(held{r, k * 1000 + owner});
        did = "remote from " + std::to_string(w) + " to " + std::to_string(owner);
      }
    } else if (what < 50) { // pass one to a random worker (onward, back to its owner, to itself)
      auto& h = mine[static_cast<std::size_t>(rnd(static_cast<int>(mine.size())))];
      const int to = rnd(workers);
      corodist::rpc::encoder e(&net.at(w), w, to);
      auto& pk = e.packer();
      pk.pack_array(2);
      pk.pack(h.expected);
      pk.pack(h.ref);
      ++passes_in_flight[h.ref.id()];
      net.at(w).notify(to, kind_pass, e.finish());
      did = "pass from " + std::to_string(w) + " to " + std::to_string(to);
    } else if (what < 65) { // to_here
      auto& h = mine[static_cast<std::size_t>(rnd(static_cast<int>(mine.size())))];
      fetches.push_back(waiting_fetch{h.ref.to_here(), h.expected, h.ref.id(), w});
      did = "to_here on " + std::to_string(w);
    } else { // drop a handle
      mine.erase(mine.begin() + rnd(static_cast<int>(mine.size())));
      did = "drop on " + std::to_string(w);
    }
    net.settle();
    check(did);
    for (int n = rnd(4); n > 0 && failure.empty(); --n) {
      net.step(true);
      check("a network event");
    }
  }
  // Everything goes; the network drains (an RRef still in flight lands in a
  // handle, which goes too).
  for (int round = 0; failure.empty(); ++round) {
    bool any = false;
    for (auto& hs : handles) {
      any = any || !hs.empty();
      hs.clear();
    }
    if (!any && net.in_flight() == 0)
      break;
    if (round > 100000)
      return "the network did not drain";
    net.settle();
    check("the last handles dropped");
    if (failure.empty() && net.in_flight() > 0) {
      net.step(true);
      check("a network event");
    }
  }
  if (!failure.empty())
    return failure;
  if (!net.drain())
    return "the network did not drain";
  for (auto& hs : handles)
    if (!hs.empty())
      return "an RRef arrived after the network drained";
  for (auto& f : fetches) {
    if (!f.value.is_ready())
      return "a to_here of R" + f.id.str() + " on worker " + std::to_string(f.worker) + " never completed";
    try {
      const int got = f.value.get();
      if (got != f.expected)
        return "a to_here of R" + f.id.str() + " got " + std::to_string(got) + ", not " + std::to_string(f.expected);
    } catch (const std::exception& e) {
      return "a to_here of R" + f.id.str() + " failed: " + e.what();
    }
  }
  fetches.clear();
  net.settle();
  for (int r = 0; r < workers; ++r)
    if (!net.tracker(r).empty()) {
      std::string left;
      for (auto& s : net.tracker(r).alive())
        left += " " + s + ";";
      auto i = net.tracker(r).info();
      return "worker " + std::to_string(r) + " still holds:" + left + " (unacked " + std::to_string(i.unacked) +
             ", pending children " + std::to_string(i.pending_children) + ")";
    }
  return {};
}

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

} // namespace

BOOST_AUTO_TEST_SUITE(rref_simulation)

BOOST_AUTO_TEST_CASE(random_programs_keep_the_invariants, *utf::timeout(600)) {
  constexpr int actions = 60;
  if (const char* one = std::getenv("CORODIST_RREF_SEED")) {
    const auto seed = std::strtoull(one, nullptr, 10);
    const auto f = run_seed(seed, actions);
    BOOST_TEST(f.empty(), "seed " << seed << ": " << f);
    return;
  }
  const auto seeds = env_number("CORODIST_RREF_SEEDS", 10000);
  std::uint64_t failed = 0;
  for (std::uint64_t seed = 1; seed <= seeds && failed < 5; ++seed) {
    const auto f = run_seed(seed, actions);
    if (!f.empty()) {
      ++failed;
      BOOST_ERROR("seed " << seed << ": " << f << "\n  replay: CORODIST_RREF_SEED=" << seed
                          << " build/tests/test_rref --run_test=rref_simulation");
    }
  }
  BOOST_TEST_MESSAGE(seeds << " schedules, " << failed << " failed");
}

// The checks catch a protocol bug: with G2 broken on purpose (a user that forks
// an RRef does not hold its own until the child is confirmed), some schedule
// among the first thousands shows an owner deleting a value that is still
// referenced.
BOOST_AUTO_TEST_CASE(the_checks_catch_a_broken_g2, *utf::timeout(600)) {
  struct restore {
    ~restore() { rr::detail::break_g2_for_tests = false; }
  } on_exit;
  rr::detail::break_g2_for_tests = true;
  const auto seeds = env_number("CORODIST_RREF_SEEDS", 10000);
  std::uint64_t caught_at = 0;
  std::string what;
  for (std::uint64_t seed = 1; seed <= seeds && !caught_at; ++seed)
    if (auto f = run_seed(seed, 60); !f.empty()) {
      caught_at = seed;
      what = f;
    }
  BOOST_TEST(caught_at != 0u, "no schedule of " << seeds << " caught the broken G2");
  BOOST_TEST(what.find("deleted") != std::string::npos, "caught, but not as an early delete: " << what);
  BOOST_TEST_MESSAGE("the broken G2 was caught by seed " << caught_at << ": " << what);
}

BOOST_AUTO_TEST_SUITE_END()
