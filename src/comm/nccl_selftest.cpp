// One rank of `dsv41kv nccl-check` (see nccl_selftest.hpp). The GPU part needs
// DSV41KV_WITH_NCCL; the host-only part (rendezvous, kill) is always built.
#include "dsv41kv/nccl_selftest.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <vector>

#include "comm/rendezvous.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/nccl_comm.hpp"

#if defined(DSV41KV_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace dsv41kv::comm {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

uint64_t fnv1a(const std::vector<uint8_t>& b) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}


std::vector<uint8_t> rendezvous_blob(const WorkerEnv& env, std::vector<uint8_t> blob0,
                                     std::chrono::milliseconds timeout) {
  if (env.world == 1) return blob0;
  return rendezvous(parse_rendezvous_address(env.rendezvous), env.rank, env.world, blob0, timeout);
}

int host_only_rank(const WorkerEnv& env, const NcclCheckOptions& o) {
  if (env.rank == o.kill_rank) kill_self(env, "before the rendezvous");
  std::vector<uint8_t> blob;
  if (env.rank == 0) {
    std::random_device rd;
    blob.resize(kUniqueIdBytes);
    for (auto& b : blob) b = static_cast<uint8_t>(rd());
  }
  const auto t0 = Clock::now();
  blob = rendezvous_blob(env, blob, o.timeout);
  std::printf("rank %d/%d: rendezvous ok via %s in %.1f ms, unique id %zu bytes, fnv1a %016llx\n", env.rank,
              env.world, env.world == 1 ? "(none, world 1)" : env.rendezvous.c_str(), ms_since(t0), blob.size(),
              static_cast<unsigned long long>(fnv1a(blob)));
  std::printf("rank %d/%d: OK (host only: no GPU, no NCCL)\n", env.rank, env.world);
  return 0;
}

#if defined(DSV41KV_WITH_NCCL)

#define CHECK_CUDA(expr)                                                                            \
  do {                                                                                              \
    const cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess)                                                                          \
      fail(ErrorCode::kCuda, fmt::format("rank {}/{}: {}: {}", env.rank, env.world, #expr,          \
                                         cudaGetErrorString(e_)));                                  \
  } while (0)

inline uint8_t pattern(int rank, int tag, size_t i) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ (static_cast<uint32_t>(rank) * 0x9E3779B9u) ^
               (static_cast<uint32_t>(tag) * 0x85EBCA6Bu) ^ static_cast<uint32_t>(i >> 32);
  x ^= x >> 15;
  return static_cast<uint8_t>(x ^ (x >> 8));
}

// Freed only on the success path: after a communicator failure, kernels of the aborted
// communicator may still sit on the stream and cudaFree would synchronise with them; the
// failing process leaves through _exit instead (run_nccl_check_rank).
struct Buffers {
  uint8_t* d_send = nullptr;
  uint8_t* d_recv = nullptr;
  uint8_t* h_buf = nullptr;  // pinned, P * N
  void release() {
    if (d_send) cudaFree(d_send);
    if (d_recv) cudaFree(d_recv);
    if (h_buf) cudaFreeHost(h_buf);
    d_send = d_recv = h_buf = nullptr;
  }
};

