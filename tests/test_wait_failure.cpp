// The host side of bounded waits: the messages made from device wait records, and the
// host barrier of virtual ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/timed_barrier.hpp"
#include "comm/wait_failure.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

namespace {

comm::WaitFailure timed_out(int rank, int peer, comm::WaitSubject subject) {
  comm::WaitFailure f;
  f.state = static_cast<std::uint32_t>(comm::WaitState::TimedOut);
  f.rank = rank;
  f.peer = peer;
  f.subject = static_cast<std::uint32_t>(subject);
  f.expected = 5;
  f.seen = 4;
  f.waited_ns = 2'000'000'000;
  f.step = 5;
  return f;
}

comm::WaitFailure aborted(int rank, int peer) {
  comm::WaitFailure f = timed_out(rank, peer, comm::WaitSubject::CombineRows);
  f.state = static_cast<std::uint32_t>(comm::WaitState::Aborted);
  return f;
}

ErrorKind kind_of(const std::vector<comm::WaitFailure>& records, std::string& message) {
  try {
    comm::throw_if_failed(records);
  } catch (const Error& e) {
    message = e.what();
    return e.kind();
  }
  message.clear();
  return ErrorKind::BadInput;  // "did not throw"
}

}  // namespace

TEST(WaitFailure, DescribesWhoWaitedForWhat) {
  const std::string text = comm::describe(timed_out(0, 3, comm::WaitSubject::DispatchCounts));
  EXPECT_THAT(text, HasSubstr("rank 0 waited 2.00 s for the dispatch counts of rank 3 in step 5"));
  EXPECT_THAT(text, HasSubstr("flag at 4, wanted >= 5"));
}

TEST(WaitFailure, ClearRecordsDoNotThrow) {
  EXPECT_NO_THROW(comm::throw_if_failed(std::vector<comm::WaitFailure>(4)));
  EXPECT_NO_THROW(comm::throw_if_failed({}));
}

TEST(WaitFailure, TimeoutNamesTheRootCauseNotTheAbortedRanks) {
  std::string message;
  const std::vector<comm::WaitFailure> records = {aborted(0, 2), timed_out(1, 2, comm::WaitSubject::DispatchRows), {},
                                                  aborted(3, 1)};
  EXPECT_EQ(kind_of(records, message), ErrorKind::Timeout);
  EXPECT_THAT(message, HasSubstr("rank 1 waited"));
  EXPECT_THAT(message, HasSubstr("dispatched token rows of rank 2"));
  EXPECT_THAT(message, HasSubstr("2 other rank(s) stopped"));
  EXPECT_THAT(message, Not(HasSubstr("rank 3 stopped")));
}

TEST(WaitFailure, OnlyAbortedRecordsAreAnInternalError) {
  std::string message;
  EXPECT_EQ(kind_of({aborted(2, 0)}, message), ErrorKind::Internal);
  EXPECT_THAT(message, HasSubstr("rank 2 stopped waiting"));
}

TEST(WaitFailure, ExceededCapacityIsBadInputAndWinsOverTimeouts) {
  comm::WaitFailure f;
  f.state = static_cast<std::uint32_t>(comm::WaitState::CapacityExceeded);
  f.rank = 1;
  f.peer = 3;
  f.expected = 4096;
  f.seen = 5000;
  f.step = 2;
  std::string message;
  EXPECT_EQ(kind_of({timed_out(0, 1, comm::WaitSubject::DispatchRows), f}, message), ErrorKind::BadInput);
  EXPECT_THAT(message, HasSubstr("sends 5000 rows to rank 3, more than its receive capacity of 4096 rows"));
  EXPECT_THAT(message, HasSubstr("receive_rows"));
}

TEST(WaitFailure, UnknownStateIsAnInternalError) {
  comm::WaitFailure f;
  f.state = 77;
  std::string message;
  EXPECT_EQ(kind_of({f}, message), ErrorKind::Internal);
  EXPECT_THAT(message, HasSubstr("77"));
}

TEST(TimedBarrier, AllArriveManyTimes) {
  comm::TimedBarrier barrier(4, 5s);
  std::vector<std::thread> ranks;
  std::vector<int> rounds(4, 0);
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      for (int i = 0; i < 200; ++i) {
        barrier.arrive_and_wait(r, "the test barrier");
        ++rounds[static_cast<std::size_t>(r)];
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(rounds, std::vector<int>(4, 200));
}

TEST(TimedBarrier, MissingRankTimesOutNamingIt) {
  comm::TimedBarrier barrier(3, 200ms);
  std::vector<std::string> messages(2);
  std::vector<std::thread> ranks;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        barrier.arrive_and_wait(r, "step 1");
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::Timeout) messages[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  for (const std::string& m : messages) EXPECT_THAT(m, HasSubstr("rank(s) 2, which never arrived"));
  // broken for good: the late rank fails at once
  try {
    barrier.arrive_and_wait(2, "step 1");
    FAIL() << "a broken barrier let a rank through";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout);
    EXPECT_THAT(e.what(), HasSubstr("never arrived"));
  }
}

TEST(TimedBarrier, AbandonReleasesTheWaitersAtOnce) {
  comm::TimedBarrier barrier(2, 30s);
  std::string message;
  ErrorKind kind = ErrorKind::Internal;
  std::thread waiter([&] {
    try {
      barrier.arrive_and_wait(0, "the layer set-up");
    } catch (const Error& e) {
      message = e.what();
      kind = e.kind();
    }
  });
  std::this_thread::sleep_for(50ms);
  const auto start = std::chrono::steady_clock::now();
  barrier.abandon(1, "out of memory", ErrorKind::OutOfMemory);
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_THAT(message, HasSubstr("rank 1 failed: out of memory"));
  // the waiter's error is of the abandoning rank's kind, not a timeout; so is a later arrival's
  EXPECT_EQ(kind, ErrorKind::OutOfMemory);
  try {
    barrier.arrive_and_wait(0, "the next step");
    ADD_FAILURE() << "a broken barrier let a participant through";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
    EXPECT_THAT(e.what(), HasSubstr("rank 1 failed: out of memory"));
  }
}

TEST(TimedBarrier, RejectsBadParticipants) {
  EXPECT_THROW(comm::TimedBarrier(0, 1s), Error);
  comm::TimedBarrier barrier(1, 1s);
  EXPECT_NO_THROW(barrier.arrive_and_wait(0, "alone"));
  EXPECT_THROW(barrier.arrive_and_wait(1, "alone"), Error);
}
