// The compressor projection (SPEC 4.1) on the CPU and the compressor weights.
// Accumulation order: lin::dot_fixed (formats/linear.hpp), see include/dsv41kv/projection.hpp.
#include "dsv41kv/projection.hpp"
#include "dsv41kv/rng.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.hpp"
#include "core/validate.hpp"
#include "formats/linear.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/safetensors.hpp"

namespace dsv41kv {
namespace {

using detail::parallel_for;

constexpr int64_t kTokBlock = 4;   // tokens per tile
constexpr int64_t kOutBlock = 32;  // outputs per tile (32 weight rows of 20 KB stay in L2)

constexpr const char* kOp = "project_kv_score";
[[noreturn]] void bad(const char* arg, const std::string& msg) { detail::bad_arg(kOp, arg, msg); }

// A host matrix of dtype dt (the projection is host-only; CUDA views: CublasProjection).
void need_matrix(const TensorView& v, const char* arg, DType dt) {
  detail::need_matrix(kOp, v, arg, dt, dt == DType::BF16 ? "bf16 [rows, cols]" : "f32 [rows, cols]");
  detail::need_on(kOp, v, arg, Device::CPU);
}

void widen_row(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t k = 0; k < n; ++k) dst[k] = num::bf16_decode(src[k]);
}

std::string join_prefix(const std::string& p) {
  if (p.empty() || p.back() == '.') return p;
  return p + ".";
}

// First of `names` that the file has, or "" when none.
std::string first_present(const st::SafetensorsFile& f, std::initializer_list<std::string> names) {
  for (const auto& n : names)
    if (f.has(n)) return n;
  return {};
}

std::vector<uint16_t> load_bf16(const st::SafetensorsFile& f, const std::string& name,
                                const std::vector<int64_t>& shape) {
  f.expect(name, st::StDType::BF16, shape);
  return f.copy_as<uint16_t>(name);
}

}  // namespace

void project_kv_score(const TensorView& hidden, const TensorView& weight,
                      const TensorView& kv_score, const ExecContext& ctx) {
  need_matrix(hidden, "hidden", DType::BF16);
  need_matrix(weight, "weight", DType::BF16);
  need_matrix(kv_score, "kv_score", DType::F32);
  const int64_t O = weight.shape[0], H = weight.shape[1], T = hidden.shape[0];
  if (O != kLatentDim && O != 2 * kLatentDim)
    fail(ErrorCode::kCompressorRatio,
         fmt::format("project_kv_score: weight: {} rows, expected 512 (ratio 1) or 1024 (ratio 2)",
                     O));
  if (hidden.shape[1] != H)
    bad("hidden", fmt::format("{} columns, expected the weight's hidden size {}", hidden.shape[1], H));
  if (kv_score.shape[0] < T)
    bad("kv_score", fmt::format("{} rows, expected at least T = {}", kv_score.shape[0], T));
  if (kv_score.shape[1] != O)
    bad("kv_score", fmt::format("{} columns, expected 512 * ratio = {}", kv_score.shape[1], O));
  detail::check_exec_context(ctx, "project_kv_score");
  if (T == 0) return;

  // Widen W once (row-major [O, H] fp32), in parallel.
  std::vector<float> w(static_cast<size_t>(O * H));
  const auto* wsrc = weight.ptr<const uint16_t>();
  parallel_for(O, ctx, 64, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) widen_row(wsrc + o * weight.stride[0], H, w.data() + o * H);
  });

  const auto* xsrc = hidden.ptr<const uint16_t>();
  auto* out = kv_score.ptr<float>();
  const int64_t tb = (T + kTokBlock - 1) / kTokBlock, ob = O / kOutBlock;
  parallel_for(tb * ob, ctx, 1, [&](int64_t b, int64_t e) {
    std::vector<float> x(static_cast<size_t>(kTokBlock * H));
    int64_t cur_tile_t = -1;
    for (int64_t tile = b; tile < e; ++tile) {
      // Tiles run token-block-major so consecutive tiles of one thread reuse the widened x.
      const int64_t ti = tile / ob, oi = tile % ob;
      const int64_t t0 = ti * kTokBlock, t1 = std::min(T, t0 + kTokBlock);
      if (ti != cur_tile_t) {
        for (int64_t t = t0; t < t1; ++t)
          widen_row(xsrc + t * hidden.stride[0], H, x.data() + (t - t0) * H);
        cur_tile_t = ti;
      }
      for (int64_t o = oi * kOutBlock; o < (oi + 1) * kOutBlock; ++o) {
        const float* wr = w.data() + o * H;
        for (int64_t t = t0; t < t1; ++t)
          out[t * kv_score.stride[0] + o] = lin::dot_fixed(x.data() + (t - t0) * H, wr, H);
      }
    }
  });
}

