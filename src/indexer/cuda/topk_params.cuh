// The parameters both indexer scoring kernels (topk_cuda.cu's chunk kernel, score_warpgroup.cuh)
// and the select kernel read: the validated views of one indexer_topk call as raw pointers, and
// the rules of which entries and workspace rows a token has.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "indexer/backend.hpp"

namespace dsv41kv::detail::cuda {

inline constexpr float kTopkNegInf = -std::numeric_limits<float>::infinity();

struct TopkParams {
  IndexerRole role = IndexerRole::kPlain;
  int ratio = 1;
  int group = 2;
  bool vec16 = false;  // key rows 16-byte aligned (base and page stride): uint4 loads
  const uint8_t* q8 = nullptr;  // [T, 32, 128]
  const float* w = nullptr;     // [T, 32]
  const int64_t* pos = nullptr;
  const int32_t* t2r = nullptr;
  const int32_t* valid = nullptr;  // null: all valid
  const int32_t* bt = nullptr;
  int64_t bt_stride = 0, bt_cols = 0;
  const uint8_t* cache = nullptr;
  int64_t S = 1, page_stride = 0, num_pages = 0;
  int32_t* topk = nullptr;
  int64_t topk_stride = 0;
  int32_t* cand = nullptr;
  int64_t cand_stride = 0;
  float* scores = nullptr;
  int64_t scores_stride = 0, scores_cols = 0;
  float* ws_score = nullptr;  // [T][chunks * 512] each
  int32_t* ws_index = nullptr;
  float* ws_block = nullptr;  // source only
  int32_t* ws_nchunks = nullptr;  // consumer only: [T] chunks of the run's candidate union
  int64_t chunks = 0;  // workspace chunks per token (the row stride / 512)
  int64_t slots = 0;   // > 0: every valid token's workspace row holds `slots` rows of 512 (the
                       // warpgroup kernel's blocks of one group), else its entries' 4096-chunks
  int64_t T = 0;
};

__device__ __forceinline__ bool token_valid(const TopkParams& p, int64_t t) { return p.valid == nullptr || p.valid[t] != 0; }
__device__ __forceinline__ int64_t token_nc(const TopkParams& p, int64_t t) {
  return token_valid(p, t) ? closed_groups(p.pos[t] + 1, int64_t{p.ratio}) : 0;
}
// The chunks of token t's workspace row that the scoring kernel fills (and the select reads).
// A consumer's (chunk kernel): those of its run's candidate union, left by the scoring kernel.
__device__ __forceinline__ int64_t token_chunks(const TopkParams& p, int64_t t) {
  if (!token_valid(p, t)) return 0;
  if (p.slots > 0) return p.slots;
  if (p.role == IndexerRole::kCandidateConsumer) return p.ws_nchunks[t];
  const int64_t c = (token_nc(p, t) + kTopkChunk - 1) / kTopkChunk;
  return c < p.chunks ? c : p.chunks;
}

}  // namespace dsv41kv::detail::cuda
