// The write-path bench's workloads and the bytes each of its variants must move, in one place
// (host code, every build): `dsv41kv bench` divides them by its times, tests/bench checks them
// against the counts of ../shared/baselines/vllm_triton_h200.json.
//
// Workloads (the baseline's, ../shared/baselines/README.md): decode256 (256 requests x 1
// token), prefill32k (8 x 4096), prefill256k (16 x 16384); ring capacity 8, 64 states per cache
// page; ratio 1 and 2; records v4_584, mxfp8_528, nvfp4_288.
//
// Bytes, counted as the baseline README counts them (what a kernel must move at least, each
// byte once):
//   kv_score read    tokens x 512 x ratio fp32 (2048 bytes a token at ratio 1, 4096 at ratio 2)
//   ring tail write  ratio 2 only: each request's last min(len, 8) rows of 1024 fp32 (4096 bytes)
//   latent           closing states x 512 bf16 (1024 bytes), written by compress, read by insert
//   record write     closing states x the record's bytes
// with tokens / ratio closing states (the README's count, whatever the positions are). Then
//   compress = kv_score read + ring tail write + latent        (vLLM's fused_save_compress_norm:
//                                                               the JSON's `fused_bytes`)
//   insert   = latent + record write                           (`insert_<record>_bytes`)
//   fused    = kv_score read + ring tail write + record write  (compress_insert: no latent)
// and the separate kernels move compress + insert.
#pragma once

#include <cstdint>
#include <string_view>

#include "dsv41kv/records.hpp"

namespace dsv41kv::bench {

inline constexpr int64_t kRingCapacity = 8;    // ring rows per request (ratio 2)
inline constexpr int64_t kStatesPerPage = 64;  // states per cache page

struct Workload {
  const char* name;
  int num_reqs;
  int len;      // tokens per request
  bool decode;  // timed as CUDA-graph replays (one node per layer)
};
inline constexpr Workload kWorkloads[] = {{"decode256", 256, 1, true},
                                          {"prefill32k", 8, 4096, false},
                                          {"prefill256k", 16, 16384, false}};
inline constexpr RecordFormat kWritePathFormats[] = {RecordFormat::V4_584, RecordFormat::MXFP8_528,
                                                     RecordFormat::NVFP4_288};

// The workload called `name`, nullptr when there is none.
const Workload* find_workload(std::string_view name);

// The counts the bytes are made of for one workload and ratio.
struct TrafficShape {
  int ratio = 1;
  int64_t tokens = 0;
  int64_t closing = 0;    // tokens / ratio
  int64_t tail_rows = 0;  // ring rows written at the end of the call (ratio 2; 0 at ratio 1)
};
TrafficShape traffic_shape(const Workload& w, int ratio);

int64_t compress_bytes(const TrafficShape& s);
int64_t insert_bytes(const TrafficShape& s, int record_bytes);
int64_t fused_bytes(const TrafficShape& s, int record_bytes);

}  // namespace dsv41kv::bench