int gpu_rank(const WorkerEnv& env, const NcclCheckOptions& o) {
  const int P = env.world;
  const size_t N = static_cast<size_t>(o.bytes);
  const std::string me = fmt::format("rank {}/{}", env.rank, P);
  CHECK_CUDA(cudaSetDevice(env.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, env.device));

  const auto t0 = Clock::now();
  const std::vector<uint8_t> id = nccl_worker_unique_id(env, o.timeout);
  const double rdzv_ms = ms_since(t0);
  const auto t1 = Clock::now();
  // Deliberately not destroyed on the failure path (see Buffers).
  auto* comm_owned = new NcclCommunicator(env.rank, P, id, env.device, o.timeout);
  NcclCommunicator& comm = *comm_owned;
  std::printf("%s: device %d (%s), %s, rendezvous %.1f ms via %s, communicator init %.1f ms\n", me.c_str(),
              env.device, prop.name, nccl_version_string().c_str(), rdzv_ms,
              P == 1 ? "(none)" : env.rendezvous.c_str(), ms_since(t1));
  std::fflush(stdout);

  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const ExecContext ctx{stream, 0};
  Buffers b;
  CHECK_CUDA(cudaMalloc(&b.d_send, std::max<size_t>(N, 1)));
  CHECK_CUDA(cudaMalloc(&b.d_recv, std::max<size_t>(N * static_cast<size_t>(P), 1)));
  CHECK_CUDA(cudaMallocHost(&b.h_buf, std::max<size_t>(N * static_cast<size_t>(P), 1)));

  auto fill_send = [&](int tag, uint8_t* dst) {
    for (size_t i = 0; i < N; ++i) b.h_buf[i] = pattern(env.rank, tag, i);
    CHECK_CUDA(cudaMemcpyAsync(dst, b.h_buf, N, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));  // h_buf is reused below
  };
  auto poison_recv = [&] { CHECK_CUDA(cudaMemsetAsync(b.d_recv, 0xEE, N * static_cast<size_t>(P), stream)); };
  int64_t mismatches_total = 0;
  auto verify = [&](int tag, const char* what) {
    CHECK_CUDA(cudaMemcpyAsync(b.h_buf, b.d_recv, N * static_cast<size_t>(P), cudaMemcpyDeviceToHost, stream));
    comm.wait(stream);
    int64_t bad = 0;
    for (int k = 0; k < P; ++k)
      for (size_t i = 0; i < N; ++i) {
        const uint8_t got = b.h_buf[static_cast<size_t>(k) * N + i];
        const uint8_t want = pattern(k, tag, i);
        if (got != want && bad++ == 0)
          std::fprintf(stderr, "%s: %s: first mismatch at source rank %d byte %zu: got 0x%02x, want 0x%02x\n",
                       me.c_str(), what, k, i, got, want);
      }
    mismatches_total += bad;
    std::printf("%s: %s: %s (%zu bytes checked)\n", me.c_str(), what,
                bad ? fmt::format("{} bytes differ", bad).c_str() : "identical", N * static_cast<size_t>(P));
  };
  auto report = [&](const char* what, double ms_total, int n) {
    const double s = ms_total / 1e3 / n;
    const double algbw = static_cast<double>(N) * P / s / 1e9;
    const double busbw = algbw * (P - 1) / P;
    std::printf("%s: %s: %zu B/rank x %d calls: %.2f us/call, algbw %.2f GB/s, busbw %.2f GB/s\n", me.c_str(),
                what, N, n, s * 1e6, algbw, busbw);
  };

  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));

  // 1. Eager: warm up (connection setup), verify, then the timed loop (kill point inside).
  fill_send(1, b.d_send);
  for (int w = 0; w < std::max(o.warmup, 1); ++w) {
    poison_recv();
    comm.all_gather(b.d_send, N, b.d_recv, Device::CUDA, ctx);
  }
  verify(1, "eager all_gather");
  comm.barrier();
  CHECK_CUDA(cudaEventRecord(e0, stream));
  for (int it = 0; it < o.iters; ++it) {
    if (env.rank == o.kill_rank && it == o.kill_after) {
      comm.wait(stream);
      kill_self(env, fmt::format("before timed eager all_gather {} of {}", it, o.iters).c_str());
    }
    comm.all_gather(b.d_send, N, b.d_recv, Device::CUDA, ctx);
  }
  CHECK_CUDA(cudaEventRecord(e1, stream));
  comm.wait(stream);
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  report("eager", ms, o.iters);

  // 2. In place: this rank's data already sits in its own segment of recv.
  poison_recv();
  fill_send(2, b.d_recv + static_cast<size_t>(env.rank) * N);
  comm.all_gather(b.d_recv + static_cast<size_t>(env.rank) * N, N, b.d_recv, Device::CUDA, ctx);
  verify(2, "in-place all_gather");

  // 3. Zero bytes per rank: still a collective, completes.
  comm.all_gather(nullptr, 0, nullptr, Device::CUDA, ctx);
  comm.wait(stream);

  // 4. CUDA graph: capture one all_gather, replay with new send contents each time.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    comm.all_gather(b.d_send, N, b.d_recv, Device::CUDA, ctx);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    throw;
  }
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const Communicator::Counters one = {1, N, N * static_cast<uint64_t>(P)};
  comm.barrier();
  for (int tag : {3, 4}) {
    fill_send(tag, b.d_send);
    poison_recv();
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    comm.add_to_counters(one);
    verify(tag, tag == 3 ? "graph all_gather (replay 1)" : "graph all_gather (replay 2)");
  }
  comm.barrier();
  CHECK_CUDA(cudaEventRecord(e0, stream));
  for (int it = 0; it < o.iters; ++it) {
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    comm.add_to_counters(one);
  }
  CHECK_CUDA(cudaEventRecord(e1, stream));
  comm.wait(stream);
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  report("graph", ms, o.iters);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  comm.barrier();
  const auto c = comm.counters();
  std::printf("%s: NCCL counters: %llu all_gather calls, %llu B sent, %llu B received\n", me.c_str(),
              static_cast<unsigned long long>(c.calls), static_cast<unsigned long long>(c.bytes_sent),
              static_cast<unsigned long long>(c.bytes_received));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  b.release();
  delete comm_owned;  // finalize + destroy, bounded by the timeout
  if (mismatches_total) {
    std::fprintf(stderr, "%s: error: %lld bytes differ from the expected gather\n", me.c_str(),
                 static_cast<long long>(mismatches_total));
    return 1;
  }
  std::printf("%s: OK\n", me.c_str());
  return 0;
}
#undef CHECK_CUDA

