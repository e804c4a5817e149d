#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/cpu/shm_transport.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(ShmTransport, PutThenSignalIsVisibleAfterTheWait) {
  cpu::ShmTransport t(2, 5s);
  const int buffer = t.alloc_symmetric(64);
  t.resize_flags(0, 1);
  t.resize_flags(1, 3);
  std::thread sender([&] {
    const char message[] = "row band";
    t.put(0, 1, buffer, 8, message, sizeof message);
    t.signal(1, 2);
  });
  t.wait(1, 2, 1, 0, nullptr);
  EXPECT_STREQ(reinterpret_cast<const char*>(t.peer_ptr(buffer, 1) + 8), "row band");
  sender.join();
  EXPECT_EQ(t.flag_value(1, 2), 1u);
}

TEST(ShmTransport, CountersReachTheirCount) {
  cpu::ShmTransport t(1, 5s);
  t.resize_flags(0, 1);
  std::vector<std::thread> signallers;
  for (int i = 0; i < 8; ++i) signallers.emplace_back([&] { t.signal(0, 0); });
  t.wait(0, 0, 8, 0, nullptr);
  for (auto& s : signallers) s.join();
  EXPECT_EQ(t.flag_value(0, 0), 8u);
}

TEST(ShmTransport, ATimedOutWaitNamesRankPeerAndFlag) {
  cpu::ShmTransport t(3, 50ms);
  t.resize_flags(2, 5);
  const auto start = std::chrono::steady_clock::now();
  try {
    t.wait(2, 4, 1, 1, [] { return std::string("gemm0 tile 3"); });
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout);
    EXPECT_THAT(e.what(), HasSubstr("rank 2 timed out after 50 ms waiting for rank 1: flag 4 reached 0 of 1 signals (gemm0 tile 3)"));
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 50ms);
  EXPECT_LT(took, 2s);
}

TEST(ShmTransport, AbortReleasesWaitersFast) {
  cpu::ShmTransport t(2, 30s);
  t.resize_flags(0, 1);
  std::thread aborter([&] {
    std::this_thread::sleep_for(20ms);
    t.abort();
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    t.wait(0, 0, 1, 1, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(cpu::is_abort_error(e));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  aborter.join();
}

TEST(ShmTransport, BarrierMeetsAndTimesOut) {
  cpu::ShmTransport t(2, 5s);
  std::thread other([&] { t.barrier(1); });
  t.barrier(0);
  other.join();
  cpu::ShmTransport lonely(2, 30ms);
  try {
    lonely.barrier(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout);
    EXPECT_THAT(e.what(), HasSubstr("barrier"));
  }
}

TEST(ShmTransport, PutOutOfBoundsIsAnError) {
  cpu::ShmTransport t(2, 1s);
  const int buffer = t.alloc_symmetric(16);
  char bytes[32] = {};
  EXPECT_THROW(t.put(0, 1, buffer, 8, bytes, 16), Error);
  t.resize_flags(1, 1);
  EXPECT_THROW(t.signal(1, 1), Error);
}

TEST(ShmTransport, LinkEmulationPacesRemotePuts) {
  cpu::ShmTransport t(2, 5s);
  t.set_link_rate(1e6);  // 1 MB/s: 20 KB take 20 ms
  const int buffer = t.alloc_symmetric(20000);
  std::vector<char> bytes(20000, 1);
  const auto start = std::chrono::steady_clock::now();
  t.put(0, 1, buffer, 0, bytes.data(), bytes.size());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 19ms);
  const auto local = std::chrono::steady_clock::now();
  t.put(1, 1, buffer, 0, bytes.data(), bytes.size());  // to itself: no link
  EXPECT_LT(std::chrono::steady_clock::now() - local, 15ms);
}

TEST(ShmTransport, ALinkSendLongerThanTheWaitBoundIsRefusedAtOnce) {
  // the link emulation used to sleep without a deadline: 1e-9 MB/s hung the step
  for (const double rate : {1e-3, 1e-300}) {
    cpu::ShmTransport t(2, 100ms);
    t.set_link_rate(rate);
    const int buffer = t.alloc_symmetric(64);
    std::vector<char> bytes(64, 1);
    const auto start = std::chrono::steady_clock::now();
    try {
      t.put(0, 1, buffer, 0, bytes.data(), bytes.size());
      FAIL() << rate;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      EXPECT_THAT(e.what(), HasSubstr("longer than the wait bound of 100 ms: raise --link-mbps"));
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 50ms);
  }
  // sends queued on one link add up: of two 90 ms sends started together, the second would end
  // 180 ms from now, past the bound
  cpu::ShmTransport t(2, 100ms);
  t.set_link_rate(1e6);
  const int buffer = t.alloc_symmetric(90000);
  std::vector<char> bytes(90000, 1);
  std::atomic<int> refused{0};
  auto send = [&] {
    try {
      t.put(0, 1, buffer, 0, bytes.data(), bytes.size());
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      ++refused;
    }
  };
  std::thread first(send), second(send);
  first.join();
  second.join();
  EXPECT_EQ(refused.load(), 1);
}

TEST(ShmTransport, ALinkSleepEndsWhenTheStepAborts) {
  cpu::ShmTransport t(2, 10s);
  t.set_link_rate(1e4);  // 10 KB/s: 50 KB take 5 s
  const int buffer = t.alloc_symmetric(50000);
  std::vector<char> bytes(50000, 1);
  std::thread aborter([&] {
    std::this_thread::sleep_for(20ms);
    t.abort();
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    t.put(0, 1, buffer, 0, bytes.data(), bytes.size());
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_TRUE(cpu::is_abort_error(e)) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  aborter.join();
}

TEST(ShmTransport, WaitBoundsPastADayAreRefused) {
  EXPECT_THROW(cpu::ShmTransport(2, std::chrono::hours(25)), Error);
  EXPECT_THROW(cpu::ShmTransport(2, std::chrono::nanoseconds::max()), Error);
  cpu::ShmTransport ok(2, std::chrono::hours(24));
  EXPECT_EQ(ok.timeout(), std::chrono::hours(24));
}