CompressorWeights CompressorWeights::from_seed(int ratio, int hidden_size, uint64_t seed) {
  if (ratio != 1 && ratio != 2)
    fail(ErrorCode::kCompressorRatio,
         fmt::format("CompressorWeights::from_seed: ratio = {}, expected 1 or 2", ratio));
  if (hidden_size <= 0)
    invalid_argument(fmt::format("CompressorWeights::from_seed: hidden_size = {}, expected > 0",
                                 hidden_size));
  CompressorWeights cw;
  cw.ratio = ratio;
  cw.hidden_size = hidden_size;
  Rng rng(seed ^ 0xD5A41C0Dull);
  const double sd = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  cw.fused_wkv_wgate.resize(static_cast<size_t>(kLatentDim) * ratio * hidden_size);
  for (auto& v : cw.fused_wkv_wgate)
    v = num::bf16_encode(static_cast<float>(rng.normal() * sd));
  cw.norm_weight.resize(kLatentDim);
  for (auto& v : cw.norm_weight) v = num::bf16_encode(static_cast<float>(1.0 + 0.1 * rng.normal()));
  return cw;
}

CompressorWeights CompressorWeights::from_safetensors(const std::string& path,
                                                      const std::string& layer_prefix) {
  const st::SafetensorsFile f = st::SafetensorsFile::load(path);
  const std::string P = join_prefix(layer_prefix);
  CompressorWeights cw;
  std::string fused = first_present(f, {P + "fused_wkv_wgate.weight", P + "fused_wkv_wgate"});
  if (!fused.empty()) {
    const auto& info = f.info(fused);
    if (info.shape.size() != 2 || (info.shape[0] != 512 && info.shape[0] != 1024) ||
        info.shape[1] <= 0)
      fail(ErrorCode::kFormat,
           fmt::format("{}: tensor '{}' is {}, expected bf16 [512 * ratio, hidden_size]",
                       f.source(), fused, info.describe()));
    cw.ratio = static_cast<int>(info.shape[0] / 512);
    cw.hidden_size = static_cast<int>(info.shape[1]);
    cw.fused_wkv_wgate = load_bf16(f, fused, info.shape);
  } else {
    const std::string wkv = first_present(f, {P + "wkv.weight", P + "wkv"});
    if (wkv.empty())
      fail(ErrorCode::kFormat,
           fmt::format("{}: no compressor projection: expected '{}fused_wkv_wgate[.weight]' or "
                       "'{}wkv[.weight]'",
                       f.source(), P, P));
    const auto& info = f.info(wkv);
    if (info.shape.size() != 2 || info.shape[0] != 512 || info.shape[1] <= 0)
      fail(ErrorCode::kFormat, fmt::format("{}: tensor '{}' is {}, expected bf16 [512, hidden_size]",
                                           f.source(), wkv, info.describe()));
    cw.hidden_size = static_cast<int>(info.shape[1]);
    cw.fused_wkv_wgate = load_bf16(f, wkv, info.shape);
    const std::string wgate = first_present(f, {P + "wgate.weight", P + "wgate"});
    cw.ratio = wgate.empty() ? 1 : 2;
    if (!wgate.empty()) {
      const auto g = load_bf16(f, wgate, info.shape);
      cw.fused_wkv_wgate.insert(cw.fused_wkv_wgate.end(), g.begin(), g.end());
    }
  }
  const std::string norm = first_present(f, {P + "norm.weight", P + "norm"});
  if (norm.empty())
    fail(ErrorCode::kFormat,
         fmt::format("{}: missing tensor '{}norm.weight' (compressor RMSNorm weight, bf16 [512])",
                     f.source(), P));
  cw.norm_weight = load_bf16(f, norm, {kLatentDim});
  return cw;
}

TensorView CompressorWeights::weight_view() const {
  return TensorView::contiguous(const_cast<uint16_t*>(fused_wkv_wgate.data()), DType::BF16,
                                {int64_t{kLatentDim} * ratio, hidden_size});
}

TensorView CompressorWeights::norm_view() const {
  return TensorView::contiguous(const_cast<uint16_t*>(norm_weight.data()), DType::BF16,
                                {kLatentDim});
}

}  // namespace dsv41kv
