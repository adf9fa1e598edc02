// RoPE tables (SPEC 1.4).
#include "dsv41kv/rope.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

namespace dsv41kv {
namespace {

constexpr double kPi = 3.14159265358979323846;

void check_params(const RopeParams& p) {
  if (!(std::isfinite(p.theta) && p.theta > 1.0))
    invalid_argument(fmt::format("RoPE theta is {}, expected a finite number > 1", p.theta));
  if (p.yarn) {
    if (!(std::isfinite(p.factor) && p.factor >= 1.0))
      invalid_argument(fmt::format("YaRN factor is {}, expected a number >= 1", p.factor));
    if (p.original_max_position_embeddings <= 0)
      invalid_argument(fmt::format("YaRN original_max_position_embeddings is {}, expected > 0",
                                   p.original_max_position_embeddings));
    if (!(std::isfinite(p.beta_fast) && std::isfinite(p.beta_slow) && p.beta_fast > 0 && p.beta_slow > 0))
      invalid_argument(fmt::format("YaRN beta_fast {} / beta_slow {}, expected positive numbers", p.beta_fast,
                                   p.beta_slow));
  }
}

}  // namespace

const char* rope_angle_name(RopeAngle a) { return a == RopeAngle::kFp32 ? "fp32_angle" : "binary64"; }

RopeAngle parse_rope_angle(const char* name) {
  const std::string s = name ? name : "";
  if (s == "binary64" || s == "fp64") return RopeAngle::kBinary64;
  if (s == "fp32_angle" || s == "fp32") return RopeAngle::kFp32;
  invalid_argument(fmt::format("rope_table is '{}', expected 'binary64' or 'fp32_angle'", s));
}

double yarn_correction_dim(double num_rotations, double theta, int64_t original_max, int dim) {
  return static_cast<double>(dim) * std::log(static_cast<double>(original_max) / (num_rotations * 2.0 * kPi)) /
         (2.0 * std::log(theta));
}

YarnRange yarn_correction_range(const RopeParams& p) {
  check_params(p);
  const double lo = std::floor(yarn_correction_dim(p.beta_fast, p.theta, p.original_max_position_embeddings));
  const double hi = std::ceil(yarn_correction_dim(p.beta_slow, p.theta, p.original_max_position_embeddings));
  YarnRange r;
  r.low = std::max(lo, 0.0);
  r.high = std::min(hi, static_cast<double>(kRopeTableWidth - 1));
  return r;
}

std::array<double, kRopePairs> rope_frequencies(const RopeParams& p) {
  check_params(p);
  std::array<double, kRopePairs> f{};
  YarnRange yr;
  if (p.yarn) {
    yr = yarn_correction_range(p);
    if (yr.low == yr.high) yr.high += 0.001;
  }
  for (int j = 0; j < kRopePairs; ++j) {
    const double e = std::pow(p.theta, -2.0 * j / static_cast<double>(kRopeTableWidth));
    if (!p.yarn) {
      f[static_cast<size_t>(j)] = e;
      continue;
    }
    double ramp = (static_cast<double>(j) - yr.low) / (yr.high - yr.low);
    ramp = std::clamp(ramp, 0.0, 1.0);
    f[static_cast<size_t>(j)] = (e / p.factor) * ramp + e * (1.0 - ramp);
  }
  return f;
}

RopeParams rope_params_plain(const ModelConfig& cfg) {
  RopeParams p;
  p.theta = cfg.rope_theta;
  return p;
}

RopeParams rope_params_compressed(const ModelConfig& cfg) {
  RopeParams p;
  p.theta = cfg.compress_rope_theta;
  if (cfg.rope_scaling.present) {
    p.yarn = true;
    p.factor = cfg.rope_scaling.factor;
    p.beta_fast = cfg.rope_scaling.beta_fast;
    p.beta_slow = cfg.rope_scaling.beta_slow;
    p.original_max_position_embeddings = cfg.rope_scaling.original_max_position_embeddings;
  }
  return p;
}

RopeParams rope_params_for_ratio(const ModelConfig& cfg, int ratio) {
  (void)layer_type_of_ratio(ratio);  // E1 for anything but 0/1/2
  return ratio == 0 ? rope_params_plain(cfg) : rope_params_compressed(cfg);
}

TensorView RopeTable::view() const {
  return TensorView::contiguous(const_cast<float*>(data.data()), DType::F32, {rows, kRopeTableWidth});
}

RopeTable build_rope_table(const RopeParams& p, int64_t rows, RopeAngle angle, int num_threads) {
  if (rows <= 0 || rows > (int64_t{1} << 32))
    invalid_argument(fmt::format("RoPE table rows is {}, expected 1 .. 2^32", rows));
  const auto f = rope_frequencies(p);
  std::array<float, kRopePairs> f32{};
  for (int j = 0; j < kRopePairs; ++j) f32[static_cast<size_t>(j)] = static_cast<float>(f[static_cast<size_t>(j)]);

  RopeTable t;
  t.rows = rows;
  t.data.resize(static_cast<size_t>(rows) * kRopeTableWidth);
  float* out = t.data.data();
  auto fill = [&](int64_t r0, int64_t r1) {
    for (int64_t pos = r0; pos < r1; ++pos) {
      float* row = out + pos * kRopeTableWidth;
      for (int j = 0; j < kRopePairs; ++j) {
        double a;
        if (angle == RopeAngle::kBinary64) {
          a = static_cast<double>(pos) * f[static_cast<size_t>(j)];
        } else {
          const volatile float prod = static_cast<float>(pos) * f32[static_cast<size_t>(j)];  // fp32 product
          a = static_cast<double>(prod);
        }
        row[j] = static_cast<float>(std::cos(a));
        row[kRopePairs + j] = static_cast<float>(std::sin(a));
      }
    }
  };
  int threads = num_threads > 0 ? num_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t min_rows_per_thread = 4096;
  threads = static_cast<int>(std::clamp<int64_t>(rows / min_rows_per_thread, 1, threads));
  if (threads == 1) {
    fill(0, rows);
    return t;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (rows + threads - 1) / threads;
  for (int i = 0; i < threads; ++i) {
    const int64_t r0 = i * chunk, r1 = std::min(rows, r0 + chunk);
    if (r0 < r1) pool.emplace_back(fill, r0, r1);
  }
  for (auto& th : pool) th.join();
  return t;
}

RopeTable rope_table_for_ratio(const ModelConfig& cfg, int ratio, int64_t rows, RopeAngle angle, int num_threads) {
  return build_rope_table(rope_params_for_ratio(cfg, ratio), rows > 0 ? rows : cfg.max_position_embeddings, angle,
                          num_threads);
}

RopeTable rope_table_for_layer(const ModelConfig& cfg, int layer, int64_t rows, RopeAngle angle, int num_threads) {
  return rope_table_for_ratio(cfg, cfg.ratio(layer), rows, angle, num_threads);
}

}  // namespace dsv41kv
