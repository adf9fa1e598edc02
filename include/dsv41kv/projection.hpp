// dsv41kv: the compressor layer's projection (SPEC 4.1): kv_score = hidden . W^T with bf16
// operands and fp32 accumulation, fp32 output without bf16 rounding, and the compressor's
// weights (fused wkv|wgate and the RMSNorm weight).
//
// Accumulation order (normative for this library; a GPU implementation reproducing it is
// bit-identical): for every output element (t, o), with H = hidden size,
//   acc[l] = +0.0f for l in 0..15
//   for k in 0..H-1 ascending: acc[k % 16] = acc[k % 16] + (x[t][k] * w[o][k])
//        (x, w widened exactly from bf16; the product is rounded to fp32 (it is exact unless it
//         leaves the fp32 normal range), then one IEEE fp32 addition; no FMA)
//   for h in 8, 4, 2, 1: for l in 0..h-1: acc[l] = acc[l] + acc[l + h]
//   kv_score[t][o] = acc[0]
// Each element depends only on row t of hidden and row o of W, never on T, the blocking or
// the thread count, so the projection is batch-invariant (SPEC 11, open points).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv {

// hidden: bf16 [T, H] (inner stride 1, any row stride >= H); weight: bf16 [512*r, H] (inner
// stride 1); kv_score: f32 [T, 512*r] (inner stride 1, row stride >= 512*r). r in {1, 2} is
// implied by weight.shape[0] (512 or 1024; E3 otherwise). Host views only (E8 otherwise).
// Multi-threaded over (token block, output block) tiles with ctx.num_threads.
void project_kv_score(const TensorView& hidden, const TensorView& weight,
                      const TensorView& kv_score, const ExecContext& ctx = {});

// The weights of one compressor (one kv-source layer).
struct CompressorWeights {
  int ratio = 2;                          // 1 or 2
  std::vector<uint16_t> fused_wkv_wgate;  // bf16 bits [512*ratio, hidden_size] row-major:
                                          //   rows 0..511 wkv, rows 512..1023 wgate (ratio 2)
  std::vector<uint16_t> norm_weight;      // bf16 bits [512]
  int hidden_size = 5120;

  // Deterministic synthetic weights: every element of W drawn from N(0, 1/sqrt(hidden_size))
  // (so kv_score entries are O(1) for O(1) inputs), norm weight 1 + N(0, 0.1); all rounded to
  // bf16 (SPEC 2.1). The same (ratio, hidden_size, seed) always gives the same bytes.
  static CompressorWeights from_seed(int ratio, int hidden_size, uint64_t seed);

  // Loads bf16 weights from a safetensors file. With P = layer_prefix (a '.' is appended when it
  // is non-empty and lacks one), the names tried, each with and without a ".weight" suffix:
  //   P + "fused_wkv_wgate"       bf16 [512*r, H] (r = rows / 512), or
  //   P + "wkv" [512, H] and, for ratio 2, P + "wgate" [512, H] (concatenated, wkv first);
  //   P + "norm.weight" (or P + "norm") bf16 [512].
  // ErrorCode::kFormat naming the file and tensor when a tensor is missing or has the wrong
  // dtype/shape; kIo when the file cannot be read.
  static CompressorWeights from_safetensors(const std::string& path,
                                            const std::string& layer_prefix);

  // Views of the weights (host, contiguous).
  TensorView weight_view() const;
  TensorView norm_view() const;
};

}  // namespace dsv41kv
