// Elapsed times between marks on the timeline of one device: the host clock where the ops run on
// the CPU (they return when done), CUDA events on the stream where they run on the GPU. The
// pipeline's per-step timings.
#pragma once

#include <chrono>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

class Timeline {
 public:
  // `marks` points in time, each recorded by mark(); CUDA events are created here, once.
  Timeline(Device device, int marks);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  void mark(int i, const ExecContext& ctx);
  // Milliseconds from mark `from` to mark `to` (0 until both were recorded); CUDA: waits for `to`.
  double ms(int from, int to) const;

 private:
  Device device_;
  std::vector<std::chrono::steady_clock::time_point> host_;
  std::vector<void*> events_;  // cudaEvent_t
  std::vector<bool> recorded_;
};

}  // namespace dsv41kv::detail
