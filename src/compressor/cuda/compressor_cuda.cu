// CUDA backend of the compressor API (backend.hpp, namespace detail::cuda): turns validated
// arguments and plans into kernel parameters and launches on ctx.stream. Nothing here
// allocates, synchronises or reads device memory; launch geometry depends only on N, num_reqs
// and the record format (SPEC 0.4 item 4), so every call can be captured in a CUDA graph.
//
// Host checks added on top of the shared validation (validate.cpp): the CUDA kernels move rows
// with 16-byte vectors, so kv_score, prev_rows, latent/latent_out, norm_weight and the RoPE
// table must have 16-byte aligned data pointers (their row strides are multiples of 16 elements
// or fixed). The ring (arbitrary block stride), caches (arbitrary page strides), slots and the
// outputs of gather may have any alignment: the kernels test it per row.
#include <algorithm>
#include <string>

#include "compressor/backend.hpp"
#include "compressor/cuda/params.hpp"
#include "dsv41kv/tuning.hpp"
#include "core/cuda/cuda_util.hpp"
#include "core/cuda/tensor_map.hpp"

namespace dsv41kv::detail::cuda {


// No L2 promotion: with the 256-byte promotion each 128-byte line request of a row fetched a
// 256-byte granule, and the kernels' L2 read sectors rose by ~16 per row (ncu, nvfp4 256K). 256K
// ratio 1 measured faster without it for every record (by far the most for v4 / mxfp8); the
// 128-byte promotion measured the same as none (docs/changelog.md, v26).
CUtensorMap kv_rows_tensor_map(const float* kv, int64_t rows, int64_t row_stride, bool swizzle) {
  const cuuint64_t dim[3] = {32, 16, static_cast<cuuint64_t>(rows)};
  const cuuint64_t stride[2] = {128, static_cast<cuuint64_t>(row_stride) * sizeof(float)};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {32, 16, 1};
  return f32_tensor_map<3>(kv, dim, stride, box, swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                           CU_TENSOR_MAP_L2_PROMOTION_NONE, [&] {
                             return "the kv rows (rows " + std::to_string(rows) + ", row stride " +
                                    std::to_string(row_stride) + " floats)";
                           });
}
CUtensorMap rope_table_tensor_map(const float* table, int64_t rows) {
  const cuuint64_t dim[2] = {static_cast<cuuint64_t>(kRopeDim), static_cast<cuuint64_t>(rows)};
  const cuuint64_t stride[1] = {kRopeDim * sizeof(float)};  // bytes, dim 1
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kRopeDim), 1};
  return f32_tensor_map<2>(table, dim, stride, box, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           [&] { return "the RoPE table (rows " + std::to_string(rows) + ")"; });
}
// The launcher's shape (see params.hpp). Why a tapered tail: in a grid of one chunk per
// warp the last wave's blocks start as the previous ones end, spread over one block lifetime,
// and end as spread out while DRAM empties; shorter shares at the end shorten that ramp. At 256K
// ratio 1 this tail (half a wave of 4, one wave of 2, a quarter wave of 1) measured faster than
// no tail for every record, and faster than one wave of 4 then one of 2 or one wave of 2 alone;
// head parts (shorter shares in the first wave) added nothing (docs/changelog.md, v20).
StreamShape stream_shape_r1(int64_t N, int64_t C, int64_t fit, const StreamTaper& tp) {
  // Wk waves of the resident warps, at least one warp
  const auto part = [&](double waves, int chunk) {
    return StreamPart{std::max<int64_t>(1, static_cast<int64_t>(waves * 4.0 * static_cast<double>(fit))), chunk};
  };
  StreamShape shape;
  if (tp.set) {
    for (int k = 0; k < tp.nhead; ++k)
      if (tp.head_chunk[k] < C) shape.head[shape.nhead++] = part(tp.head_waves[k], tp.head_chunk[k]);
    for (int k = 0; k < tp.ntail; ++k)
      if (tp.tail_chunk[k] < C) shape.tail[shape.ntail++] = part(tp.tail_waves[k], tp.tail_chunk[k]);
  } else if ((N + 4 * C - 1) / (4 * C) >= 2 * fit) {
    // chunk-16 grids (the ratio-1 NVFP4 kernel): half a wave of 8, half of 4, a quarter of 2
    // (at 256K with the TMA kernel a little faster than the chunk-8 shape, which the other
    // shapes tried did not beat: docs/changelog.md, v28); chunk 8: the shape measured above
    const bool c16 = C >= kChunkSmall;
    shape.ntail = 3;
    shape.tail[0] = part(0.5, c16 ? 8 : 4);
    shape.tail[1] = part(c16 ? 0.5 : 1.0, c16 ? 4 : 2);
    shape.tail[2] = part(0.25, c16 ? 2 : 1);
  }
  return shape;
}

