// examples/ft_train.cpp as a job (tests/ft/ft_job.hpp): four replica
// processes; one is killed or hung mid-run, the others go on at three, it is
// restarted, rejoins and catches up; at the end every replica's weights and
// momentum are bit-equal, and equal to a replay of the committed steps.
#include <boost/test/unit_test.hpp>

#include "ft/ft_job.hpp"

#include <csignal>

using corodist::test::committed_steps;
using corodist::test::ft_job;

BOOST_AUTO_TEST_SUITE(ft_train)

BOOST_AUTO_TEST_CASE(a_killed_replica_rejoins_and_all_end_bit_equal) {
  ft_job j(4, 40, 20);
  j.start_all();
  j.await_line(2, "committed 10 ");
  ::kill(j.ps[2]->pid(), SIGKILL);
  BOOST_TEST(j.ps[2]->wait(std::chrono::seconds(30)) == -1);
  // The others go on at three before it is back.
  j.await_line(0, "quorum ", " left r2");
  j.start(2);
  j.await_line(2, "quorum ", " recovered");
  j.finish();
  auto steps0 = committed_steps(j.done_output[0]);
  BOOST_TEST(steps0.rbegin()->first == 39);
  int at_three = 0;
  for (auto& [s, members] : steps0) at_three += members.find("r2") == std::string::npos;
  BOOST_TEST(at_three > 0);
  BOOST_TEST(steps0.rbegin()->second == "r0,r1,r2,r3");
  BOOST_TEST(j.done_output[2].find("recovered") != std::string::npos);
  // The restarted replica committed only steps after it came back.
  auto steps2 = committed_steps(j.done_output[2]);
  BOOST_TEST(!steps2.empty());
  BOOST_TEST(steps2.begin()->first > 10);
  j.check_equal_and_replayed();
}

BOOST_AUTO_TEST_CASE(a_hung_replica_is_left_behind_and_restarted) {
  ft_job j(4, 40, 20);
  j.start_all();
  j.await_line(1, "committed 5 ");
  ::kill(j.ps[1]->pid(), SIGSTOP);
  j.await_line(0, "quorum ", " left r1"); // the others found it lost (heartbeat deadline) and went on
  ::kill(j.ps[1]->pid(), SIGCONT);
  // Its store connection was closed meanwhile: it fails, and is restarted.
  BOOST_TEST(j.ps[1]->wait(std::chrono::seconds(60)) != 0);
  j.start(1);
  j.finish();
  BOOST_TEST(j.done_output[1].find("recovered") != std::string::npos);
  j.check_equal_and_replayed();
}

BOOST_AUTO_TEST_SUITE_END()
