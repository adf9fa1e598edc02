// NcclCommunicator in one process: P ranks as threads, one GPU each (NCCL allows one
// communicator per thread). Skips with a message without NCCL or with fewer GPUs than needed.
// The failure tests need only one GPU: a world of 2 in which rank 1 never joins.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "dsv41kv/nccl_selftest.hpp"
#include "dsv41kv/nccl_comm.hpp"

#if defined(DSV41KV_WITH_NCCL)
#include <cuda_runtime.h>
#endif

using namespace dsv41kv;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

[[maybe_unused]] int gpus() { return comm::visible_cuda_devices(nullptr); }

#define REQUIRE_GPUS(n)                                                                   \
  do {                                                                                    \
    if (!nccl_available()) GTEST_SKIP() << "built without NCCL (DSV41KV_NCCL=OFF)";       \
    if (gpus() < (n)) GTEST_SKIP() << "needs " << (n) << " GPU(s), " << gpus() << " visible"; \
  } while (0)

}  // namespace

TEST(NcclComm, WithoutNcclEveryUseIsE4) {
  if (nccl_available()) GTEST_SKIP() << "built with " << nccl_version_string();
  EXPECT_EQ(nccl_version_string(), "built without NCCL");
  try {
    NcclCommunicator c(0, 1, std::vector<uint8_t>(128), 0);
    FAIL() << "constructed without NCCL";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackendUnsupported) << e.what();
  }
  EXPECT_THROW(NcclCommunicator::create_unique_id(), Error);
}

#if defined(DSV41KV_WITH_NCCL)

namespace {

void run_ranks(int P, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  std::vector<std::string> errors(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < P; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace

TEST(NcclComm, AllGatherIsRankMajorEagerInPlaceAndInAGraph) {
  REQUIRE_GPUS(1);
  const int P = std::min(gpus(), 4);
  const auto id = NcclCommunicator::create_unique_id();
  ASSERT_EQ(id.size(), 128u);
  run_ranks(P, [&](int r) {
    NcclCommunicator c(r, P, id, r, 60s);
    ASSERT_EQ(c.rank(), r);
    ASSERT_EQ(c.size(), P);
    EXPECT_TRUE(c.supports(Device::CUDA));
    EXPECT_FALSE(c.supports(Device::CPU));
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    for (size_t n : {size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20}) {
      std::vector<uint8_t> hs(n), hr(n * P);
      for (size_t i = 0; i < n; ++i) hs[i] = static_cast<uint8_t>(r * 37 + i * 11);
      uint8_t *ds, *dr;
      ASSERT_EQ(cudaMalloc(&ds, n), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dr, n * P), cudaSuccess);
      cudaMemcpy(ds, hs.data(), n, cudaMemcpyHostToDevice);
      auto check = [&](int tag) {
        cudaMemcpyAsync(hr.data(), dr, n * P, cudaMemcpyDeviceToHost, s);
        c.wait(s);
        for (int k = 0; k < P; ++k)
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(hr[k * n + i], static_cast<uint8_t>(k * 37 + i * 11 + tag)) << "n " << n << " src " << k;
      };
      cudaMemsetAsync(dr, 0xEE, n * P, s);
      c.all_gather(ds, n, dr, Device::CUDA, {s, 0});
      check(0);
      // In place.
      cudaMemsetAsync(dr, 0xEE, n * P, s);
      cudaMemcpyAsync(dr + r * n, ds, n, cudaMemcpyDeviceToDevice, s);
      c.all_gather(dr + r * n, n, dr, Device::CUDA, {s, 0});
      check(0);
      // Captured into a graph, replayed with new contents.
      cudaGraph_t g;
      cudaGraphExec_t ge;
      ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      c.all_gather(ds, n, dr, Device::CUDA, {s, 0});
      ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
      for (size_t i = 0; i < n; ++i) hs[i] = static_cast<uint8_t>(hs[i] + 1);
      cudaMemcpyAsync(ds, hs.data(), n, cudaMemcpyHostToDevice, s);
      cudaMemsetAsync(dr, 0xEE, n * P, s);
      ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
      check(1);
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
      cudaFree(ds);
      cudaFree(dr);
    }
    c.all_gather(nullptr, 0, nullptr, Device::CUDA, {s, 0});
    c.wait(s);
    c.barrier();
    const auto k = c.counters();
    EXPECT_EQ(k.calls, 4u * 3u + 1u);
    EXPECT_EQ(k.bytes_sent, (1u + 7u + 4096u + (1u << 20)) * 3u);
    EXPECT_EQ(k.bytes_received, k.bytes_sent * static_cast<uint64_t>(P));
    EXPECT_THROW(c.all_gather(nullptr, 0, nullptr, Device::CPU), Error);
    cudaStreamDestroy(s);
  });
}

TEST(NcclComm, InitTimesOutNamingTheRankWhenAPeerNeverJoins) {
  REQUIRE_GPUS(1);
  const auto id = NcclCommunicator::create_unique_id();
  const auto t0 = Clock::now();
  try {
    NcclCommunicator c(0, 2, id, 0, 2s);
    FAIL() << "init of a world of 2 completed with one rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kComm) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2000 ms"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0 + 10.0);
}

TEST(NcclComm, AStalledPeerMakesWaitFailWithinTheTimeoutAndAbort) {
  REQUIRE_GPUS(2);
  const auto id = NcclCommunicator::create_unique_id();
  std::atomic<bool> rank0_failed{false};
  run_ranks(2, [&](int r) {
    NcclCommunicator c(r, 2, id, r, 3s);
    cudaStream_t s;
    cudaStreamCreate(&s);
    uint8_t* d;
    cudaMalloc(&d, 2 * 4096);
    c.all_gather(d + r * 4096, 4096, d, Device::CUDA, {s, 0});
    c.wait(s);
    if (r == 1) {
      // Rank 1 "dies": it never joins the next collective, then aborts once rank 0 gave up.
      for (int i = 0; i < 1000 && !rank0_failed; ++i) std::this_thread::sleep_for(10ms);
      c.abort();
    } else {
      c.all_gather(d, 4096, d, Device::CUDA, {s, 0});
      const auto t0 = Clock::now();
      try {
        c.wait(s);
        ADD_FAILURE() << "wait returned with a stalled peer";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kComm);
        EXPECT_NE(std::string(e.what()).find("rank 0 of 2"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("3000 ms"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
      }
      EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0 + 5.0);
      EXPECT_TRUE(c.aborted());
      EXPECT_THROW(c.all_gather(d, 1, d, Device::CUDA, {s, 0}), Error);
      rank0_failed = true;
    }
    cudaStreamSynchronize(s);
    cudaFree(d);
    cudaStreamDestroy(s);
  });
}

#endif  // DSV41KV_WITH_NCCL
