// dsv41kv: the NCCL implementation of `Communicator` (SPEC 7): one process per GPU, device
// buffers, collectives ordered on the caller's CUDA stream without host synchronisation (so
// they can be captured into a CUDA graph).
//
// Failure model: the communicator is created non-blocking (ncclConfig_t.blocking = 0), so no
// NCCL call can block the host forever. Every host-side wait (construction, `wait`, `barrier`,
// destruction) polls cudaStreamQuery and ncclCommGetAsyncError against a deadline; on an NCCL
// error or when the deadline passes it calls ncclCommAbort (which also releases kernels stuck
// waiting for a dead peer) and throws Error(ErrorCode::kComm) naming the rank, the operation
// and the timeout. After an abort every further call throws kComm.
//
// Built only when CMake finds NCCL (option DSV41KV_NCCL, defines DSV41KV_WITH_NCCL); otherwise
// `nccl_available()` is false and constructing a communicator throws kBackendUnsupported.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41kv/comm.hpp"

namespace dsv41kv {

// True when the library was built with NCCL.
bool nccl_available();
// "NCCL 2.28.9" (the runtime library's version) or "built without NCCL".
std::string nccl_version_string();

class NcclCommunicator final : public Communicator {
 public:
  // A fresh ncclUniqueId as 128 bytes (rank 0 calls this and publishes it, see the rendezvous
  // in src/comm/rendezvous.hpp). kComm on NCCL failure.
  static std::vector<uint8_t> create_unique_id();

  // Collective: every rank of `size` calls it with the same `unique_id`. Selects CUDA device
  // `device` on the calling thread and initialises the communicator (non-blocking init,
  // polled up to `timeout`; kComm naming the rank, world, device and timeout when a peer does
  // not join). `timeout` is also the default of every later wait.
  NcclCommunicator(int rank, int size, const std::vector<uint8_t>& unique_id, int device,
                   std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Finalizes (flushes outstanding work, bounded by the timeout) and destroys; aborts instead
  // when finalization fails or times out, or after an earlier abort. Never throws.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  bool supports(Device d) const override { return d == Device::CUDA; }

  // ncclAllGather (ncclChar) of device buffers on ctx.stream; no host synchronisation, legal
  // during stream capture. In-place when send == recv + rank * bytes_per_rank. bytes_per_rank
  // == 0 still joins a (1-byte, internal) collective so every rank stays in step. NCCL cannot
  // detect bytes_per_rank differing across ranks: such a call corrupts or stalls, and a stall
  // surfaces as kComm from the next `wait`. E8 for host buffers (device != CUDA) or null
  // pointers. The calling thread must have this communicator's device current (the
  // constructor makes it current).
  void all_gather(const void* send, size_t bytes_per_rank, void* recv, Device device = Device::CUDA,
                  const ExecContext& ctx = {}) override;
  // A 4-byte all-gather on an internal stream, waited for with the timeout.
  void barrier() override;
  Counters counters() const override { return counters_; }

  // Waits until `stream` (a cudaStream_t; nullptr = legacy default stream) has drained,
  // polling cudaStreamQuery and ncclCommGetAsyncError; on an NCCL error, a CUDA error or when
  // `timeout` passes, aborts the communicator and throws kComm naming the rank. Not callable
  // on a stream that is being captured.
  void wait(void* stream, std::chrono::milliseconds timeout);
  void wait(void* stream) { wait(stream, timeout_); }
  // Communicator's bounded wait: wait(stream) with the communicator's timeout; returns true.
  bool wait_device(void* stream) override {
    wait(stream, timeout_);
    return true;
  }

  // Polls ncclCommGetAsyncError once; throws kComm (after aborting) on an error.
  void check_async_error(const char* what);
  // Aborts the communicator (idempotent, never throws). Outstanding collectives of this rank
  // complete with an error; the peers see this rank as dead.
  void abort() noexcept;
  bool aborted() const { return aborted_; }

  // Graph replays are invisible to the communicator: callers that replay a captured graph
  // can add its collectives to the counters here.
  void add_to_counters(const Counters& c);

 private:
  [[noreturn]] void abort_and_fail(const std::string& message);
  // Polls a non-blocking call's ncclResult_t (`result`) until its enqueue has completed;
  // aborts and throws kComm on an error or after the timeout.
  void finish_enqueue(int result, const char* what);
  void require_usable(const char* what) const;

  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  std::chrono::milliseconds timeout_{60000};
  void* comm_ = nullptr;         // ncclComm_t
  void* own_stream_ = nullptr;   // cudaStream_t for barrier()
  void* scratch_ = nullptr;      // device scratch for barrier and zero-byte gathers
  bool aborted_ = false;
  Counters counters_{};
};

}  // namespace dsv41kv
