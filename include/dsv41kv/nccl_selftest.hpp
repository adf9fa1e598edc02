// One rank of `dsv41kv nccl-check`: rendezvous, NcclCommunicator on GPU `device`, all-gathers
// of a rank-dependent device buffer eagerly, in place and inside a CUDA graph, each verified
// byte for byte; time per call and bus bandwidth. A host-only mode exercises the launcher and
// the rendezvous without GPU or NCCL (used by the tests on machines without GPUs).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41kv/launcher.hpp"

namespace dsv41kv::comm {

struct NcclCheckOptions {
  int64_t bytes = int64_t{4} << 20;  // per rank
  int iters = 20;
  int warmup = 3;
  std::chrono::milliseconds timeout{60000};
  int kill_rank = -1;   // this rank raises SIGKILL ...
  int kill_after = 5;   // ... before its kill_after-th timed eager all-gather (host-only: before the rendezvous)
  bool host_only = false;
};

// Runs one rank and returns its exit code: 0 verified, 1 a failure (printed to stderr as
// "rank r/P: error: ..."), 2 no NCCL/GPU in this build or process. Prints progress lines
// prefixed "rank r/P:" to stdout.
int run_nccl_check_rank(const WorkerEnv& env, const NcclCheckOptions& options);

// The NCCL unique id of a worker's world: created by rank 0 and exchanged through
// env.rendezvous when the world has more than one rank. Every NCCL worker of the project
// (nccl-check, run --launch local) starts here, so it also keeps NVLink multicast off
// (NCCL_NVLS_ENABLE=0) unless the caller's environment set it.
std::vector<uint8_t> nccl_worker_unique_id(const WorkerEnv& env, std::chrono::milliseconds timeout);

// The failure-handling checks (nccl-check --kill-rank, run --kill-rank): prints "rank r/P:
// --kill-rank: killing myself (SIGKILL) <where>" and raises SIGKILL, so the process dies as if
// killed from outside (no destructor, no NCCL teardown).
[[noreturn]] void kill_self(const WorkerEnv& env, const char* where);

// CUDA devices visible to this process (0 without CUDA); `why` gets the runtime's message
// when the query fails.
int visible_cuda_devices(std::string* why);

}  // namespace dsv41kv::comm
