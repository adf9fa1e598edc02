// NcclCommunicator (see include/dsv41kv/nccl_comm.hpp). Compiled only with DSV41KV_WITH_NCCL;
// src/comm/nccl_stub.cpp provides the same symbols otherwise.
#if defined(DSV41KV_WITH_NCCL)

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "dsv41kv/nccl_comm.hpp"

namespace dsv41kv {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

size_t zero_region_bytes(int size) { return (static_cast<size_t>(size) + 255) / 256 * 256; }

// Polling pace of the host-side waits: yields the core (no sleep) for the first 200 us, since
// most collectives and enqueues finish within that and a sleep's oversleep (tens of us to a
// scheduler tick) would become the step's latency; then sleeps 20 us doubling to 1 ms, so a
// long wait (a slow or dead peer) does not burn a core. (Why it changed from sleeps alone:
// docs/changelog.md, Multi-GPU runs.)
struct Backoff {
  Clock::time_point start = Clock::now();
  std::chrono::microseconds d{20};
  void operator()() {
    if (Clock::now() - start < std::chrono::microseconds(200)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(d);
    d = std::min(d * 2, std::chrono::microseconds(1000));
  }
};

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = fmt::format("{} ({})", ncclGetErrorString(r), static_cast<int>(r));
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += fmt::format(": {}", last);
  return s;
}

}  // namespace

bool nccl_available() { return true; }

std::string nccl_version_string() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  return fmt::format("NCCL {}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

std::vector<uint8_t> NcclCommunicator::create_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    fail(ErrorCode::kComm, fmt::format("ncclGetUniqueId failed: {}", nccl_text(r, nullptr)));
  static_assert(sizeof(id.internal) == 128, "ncclUniqueId is 128 bytes");
  return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(id.internal),
                              reinterpret_cast<const uint8_t*>(id.internal) + sizeof(id.internal));
}

