// ThreadGroup: P ranks as threads of one process. A collective is a rendezvous guarded by one
// mutex/condition variable with a generation counter; all_gather publishes each rank's send
// pointer, meets, copies every rank's buffer into the caller's recv (rank-major) and meets again
// so that no send buffer is released or reused while a peer still reads it.
#include <fmt/format.h>

#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "dsv41kv/comm.hpp"

#if defined(DSV41KV_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace dsv41kv {

namespace {
class RankComm;
}  // namespace

struct ThreadGroup::State {
  int P = 0;
  std::chrono::milliseconds timeout{0};
  std::mutex m;
  std::condition_variable cv;
  uint64_t generation = 0;
  int arrived = 0;
  std::vector<char> arrived_flag;  // this generation
  std::vector<char> finished;      // rank returned from its function in run()
  bool aborted = false;
  std::string abort_reason;
  int abort_origin = -1;
  std::vector<const void*> send_ptr;
  std::vector<size_t> send_bytes;
  std::vector<std::unique_ptr<Communicator>> comms;
  bool device_buffers = false;  // all_gather also accepts Device::CUDA buffers

  void reset_locked() {
    arrived = 0;
    std::fill(arrived_flag.begin(), arrived_flag.end(), 0);
    std::fill(finished.begin(), finished.end(), 0);
    aborted = false;
    abort_reason.clear();
    abort_origin = -1;
  }

  std::string ranks_missing_locked() const {
    std::string s;
    for (int k = 0; k < P; ++k)
      if (!arrived_flag[static_cast<size_t>(k)])
        s += fmt::format("{}{}{}", s.empty() ? "" : ",", k,
                         finished[static_cast<size_t>(k)] ? " (returned)" : "");
    return s;
  }

  // Abort with `reason` originating at `rank` (first abort wins). Caller holds the lock.
  void abort_locked(int rank, const std::string& reason) {
    if (!aborted) {
      aborted = true;
      abort_reason = reason;
      abort_origin = rank;
    }
    cv.notify_all();
  }

  void barrier(int rank, const char* what) {
    std::unique_lock<std::mutex> lk(m);
    if (aborted) fail(ErrorCode::kComm, fmt::format("rank {}: {}: group aborted: {}", rank, what, abort_reason));
    const uint64_t gen = generation;
    arrived_flag[static_cast<size_t>(rank)] = 1;
    if (++arrived == P) {
      arrived = 0;
      std::fill(arrived_flag.begin(), arrived_flag.end(), 0);
      ++generation;
      cv.notify_all();
      return;
    }
    auto missing_finished = [&] {
      for (int k = 0; k < P; ++k)
        if (!arrived_flag[static_cast<size_t>(k)] && finished[static_cast<size_t>(k)]) return true;
      return false;
    };
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const bool ok = cv.wait_until(lk, deadline, [&] {
      return generation != gen || aborted || missing_finished();
    });
    if (generation != gen) return;
    if (aborted)
      fail(ErrorCode::kComm, fmt::format("rank {}: {}: group aborted: {}", rank, what, abort_reason));
    const std::string missing = ranks_missing_locked();
    const std::string reason =
        ok ? fmt::format("{}: rank(s) {} left the group without arriving (rank {} waiting)", what,
                         missing, rank)
           : fmt::format("{}: timed out after {} ms: rank(s) {} did not arrive (rank {} waiting)",
                         what, timeout.count(), missing, rank);
    abort_locked(rank, reason);
    fail(ErrorCode::kComm, reason);
  }
};

namespace {

class RankComm final : public Communicator {
 public:
  RankComm(ThreadGroup::State* s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->P; }
  bool supports(Device device) const override {
    return device == Device::CPU || (device == Device::CUDA && s_->device_buffers);
  }

  void all_gather(const void* send, size_t bytes_per_rank, void* recv, Device device,
                  const ExecContext& ctx) override {
    if (!supports(device))
      invalid_argument(fmt::format(
          "all_gather: buffers on {}: this ThreadGroup gathers host buffers only (expected cpu; "
          "construct it with Device::CUDA for device buffers)",
          device_name(device)));
    if (bytes_per_rank > 0 && (send == nullptr || recv == nullptr))
      invalid_argument(fmt::format("all_gather: rank {}: null send/recv with bytes_per_rank {}",
                                   rank_, bytes_per_rank));
    const bool on_device = device == Device::CUDA;
    // Device buffers: this rank's producers of `send` must be complete before a peer reads it.
    if (on_device) cuda(cudaStreamSynchronize(stream_of(ctx)), "cudaStreamSynchronize (before publish)");
    {
      std::lock_guard<std::mutex> lk(s_->m);
      s_->send_ptr[static_cast<size_t>(rank_)] = send;
      s_->send_bytes[static_cast<size_t>(rank_)] = bytes_per_rank;
    }
    s_->barrier(rank_, "all_gather (publish)");
    // Every rank sees the same table, so every rank fails alike on a size mismatch.
    for (int k = 0; k < s_->P; ++k) {
      if (s_->send_bytes[static_cast<size_t>(k)] != bytes_per_rank) {
        std::string sizes;
        for (int j = 0; j < s_->P; ++j)
          sizes += fmt::format("{}{}", j ? "," : "", s_->send_bytes[static_cast<size_t>(j)]);
        fail(ErrorCode::kComm,
             fmt::format("all_gather: bytes_per_rank differ across ranks: [{}] (rank {} has {}; "
                         "expected equal on every rank)",
                         sizes, rank_, bytes_per_rank));
      }
    }
    auto* out = static_cast<unsigned char*>(recv);
    for (int k = 0; k < s_->P; ++k) {
      const void* src = s_->send_ptr[static_cast<size_t>(k)];
      unsigned char* dst = out + static_cast<size_t>(k) * bytes_per_rank;
      if (bytes_per_rank == 0 || src == dst) continue;
      if (on_device)
        cuda(cudaMemcpyAsync(dst, src, bytes_per_rank, cudaMemcpyDefault, stream_of(ctx)), "cudaMemcpyAsync");
      else
        std::memcpy(dst, src, bytes_per_rank);
    }
    // Device buffers: the copies out of the peers' send buffers are done before they move on.
    if (on_device) cuda(cudaStreamSynchronize(stream_of(ctx)), "cudaStreamSynchronize (after copies)");
    s_->barrier(rank_, "all_gather (complete)");
    counters_.calls += 1;
    counters_.bytes_sent += bytes_per_rank;
    counters_.bytes_received += bytes_per_rank * static_cast<uint64_t>(s_->P);
  }

