// dsv41kv: RoPE tables (SPEC 1.4). A table is fp32 [rows, 64]: row p holds cos(p*f_j) for
// j = 0..31, then sin(p*f_j). Two tables per model: the plain table (rope_theta, ratio-0 layers)
// and the YaRN table (compress_rope_theta + rope_scaling, ratio > 0 layers and their indexers).
//
// DECISION (SPEC 1.4): f_j, the angle p*f_j, cos and sin are evaluated in binary64 and each
// result is rounded once to fp32 (RopeAngle::kBinary64). RopeAngle::kFp32 reproduces vLLM's
// table: the angle is the fp32 product of fp32(p) and fp32(f_j), cos/sin of it rounded to fp32.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "dsv41kv/common.hpp"
#include "dsv41kv/config.hpp"

namespace dsv41kv {

inline constexpr int kRopeTableWidth = 64;  // 32 cos | 32 sin
inline constexpr int kRopePairs = 32;

enum class RopeAngle : uint8_t {
  kBinary64 = 0,  // default: angle in binary64, one rounding of cos/sin to fp32
  kFp32 = 1,      // "fp32_angle": angle = fp32(fp32(p) * fp32(f_j)) as vLLM forms it
};
const char* rope_angle_name(RopeAngle a);        // "binary64", "fp32_angle"
RopeAngle parse_rope_angle(const char* name);    // "binary64"/"fp64", "fp32_angle"/"fp32"; E8

struct RopeParams {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;
};

// YaRN correction range over the 32 frequency indices: d(n) = 64*ln(orig/(n*2*pi)) / (2*ln theta),
// low = max(floor(d(beta_fast)), 0), high = min(ceil(d(beta_slow)), 63); when low == high the
// ramp uses high + 0.001.
struct YarnRange {
  double low = 0;
  double high = 0;
};
YarnRange yarn_correction_range(const RopeParams& p);
double yarn_correction_dim(double num_rotations, double theta, int64_t original_max, int dim = kRopeTableWidth);

// f_j in binary64, j = 0..31 (e_j = theta^(-2j/64), YaRN-interpolated when p.yarn).
std::array<double, kRopePairs> rope_frequencies(const RopeParams& p);

// The parameters of a model's tables.
RopeParams rope_params_plain(const ModelConfig& cfg);       // rope_theta, no scaling
RopeParams rope_params_compressed(const ModelConfig& cfg);  // compress_rope_theta + rope_scaling
RopeParams rope_params_for_ratio(const ModelConfig& cfg, int ratio);  // 0 -> plain, 1/2 -> compressed

// A host table, row-major [rows, 64].
struct RopeTable {
  int64_t rows = 0;
  std::vector<float> data;
  const float* row(int64_t p) const { return data.data() + p * kRopeTableWidth; }
  // f32 [rows, 64] contiguous host view (the view aliases `data`).
  TensorView view() const;
};

// Builds rows [0, rows) with up to `num_threads` threads (0 = hardware concurrency). E8 for
// rows <= 0 or invalid parameters.
RopeTable build_rope_table(const RopeParams& p, int64_t rows, RopeAngle angle = RopeAngle::kBinary64,
                           int num_threads = 0);
// The table of `layer` (plain for ratio 0, YaRN otherwise) with `rows` rows
// (rows <= 0: max_position_embeddings).
RopeTable rope_table_for_layer(const ModelConfig& cfg, int layer, int64_t rows = 0,
                               RopeAngle angle = RopeAngle::kBinary64, int num_threads = 0);
RopeTable rope_table_for_ratio(const ModelConfig& cfg, int ratio, int64_t rows = 0,
                               RopeAngle angle = RopeAngle::kBinary64, int num_threads = 0);

}  // namespace dsv41kv