NcclCommunicator::NcclCommunicator(int rank, int size, const std::vector<uint8_t>& unique_id, int device,
                                   milliseconds timeout)
    : rank_(rank), size_(size), device_(device), timeout_(timeout) {
  if (size < 1) invalid_argument(fmt::format("NcclCommunicator: size {} must be >= 1", size));
  if (rank < 0 || rank >= size)
    invalid_argument(fmt::format("NcclCommunicator: rank {} out of range [0, {})", rank, size));
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES)
    invalid_argument(fmt::format("NcclCommunicator: rank {}: unique id has {} bytes, expected {}", rank,
                                 unique_id.size(), NCCL_UNIQUE_ID_BYTES));
  if (timeout.count() <= 0)
    invalid_argument(fmt::format("NcclCommunicator: rank {}: timeout {} ms must be positive", rank, timeout.count()));
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || device < 0 || device >= count)
    fail(ErrorCode::kComm, fmt::format("NcclCommunicator: rank {}: CUDA device {} not available ({} visible{}{})",
                                       rank, device, ce == cudaSuccess ? count : 0,
                                       ce == cudaSuccess ? "" : ": ", ce == cudaSuccess ? "" : cudaGetErrorString(ce)));
  auto cuda_or_fail = [&](cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    if (scratch_) cudaFree(scratch_);
    if (own_stream_) cudaStreamDestroy(as_stream(own_stream_));
    scratch_ = own_stream_ = nullptr;
    fail(ErrorCode::kCuda, fmt::format("NcclCommunicator: rank {} (device {}): {}: {}: {}", rank, device, what,
                                       cudaGetErrorName(e), cudaGetErrorString(e)));
  };
  cuda_or_fail(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s = nullptr;
  cuda_or_fail(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  own_stream_ = s;
  cuda_or_fail(cudaMalloc(&scratch_, zero_region_bytes(size) + 4 * static_cast<size_t>(size)), "cudaMalloc(scratch)");
  // on the communicator's own (non-blocking) stream, waited for: a plain cudaMemset runs on the
  // legacy stream, which does not order that stream, and may return before the zeros land
  cuda_or_fail(cudaMemsetAsync(scratch_, 0, zero_region_bytes(size) + 4 * static_cast<size_t>(size), s),
               "cudaMemsetAsync(scratch)");
  cuda_or_fail(cudaStreamSynchronize(s), "cudaStreamSynchronize(scratch)");

  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "dsv41kv";
  ncclComm_t comm = nullptr;
  const auto deadline = Clock::now() + timeout;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &cfg);
  auto cleanup = [&] {
    if (comm) ncclCommAbort(comm);
    cudaFree(scratch_);
    cudaStreamDestroy(as_stream(own_stream_));
    scratch_ = own_stream_ = nullptr;
  };
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string text = nccl_text(r, comm);
    cleanup();
    fail(ErrorCode::kComm, fmt::format("rank {}: ncclCommInitRankConfig (world {}, device {}) failed: {}", rank,
                                       size, device, text));
  }
  Backoff backoff;
  ncclResult_t state = ncclInProgress;
  for (;;) {
    r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclInProgress) break;
    if (Clock::now() >= deadline) {
      cleanup();
      fail(ErrorCode::kComm,
           fmt::format("rank {}: ncclCommInitRankConfig (world {}, device {}) did not complete within {} ms: "
                       "a peer did not join (dead, not started, or given another unique id); "
                       "communicator aborted", rank, size, device, timeout.count()));
    }
    backoff();
  }
  if (state != ncclSuccess) {
    const std::string text = nccl_text(state, comm);
    cleanup();
    fail(ErrorCode::kComm, fmt::format("rank {}: ncclCommInitRankConfig (world {}, device {}) failed: {}", rank,
                                       size, device, text));
  }
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  try {
    cudaSetDevice(device_);
    if (comm_ && !aborted_) {
      ncclComm_t comm = as_comm(comm_);
      ncclResult_t r = ncclCommFinalize(comm);
      ncclResult_t state = r;
      if (r == ncclSuccess || r == ncclInProgress) {
        const auto deadline = Clock::now() + timeout_;
        Backoff backoff;
        for (;;) {
          if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
          if (state != ncclInProgress || Clock::now() >= deadline) break;
          backoff();
        }
      }
      if (state == ncclSuccess) ncclCommDestroy(comm);
      else ncclCommAbort(comm);
      comm_ = nullptr;
    }
    if (scratch_) cudaFree(scratch_);
    if (own_stream_) cudaStreamDestroy(as_stream(own_stream_));
  } catch (...) {
  }
}

void NcclCommunicator::abort() noexcept {
  if (comm_ && !aborted_) {
    cudaSetDevice(device_);
    ncclCommAbort(as_comm(comm_));
    comm_ = nullptr;
  }
  aborted_ = true;
}

void NcclCommunicator::abort_and_fail(const std::string& message) {
  abort();
  fail(ErrorCode::kComm, message + "; NCCL communicator aborted");
}

void NcclCommunicator::require_usable(const char* what) const {
  if (aborted_ || !comm_)
    fail(ErrorCode::kComm, fmt::format("rank {}: {}: the NCCL communicator was aborted by an earlier failure",
                                       rank_, what));
}

void NcclCommunicator::check_async_error(const char* what) {
  require_usable(what);
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(as_comm(comm_), &state);
  if (r != ncclSuccess) state = r;
  if (state != ncclSuccess && state != ncclInProgress)
    abort_and_fail(fmt::format("rank {} of {}: {}: NCCL reports {} (a peer died or the network failed)", rank_,
                               size_, what, nccl_text(state, as_comm(comm_))));
}