  void barrier() override { s_->barrier(rank_, "barrier"); }
  Counters counters() const override { return counters_; }

 private:
#if defined(DSV41KV_WITH_CUDA)
  static cudaStream_t stream_of(const ExecContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }
  void cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    // Leave the group so that the peers fail instead of waiting for this rank.
    const std::string msg = fmt::format("rank {}: all_gather: {}: {}", rank_, what, cudaGetErrorString(e));
    {
      std::lock_guard<std::mutex> lk(s_->m);
      s_->abort_locked(rank_, msg);
    }
    fail(ErrorCode::kCuda, msg);
  }
#else
  static void* stream_of(const ExecContext& ctx) { return ctx.stream; }
  template <class... A>
  static int cudaStreamSynchronize(A...) { return 0; }
  template <class... A>
  static int cudaMemcpyAsync(A...) { return 0; }
  static constexpr int cudaMemcpyDefault = 0;
  void cuda(int, const char*) {}
#endif

  ThreadGroup::State* s_;
  int rank_;
  Counters counters_;
};

}  // namespace

ThreadGroup::ThreadGroup(int size, std::chrono::milliseconds timeout) : state_(new State) {
  if (size < 1 || size > 1024)
    invalid_argument(fmt::format("ThreadGroup: size {} (expected 1..1024)", size));
  if (timeout.count() <= 0)
    invalid_argument(fmt::format("ThreadGroup: timeout {} ms (expected > 0)", timeout.count()));
  state_->P = size;
  state_->timeout = timeout;
  state_->arrived_flag.assign(static_cast<size_t>(size), 0);
  state_->finished.assign(static_cast<size_t>(size), 0);
  state_->send_ptr.assign(static_cast<size_t>(size), nullptr);
  state_->send_bytes.assign(static_cast<size_t>(size), 0);
  for (int k = 0; k < size; ++k) state_->comms.emplace_back(new RankComm(state_.get(), k));
}

ThreadGroup::ThreadGroup(int size, Device buffers, std::chrono::milliseconds timeout)
    : ThreadGroup(size, timeout) {
  if (buffers == Device::CUDA) {
#if defined(DSV41KV_WITH_CUDA)
    state_->device_buffers = true;
#else
    invalid_argument("ThreadGroup: buffers = cuda: dsv41kv was built without CUDA (DSV41KV_CUDA=OFF)");
#endif
  }
}

ThreadGroup::~ThreadGroup() = default;

int ThreadGroup::size() const { return state_->P; }

Communicator& ThreadGroup::comm(int rank) {
  if (rank < 0 || rank >= state_->P)
    invalid_argument(fmt::format("ThreadGroup::comm: rank {} (expected 0..{})", rank, state_->P - 1));
  return *state_->comms[static_cast<size_t>(rank)];
}

void ThreadGroup::run(const std::function<void(Communicator&)>& fn) {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lk(s.m);
    s.reset_locked();
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(s.P));
  auto body = [&](int k) {
    try {
      fn(*s.comms[static_cast<size_t>(k)]);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(k)] = std::current_exception();
      std::lock_guard<std::mutex> lk(s.m);
      s.abort_locked(k, fmt::format("rank {} failed: {}", k, e.what()));
    } catch (...) {
      errors[static_cast<size_t>(k)] = std::current_exception();
      std::lock_guard<std::mutex> lk(s.m);
      s.abort_locked(k, fmt::format("rank {} failed", k));
    }
    std::lock_guard<std::mutex> lk(s.m);
    s.finished[static_cast<size_t>(k)] = 1;
    s.cv.notify_all();
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(s.P - 1));
  for (int k = 1; k < s.P; ++k) threads.emplace_back(body, k);
  body(0);
  for (auto& t : threads) t.join();
  int origin = -1;
  {
    std::lock_guard<std::mutex> lk(s.m);
    if (s.aborted) origin = s.abort_origin;
    // Leave the rendezvous state clean for the next run.
    s.reset_locked();
  }
  if (origin >= 0 && errors[static_cast<size_t>(origin)])
    std::rethrow_exception(errors[static_cast<size_t>(origin)]);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace dsv41kv
