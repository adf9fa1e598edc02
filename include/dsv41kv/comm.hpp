// dsv41kv: the collective interface PCP needs (SPEC 7): rank, size, a rank-major all-gather of
// one equally sized buffer per rank, and a barrier.
//
// Callers (the PCP step, the link, the simulation) only see `Communicator`. `ThreadGroup` runs
// P ranks as threads of one process (host buffers); an NCCL implementation with device
// buffers implements the same interface and drops in without changing callers: every call
// names where its buffers live (`MemorySpace`) and the stream it is ordered on.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether all_gather accepts buffers on `device` (ThreadGroup: CPU only; NCCL: CUDA).
  virtual bool supports(Device device) const = 0;
  // Rank-major all-gather: recv[k * bytes_per_rank .. (k+1) * bytes_per_rank) receives rank k's
  // `send` buffer. Every rank must call it with the same bytes_per_rank (else ErrorCode::kComm
  // on every rank). `send` may alias this rank's own segment of `recv` (in-place gather).
  // bytes_per_rank == 0 still synchronises. Buffers live on `device`; CUDA calls are ordered on
  // ctx.stream and do not synchronise the host.
  virtual void all_gather(const void* send, size_t bytes_per_rank, void* recv,
                          Device device = Device::CPU, const ExecContext& ctx = {}) = 0;
  virtual void barrier() = 0;
  // Blocks the host until the work ordered on `stream` (a cudaStream_t; this communicator's
  // collectives included) has completed, with this communicator's failure detection: a
  // communicator that can tell a dead or hung peer (NcclCommunicator) bounds the wait by its
  // timeout and throws ErrorCode::kComm naming the rank instead of hanging. Returns false when
  // the communicator has no such wait (ThreadGroup: its device gathers complete before they
  // return); the caller then synchronises the stream itself.
  virtual bool wait_device(void* stream) {
    (void)stream;
    return false;
  }

  // Bytes this rank contributed to / received from all_gather calls since construction
  // (received counts the whole gathered output, own segment included, as SPEC 7.7 does).
  struct Counters {
    uint64_t calls = 0;
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
  };
  virtual Counters counters() const = 0;
};

// P ranks as threads of one process. Each collective is a rendezvous of all P ranks; a rank
// that does not arrive within `timeout` makes every waiting rank throw ErrorCode::kComm naming
// the ranks that did not arrive. A rank whose function throws aborts the group: the others
// fail their next (or current) collective with kComm instead of hanging.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // buffers == Device::CUDA: the ranks' all_gather also accepts device buffers (CUDA builds
  // only; E8 otherwise). A test/simulation communicator for P ranks sharing one process (and
  // typically one GPU), not a production path: each rank synchronises ctx.stream before
  // publishing its send pointer (so the peers' producers are complete), then copies every
  // rank's segment into its recv with cudaMemcpyAsync on ctx.stream and synchronises it again
  // before the closing rendezvous (so no send buffer is reused while a peer still reads it).
  // Host buffers keep working (Device::CPU).
  ThreadGroup(int size, Device buffers, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const;
  // The communicator of rank `rank` (0 <= rank < size, E8 otherwise). Valid while the group
  // lives; counters accumulate across run() calls.
  Communicator& comm(int rank);

  // Runs fn(comm(k)) on P threads (rank 0 on the calling thread), joins them, and rethrows the
  // first failure: a rank's own exception takes precedence over the kComm errors it caused
  // in the other ranks. The group is reusable after a successful run; after a failed run it
  // is reset for the next one.
  void run(const std::function<void(Communicator&)>& fn);

  struct State;  // opaque (thread_group.cpp)

 private:
  std::unique_ptr<State> state_;
};

}  // namespace dsv41kv
