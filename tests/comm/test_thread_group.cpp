// ThreadGroup: rank-major all-gather, barrier, counters, and failure reporting instead of hangs.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "dsv41kv/comm.hpp"

using namespace dsv41kv;
using namespace std::chrono_literals;

namespace {

void expect_comm_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kComm) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(ThreadGroup, AllGatherIsRankMajorForEverySizeAndLength) {
  for (int P : {1, 2, 3, 8}) {
    ThreadGroup g(P);
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}}) {
      std::vector<std::vector<uint8_t>> recv(static_cast<size_t>(P));
      g.run([&](Communicator& c) {
        ASSERT_EQ(c.size(), P);
        std::vector<uint8_t> send(n);
        for (size_t i = 0; i < n; ++i) send[i] = static_cast<uint8_t>(c.rank() * 31 + i);
        auto& out = recv[static_cast<size_t>(c.rank())];
        out.assign(n * static_cast<size_t>(P), 0xEE);
        c.all_gather(send.data(), n, out.data());
      });
      for (int r = 0; r < P; ++r)
        for (int k = 0; k < P; ++k)
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(recv[static_cast<size_t>(r)][static_cast<size_t>(k) * n + i], static_cast<uint8_t>(k * 31 + i))
                << "P " << P << " n " << n << " receiver " << r << " source " << k;
    }
  }
}

TEST(ThreadGroup, InPlaceGatherAndRepeatedCallsAndCounters) {
  const int P = 4;
  ThreadGroup g(P);
  std::vector<std::vector<int64_t>> bufs(P, std::vector<int64_t>(P * 3));
  g.run([&](Communicator& c) {
    auto& b = bufs[static_cast<size_t>(c.rank())];
    for (int rep = 0; rep < 50; ++rep) {
      for (int i = 0; i < 3; ++i) b[static_cast<size_t>(c.rank() * 3 + i)] = rep * 1000 + c.rank() * 10 + i;
      c.all_gather(b.data() + c.rank() * 3, 3 * sizeof(int64_t), b.data());
      for (int k = 0; k < P; ++k)
        for (int i = 0; i < 3; ++i) ASSERT_EQ(b[static_cast<size_t>(k * 3 + i)], rep * 1000 + k * 10 + i);
      c.barrier();
    }
  });
  for (int k = 0; k < P; ++k) {
    const auto ctr = g.comm(k).counters();
    EXPECT_EQ(ctr.calls, 50u);
    EXPECT_EQ(ctr.bytes_sent, 50u * 24u);
    EXPECT_EQ(ctr.bytes_received, 50u * 24u * P);
  }
}

TEST(ThreadGroup, BarrierOrdersWrites) {
  const int P = 3;
  ThreadGroup g(P);
  std::vector<int> slot(P, 0);
  std::atomic<int> bad{0};
  g.run([&](Communicator& c) {
    for (int rep = 1; rep <= 100; ++rep) {
      slot[static_cast<size_t>(c.rank())] = rep;
      c.barrier();
      for (int k = 0; k < P; ++k)
        if (slot[static_cast<size_t>(k)] != rep) ++bad;
      c.barrier();
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(ThreadGroup, SizeMismatchFailsOnEveryRankWithKComm) {
  ThreadGroup g(3, 5s);
  std::atomic<int> failures{0};
  expect_comm_error(
      [&] {
        g.run([&](Communicator& c) {
          std::vector<uint8_t> send(8 + static_cast<size_t>(c.rank())), recv(64);
          try {
            c.all_gather(send.data(), send.size(), recv.data());
          } catch (const Error& e) {
            if (e.code() == ErrorCode::kComm) ++failures;
            throw;
          }
        });
      },
      "bytes_per_rank differ");
  EXPECT_EQ(failures.load(), 3);
}

TEST(ThreadGroup, TimeoutNamesTheRankThatDidNotArrive) {
  ThreadGroup g(3, 150ms);
  const auto t0 = std::chrono::steady_clock::now();
  expect_comm_error(
      [&] {
        g.run([&](Communicator& c) {
          if (c.rank() == 2) std::this_thread::sleep_for(600ms);
          c.barrier();
        });
      },
      "rank(s) 2 did not arrive");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(ThreadGroup, RankThatLeavesEarlyIsReportedWithoutWaitingForTheTimeout) {
  ThreadGroup g(2, 30s);
  const auto t0 = std::chrono::steady_clock::now();
  expect_comm_error(
      [&] {
        g.run([&](Communicator& c) {
          if (c.rank() == 0) c.barrier();  // rank 1 returns without calling it
        });
      },
      "rank(s) 1 (returned) left the group");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(ThreadGroup, A_RanksOwnExceptionWinsAndTheGroupIsReusable) {
  ThreadGroup g(4, 30s);
  try {
    g.run([&](Communicator& c) {
      if (c.rank() == 3) invalid_argument("rank 3 broke");
      c.barrier();
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "E8: rank 3 broke");
  }
  // The next run works normally.
  std::vector<int> got(4 * 4, -1);
  g.run([&](Communicator& c) {
    int v = c.rank() + 100;
    std::vector<int> out(4);
    c.all_gather(&v, sizeof v, out.data());
    std::memcpy(got.data() + c.rank() * 4, out.data(), sizeof(int) * 4);
  });
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 4; ++k) EXPECT_EQ(got[static_cast<size_t>(r * 4 + k)], k + 100);
}

TEST(ThreadGroup, RejectsDeviceBuffersAndBadArguments) {
  ThreadGroup g(1);
  EXPECT_TRUE(g.comm(0).supports(Device::CPU));
  EXPECT_FALSE(g.comm(0).supports(Device::CUDA));
  int x = 0, y = 0;
  try {
    g.comm(0).all_gather(&x, sizeof x, &y, Device::CUDA);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("host buffers only"), std::string::npos);
  }
  EXPECT_THROW(ThreadGroup(0), Error);
  EXPECT_THROW(ThreadGroup(2, 0ms), Error);
  EXPECT_THROW(g.comm(1), Error);
}
