// The write-path bench's traffic model (traffic_model.hpp).
#include "bench/traffic_model.hpp"

#include <algorithm>

namespace dsv41kv::bench {
namespace {

constexpr int64_t kLatentBytes = 512 * 2;     // a bf16 latent
constexpr int64_t kRingRowBytes = 1024 * 4;   // an fp32 ring row (kv and score of one token)

int64_t kv_score_bytes(const TrafficShape& s) { return s.tokens * 512 * s.ratio * 4; }
int64_t ring_tail_bytes(const TrafficShape& s) { return s.tail_rows * kRingRowBytes; }
int64_t latent_bytes(const TrafficShape& s) { return s.closing * kLatentBytes; }

}  // namespace

const Workload* find_workload(std::string_view name) {
  for (const Workload& w : kWorkloads)
    if (name == w.name) return &w;
  return nullptr;
}

TrafficShape traffic_shape(const Workload& w, int ratio) {
  TrafficShape s;
  s.ratio = ratio;
  s.tokens = int64_t{w.num_reqs} * w.len;
  s.closing = s.tokens / ratio;
  s.tail_rows = ratio == 2 ? int64_t{w.num_reqs} * std::min<int64_t>(w.len, kRingCapacity) : 0;
  return s;
}

int64_t compress_bytes(const TrafficShape& s) { return kv_score_bytes(s) + ring_tail_bytes(s) + latent_bytes(s); }

int64_t insert_bytes(const TrafficShape& s, int record_bytes) {
  return latent_bytes(s) + s.closing * record_bytes;
}

int64_t fused_bytes(const TrafficShape& s, int record_bytes) {
  return kv_score_bytes(s) + ring_tail_bytes(s) + s.closing * record_bytes;
}

}  // namespace dsv41kv::bench