namespace {

CompressParams make_compress_params(const CompressArgs& a, const CompressPlan& p, const char* op,
                                    bool with_latent, const ExecContext& ctx) {
  CompressParams k;
  k.early_meta = ctx.programmatic_launch && ctx.pdl_early_metadata ? 1 : 0;
  k.kv = a.kv_score.ptr<const float>();
  k.kv_stride = p.kv_row_stride;
  k.pos = a.positions.ptr<const int64_t>();
  k.slot = a.slot_mapping.ptr<const int64_t>();
  k.N = p.N;
  k.norm_w = a.norm_weight.ptr<const uint16_t>();
  k.eps = a.eps;
  k.latent = with_latent ? a.latent_out.ptr<uint16_t>() : nullptr;
  require_aligned16(k.kv, op, "kv_score");
  require_aligned16(k.norm_w, op, "norm_weight");
  if (k.latent) require_aligned16(k.latent, op, "latent_out");
  if (p.ratio == 2) {
    k.ring = a.ring.ptr<float>();
    k.ring_bs = p.ring_block_stride;
    k.ring_rs = p.ring_row_stride;
    k.cap_div = FastDivmod::make(p.cap);
    k.ring_slots = p.ring_blocks * p.cap;
    k.qsl = a.qsl.ptr<const int32_t>();
    k.t2r = a.token_to_req.ptr<const int32_t>();
    k.num_reqs = p.num_reqs;
    k.pcp = p.pcp ? 1 : 0;
    if (p.pcp && a.prev_rows.present()) {
      k.prev = a.prev_rows.ptr<const float>();
      k.prev_stride = p.prev_row_stride;
      k.prev_count = p.prev_rows;
      k.prev_idx = a.prev_row_indices.ptr<const int64_t>();
      k.prev_n = p.prev_indices;
      if (k.prev_count > 0) require_aligned16(k.prev, op, "prev_rows");
    }
  }
  return k;
}

// f: kNoRecord (compress only) or a record format (the fused compress_insert).
void launch_compress_format(int f, const CompressParams& k, int ratio, const ExecContext& ctx) {
  const cudaStream_t st = as_stream(ctx.stream);
  const bool pdl = ctx.programmatic_launch;
  static const CompressTuning kDefault{};
  const CompressTuning& tn = ctx.compress_tuning != nullptr ? *ctx.compress_tuning : kDefault;
  if (f == kNoRecord) launch_compress<kNoRecord>(k, ratio, st, pdl, tn);
  else with_record_format(static_cast<RecordFormat>(f), [&](auto F) { launch_compress<F()>(k, ratio, st, pdl, tn); });
}

}  // namespace

void compress(const CompressArgs& a, const CompressPlan& p, const ExecContext& ctx) {
  if (p.N == 0) return;
  const CompressParams k = make_compress_params(a, p, "compress", true, ctx);
  launch_compress_format(kNoRecord, k, p.ratio, ctx);
}

void compress_insert(const CompressInsertArgs& a, const CompressPlan& cp, const InsertPlan& ip,
                     const ExecContext& ctx) {
  if (cp.N == 0) return;
  CompressParams k =
      make_compress_params(a.compress, cp, "compress_insert", a.compress.latent_out.present(), ctx);
  k.table = a.rope_table.ptr<const float>();
  k.table_rows = ip.table_rows;
  k.ins_slot = a.insert_slots.ptr<const int64_t>();
  k.cache = make_cache_dst(a.cache);
  require_aligned16(k.table, "compress_insert", "rope_table");
  launch_compress_format(static_cast<int>(a.cache.format), k, cp.ratio, ctx);
}

}  // namespace dsv41kv::detail::cuda