#endif  // DSV41KV_WITH_NCCL

}  // namespace

int visible_cuda_devices(std::string* why) {
#if defined(DSV41KV_WITH_CUDA)
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  return n;
#else
  if (why) *why = "built without CUDA";
  return 0;
#endif
}

std::vector<uint8_t> nccl_worker_unique_id(const WorkerEnv& env, std::chrono::milliseconds timeout) {
  // NVLink multicast stays off unless the caller asked for it (shared machines, see docs).
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<uint8_t> id = env.rank == 0 ? NcclCommunicator::create_unique_id() : std::vector<uint8_t>{};
  return rendezvous_blob(env, std::move(id), timeout);
}

int run_nccl_check_rank(const WorkerEnv& env, const NcclCheckOptions& o) {
  const std::string me = fmt::format("rank {}/{}", env.rank, env.world);
  try {
    if (o.host_only) return host_only_rank(env, o);
#if defined(DSV41KV_WITH_NCCL)
    return gpu_rank(env, o);
#else
    std::fprintf(stderr, "%s: error: this build has no NCCL (%s); nothing to check (use --host-only for the "
                         "rendezvous alone)\n", me.c_str(), nccl_version_string().c_str());
    return 2;
#endif
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", me.c_str(), e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    const int code = e.code() == ErrorCode::kComm || e.code() == ErrorCode::kCuda ? 1 : 2;
    // A GPU rank that failed may hold kernels of an aborted communicator: leave without
    // running CUDA teardown (which could wait for them); the driver reclaims the context.
    if (!o.host_only) ::_exit(code);
    return code;
  }
}

[[noreturn]] void kill_self(const WorkerEnv& env, const char* where) {
  std::printf("rank %d/%d: --kill-rank: killing myself (SIGKILL) %s\n", env.rank, env.world, where);
  std::fflush(stdout);
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);  // not reached
}

}  // namespace dsv41kv::comm