void NcclCommunicator::all_gather(const void* send, size_t bytes_per_rank, void* recv, Device device,
                                  const ExecContext& ctx) {
  if (device != Device::CUDA)
    invalid_argument(fmt::format("all_gather: rank {}: buffers on {}: NcclCommunicator gathers device buffers "
                                 "only (expected cuda)", rank_, device_name(device)));
  if (bytes_per_rank > 0 && (send == nullptr || recv == nullptr))
    invalid_argument(fmt::format("all_gather: rank {}: null send/recv with bytes_per_rank {}", rank_, bytes_per_rank));
  require_usable("all_gather");
  size_t count = bytes_per_rank;
  if (bytes_per_rank == 0) {  // still a collective: one byte per rank through the scratch
    auto* zero = static_cast<char*>(scratch_);
    send = zero + rank_;
    recv = zero;
    count = 1;
  }
  const ncclResult_t r = ncclAllGather(send, recv, count, ncclChar, as_comm(comm_), as_stream(ctx.stream));
  finish_enqueue(r, fmt::format("ncclAllGather ({} bytes per rank)", bytes_per_rank).c_str());
  counters_.calls += 1;
  counters_.bytes_sent += bytes_per_rank;
  counters_.bytes_received += bytes_per_rank * static_cast<uint64_t>(size_);
}

void NcclCommunicator::finish_enqueue(int result, const char* what) {
  // Non-blocking communicator: a call may return ncclInProgress and finish its enqueue
  // asynchronously (connection setup on the first collective between two peers). NCCL refuses
  // the next call on the communicator ("Attempt to use communicator before the previous
  // operation returned ncclSuccess") until ncclCommGetAsyncError says ncclSuccess, so every
  // call is polled to completion here. Host-side state only: legal during capture.
  ncclComm_t comm = as_comm(comm_);
  auto r = static_cast<ncclResult_t>(result);
  if (r == ncclInProgress) {
    const auto deadline = Clock::now() + timeout_;
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
      if (state != ncclInProgress) {
        r = state;
        break;
      }
      if (Clock::now() >= deadline)
        abort_and_fail(fmt::format("rank {} of {}: {}: enqueue did not complete within {} ms", rank_, size_, what,
                                   timeout_.count()));
      backoff();
    }
  }
  if (r != ncclSuccess)
    abort_and_fail(fmt::format("rank {} of {}: {} failed: {}", rank_, size_, what, nccl_text(r, comm)));
}

void NcclCommunicator::barrier() {
  require_usable("barrier");
  auto* region = static_cast<char*>(scratch_) + zero_region_bytes(size_);
  cudaSetDevice(device_);
  finish_enqueue(ncclAllGather(region + 4 * rank_, region, 4, ncclChar, as_comm(comm_), as_stream(own_stream_)),
                 "barrier: ncclAllGather");
  wait(own_stream_, timeout_);
}

void NcclCommunicator::wait(void* stream, milliseconds timeout) {
  require_usable("wait");
  const auto deadline = Clock::now() + timeout;
  ncclComm_t comm = as_comm(comm_);
  Backoff backoff;
  for (;;) {
    cudaError_t e = cudaStreamQuery(as_stream(stream));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress)
      abort_and_fail(fmt::format("rank {} of {}: wait: NCCL reports {} (a peer died or the network failed)", rank_,
                                 size_, nccl_text(state, comm)));
    // Done when the stream has drained and no call is still being enqueued (state ncclSuccess):
    // an empty stream alone does not mean that while an enqueue is in progress.
    if (e == cudaSuccess && state == ncclSuccess) return;
    if (e == cudaSuccess) e = cudaErrorNotReady;
    if (e != cudaErrorNotReady)
      abort_and_fail(fmt::format("rank {} of {}: wait: cudaStreamQuery: {}: {}", rank_, size_, cudaGetErrorName(e),
                                 cudaGetErrorString(e)));
    if (Clock::now() >= deadline)
      abort_and_fail(fmt::format("rank {} of {}: wait: outstanding collectives did not complete within {} ms "
                                 "(a peer is dead, hung or far behind)", rank_, size_, timeout.count()));
    backoff();
  }
}

void NcclCommunicator::add_to_counters(const Counters& c) {
  counters_.calls += c.calls;
  counters_.bytes_sent += c.bytes_sent;
  counters_.bytes_received += c.bytes_received;
}

}  // namespace dsv41kv

#endif  // DSV41KV_WITH_NCCL
