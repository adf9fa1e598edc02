// The insert rule of SPEC 5.1 (insert.hpp).
#include "formats/insert.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.hpp"
#include "core/validate.hpp"
#include "dsv41kv/numerics.hpp"
#include "formats/e4m3_avx512.hpp"

namespace dsv41kv::detail {

InsertPlan plan_insert(const char* op, const InsertViews& v, bool require_latent) {
  const bool swa = v.kind == InsertKind::kSwa;
  if (swa) {
    if (v.ratio != kSwaInsertRatio)
      bad_arg(op, "ratio", fmt::format("{}, expected {} (the SWA insert, SPEC 5.4)", v.ratio, kSwaInsertRatio));
  } else {
    need_ratio(op, v.ratio, ErrorCode::kCompressorRatio, "compressor ratio, SPEC 1.2");
  }
  InsertPlan p;
  p.ratio = v.ratio;
  p.N = need_vector(op, *v.slots, v.slots_arg, DType::I64,
                    swa ? "i64 [N] SWA slots" : "i64 [N] compressed-cache slots");
  p.device = v.slots->device;
  if (require_latent || v.latent->present()) {
    need_rows(op, *v.latent, v.latent_arg, DType::BF16, kLatentDim, p.N, "bf16 [rows >= N, 512]");
    need_contiguous(op, *v.latent, v.latent_arg);
  }
  need_vector(op, *v.positions, "positions", DType::I64, "i64 [>= N] positions", p.N);
  need_rows(op, *v.rope_table, "rope_table", DType::F32, kRopeDim, 1, "f32 [table_rows >= 1, 64]");
  need_contiguous(op, *v.rope_table, "rope_table");
  p.table_rows = v.rope_table->shape[0];
  const std::string cache_arg = fmt::format("{}: cache", op);
  validate_cache(*v.cache, cache_arg.c_str());
  if (swa && v.cache->format == RecordFormat::NVFP4_288)
    bad_arg(op, "cache",
            fmt::format("format {}, expected v4_584 or mxfp8_528 (the platform's record, SPEC 3.4) or plain bf16 / "
                        "fp8 rows",
                        record_info(v.cache->format).name));
  p.capacity = v.cache->num_pages * v.cache->states_per_page;

  need_device(op, *v.latent, v.latent_arg, p.device, v.slots_arg);
  need_device(op, *v.positions, "positions", p.device, v.slots_arg);
  need_device(op, *v.rope_table, "rope_table", p.device, v.slots_arg);
  if (v.cache->device != p.device)
    bad_arg(op, "cache",
            fmt::format("on {}, expected {} like {} (all views of one call on one device)",
                        device_name(v.cache->device), device_name(p.device), v.slots_arg));
  return p;
}

void check_written_token_values(const char* op, const char* slots_arg, const int64_t* slot, const int64_t* pos,
                                int64_t N, int ratio, int64_t capacity, const std::string& capacity_text,
                                int64_t table_rows) {
  for (int64_t t = 0; t < N; ++t) {
    if (slot[t] < 0) continue;  // skipped: the position is not read
    if (slot[t] >= capacity)
      bad_arg(op, slots_arg,
              fmt::format("{}[{}] = {}, expected < {} = {} (or < 0 to skip)", slots_arg, t, slot[t], capacity_text,
                          capacity));
    if (pos[t] < 0) bad_arg(op, "positions", fmt::format("positions[{}] = {}, expected >= 0", t, pos[t]));
    if (!closes_group(pos[t], ratio)) continue;
    const int64_t row = rope_row(pos[t], ratio);
    if (row >= table_rows)
      bad_arg(op, "positions",
              fmt::format("positions[{}] = {} needs RoPE table row {}: a position beyond the RoPE table of {} "
                          "rows, expected row < {}",
                          t, pos[t], row, table_rows, table_rows));
  }
}

void check_insert_values(const char* op, const InsertViews& v, const InsertPlan& p) {
  check_written_token_values(
      op, v.slots_arg, v.slots->ptr<const int64_t>(), v.positions->ptr<const int64_t>(), p.N, p.ratio, p.capacity,
      fmt::format("num_pages * states_per_page = {} * {}", v.cache->num_pages, v.cache->states_per_page),
      p.table_rows);
}

void rope_latent_row(const uint16_t* latent, const float* trow, float* x, float* y) {
  for (int d = 0; d < kLatentDim; ++d) x[d] = num::bf16_decode(latent[d]);
  std::memcpy(y, x, sizeof(float) * kLatentDim);
  num::rope_forward_dims(y + kNopeDim, trow);
}

void write_state(const CacheView& c, int64_t slot, const float* x, const float* y, float fp8_inv) {
  const int64_t page = slot / c.states_per_page, off = slot % c.states_per_page;
  switch (c.format) {
    case RecordFormat::V4_584:
      rec::write_v4_584(static_cast<uint8_t*>(c.base) + page * c.page_stride, c.states_per_page, off, x, y);
      break;
    case RecordFormat::MXFP8_528:
      rec::write_mxfp8_528(static_cast<uint8_t*>(c.base) + page * c.page_stride, c.states_per_page, off, y);
      break;
    case RecordFormat::NVFP4_288:
      rec::write_nvfp4_288(static_cast<uint8_t*>(c.base) + page * c.page_stride, c.states_per_page, off, y);
      break;
    case RecordFormat::PLAIN_BF16:
      rec::write_plain_bf16(static_cast<uint16_t*>(c.base) + page * c.page_stride + off * c.row_stride, y);
      break;
    case RecordFormat::PLAIN_FP8:
      rec::write_plain_fp8(static_cast<uint8_t*>(c.base) + page * c.page_stride + off * c.row_stride, y, fp8_inv);
      break;
  }
}

void read_state(const CacheView& c, int64_t slot, uint16_t* o) {
  const int64_t page = slot / c.states_per_page, off = slot % c.states_per_page;
  const auto* pg = static_cast<const uint8_t*>(c.base) + page * c.page_stride;
  switch (c.format) {
    case RecordFormat::V4_584:
      for (int d = 0; d < kLatentDim; ++d) o[d] = rec::read_v4_584(pg, c.states_per_page, off, d);
      break;
    case RecordFormat::MXFP8_528:
      for (int d = 0; d < kLatentDim; ++d) o[d] = rec::read_mxfp8_528(pg, c.states_per_page, off, d);
      break;
    case RecordFormat::NVFP4_288:
      for (int d = 0; d < kLatentDim; ++d) o[d] = rec::read_nvfp4_288(pg, c.states_per_page, off, d);
      break;
    case RecordFormat::PLAIN_BF16:
      std::memcpy(o, static_cast<const uint16_t*>(c.base) + page * c.page_stride + off * c.row_stride,
                  sizeof(uint16_t) * kLatentDim);
      break;
    case RecordFormat::PLAIN_FP8: {
      const auto* row = static_cast<const uint8_t*>(c.base) + page * c.page_stride + off * c.row_stride;
      for (int d = 0; d < kLatentDim; ++d) o[d] = rec::read_plain_fp8(row, d, c.fp8_scale);
      break;
    }
  }
}

namespace {

// e4m3 and e2m1 values as fp32; the NaN codes as the reader's NaN (bf16_decode(0x7FC0)), which an
// exact product with a finite scale returns unchanged.
struct DecodeTables {
  float e4m3[256];
  float e2m1[16];
  DecodeTables() {
    for (int q = 0; q < 256; ++q)
      e4m3[q] = (q & 0x7F) == 0x7F ? num::bf16_decode(0x7FC0) : num::e4m3_decode(static_cast<uint8_t>(q));
    for (int n = 0; n < 16; ++n) e2m1[n] = num::e2m1_decode(static_cast<uint8_t>(n));
  }
};
const DecodeTables& decode_tables() {
  static const DecodeTables t;
  return t;
}
// From this UE8M0 byte on, the smallest non-zero e4m3 value times the scale is 2^-9 * 2^(20 - 127)
// = 2^-116, a normal fp32 (byte 255 is the infinite scale and takes the reader).
constexpr int kExactUe8m0Min = 20;

// The first `tiles` UE8M0 tiles of `tile` e4m3 values of the state `off` of a page of layout L, as
// the record's reader gives them.
template <class L>
void ue8m0_tiles_f32(const uint8_t* pg, int64_t S, int64_t off, int tiles, int tile, float* o,
                     uint16_t (*read)(const uint8_t*, int64_t, int64_t, int)) {
  const uint8_t* val = pg + L::value_offset(S, off);
  const uint8_t* sc = pg + L::scale_offset(S, off);
  const float* t = decode_tables().e4m3;
  for (int k = 0; k < tiles; ++k) {
    float* ok = o + tile * k;
    if (sc[k] < kExactUe8m0Min || sc[k] == 255) {
      for (int i = 0; i < tile; ++i) ok[i] = num::bf16_decode(read(pg, S, off, tile * k + i));
      continue;
    }
    const float f = num::ue8m0_scale(sc[k]);
    for (int i = 0; i < tile; ++i) ok[i] = num::mul_rn(t[val[tile * k + i]], f);
  }
}

#if defined(DSV41KV_AVX512_FORMS)
// ue8m0_tiles_f32 16 values at a time: a tile with an exact scale as mul_rn(value, f) of the same
// fp32 value (the fp16 route of formats/e4m3_avx512.hpp times 2^8, exact; the NaN codes the
// table's NaN, which the product returns unchanged), the other tiles through the reader.
template <class L>
DSV41KV_AVX512 void ue8m0_tiles_f32_avx512(const uint8_t* pg, int64_t S, int64_t off, int tiles, int tile, float* o,
                                           uint16_t (*read)(const uint8_t*, int64_t, int64_t, int)) {
  const uint8_t* val = pg + L::value_offset(S, off);
  const uint8_t* sc = pg + L::scale_offset(S, off);
  const __m512 unscale = _mm512_set1_ps(e4m3x16::kUnscale);
  const __m512 nan = _mm512_set1_ps(decode_tables().e4m3[0x7F]);
  for (int k = 0; k < tiles; ++k) {
    float* ok = o + tile * k;
    if (sc[k] < kExactUe8m0Min || sc[k] == 255) {
      for (int i = 0; i < tile; ++i) ok[i] = num::bf16_decode(read(pg, S, off, tile * k + i));
      continue;
    }
    const __m512 f = _mm512_set1_ps(num::ue8m0_scale(sc[k]));
    for (int i = 0; i < tile; i += 16) {
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(val + tile * k + i));
      const __m512 v = _mm512_mask_mov_ps(_mm512_mul_ps(e4m3x16::scaled(c), unscale), e4m3x16::nan_lanes(c), nan);
      _mm512_storeu_ps(ok + i, _mm512_mul_ps(v, f));
    }
  }
}

// The 64 bf16 RoPE values of a 584 record widened (bits << 16), 16 at a time.
DSV41KV_AVX512 void v4_rope_f32_avx512(const uint8_t* pg, int64_t S, int64_t off, float* o) {
  const uint8_t* rope = pg + V4Layout::value_offset(S, off) + kNopeDim;
  for (int i = 0; i < kLatentDim - kNopeDim; i += 16) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rope + 2 * i));
    _mm512_storeu_si512(o + kNopeDim + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
}
#endif

}  // namespace

void read_state_f32(const CacheView& c, int64_t slot, float* o, CpuForm form) {
  const int64_t S = c.states_per_page, page = slot / S, off = slot % S;
  const auto* pg = static_cast<const uint8_t*>(c.base) + page * c.page_stride;
#if defined(DSV41KV_AVX512_FORMS)
  if (form == CpuForm::kAvx512 && c.format == RecordFormat::V4_584) {
    ue8m0_tiles_f32_avx512<V4Layout>(pg, S, off, 7, 64, o, rec::read_v4_584);
    v4_rope_f32_avx512(pg, S, off, o);
    return;
  }
  if (form == CpuForm::kAvx512 && c.format == RecordFormat::MXFP8_528) {
    ue8m0_tiles_f32_avx512<Mxfp8Layout>(pg, S, off, 16, 32, o, rec::read_mxfp8_528);
    return;
  }
#else
  (void)form;
#endif
  switch (c.format) {
    case RecordFormat::V4_584:
      ue8m0_tiles_f32<V4Layout>(pg, S, off, 7, 64, o, rec::read_v4_584);
      for (int d = kNopeDim; d < kLatentDim; ++d) o[d] = num::bf16_decode(rec::read_v4_584(pg, S, off, d));
      break;
    case RecordFormat::MXFP8_528:
      ue8m0_tiles_f32<Mxfp8Layout>(pg, S, off, 16, 32, o, rec::read_mxfp8_528);
      break;
    case RecordFormat::NVFP4_288: {
      const uint8_t* val = pg + Nvfp4Layout::value_offset(S, off);
      const uint8_t* sc = pg + Nvfp4Layout::scale_offset(S, off);
      const DecodeTables& t = decode_tables();
      for (int k = 0; k < 32; ++k) {
        if ((sc[k] & 0x7F) == 0x7F) {  // NaN scale: the reader's canonical NaN
          for (int i = 0; i < 16; ++i) o[16 * k + i] = num::bf16_decode(rec::read_nvfp4_288(pg, S, off, 16 * k + i));
          continue;
        }
        const float f = t.e4m3[sc[k]];
        for (int i = 0; i < 8; ++i) {
          const uint8_t b = val[8 * k + i];
          o[16 * k + 2 * i] = num::mul_rn(t.e2m1[b & 0xF], f);
          o[16 * k + 2 * i + 1] = num::mul_rn(t.e2m1[b >> 4], f);
        }
      }
      break;
    }
    case RecordFormat::PLAIN_BF16: {
      const uint16_t* row = static_cast<const uint16_t*>(c.base) + page * c.page_stride + off * c.row_stride;
      for (int d = 0; d < kLatentDim; ++d) o[d] = num::bf16_decode(row[d]);
      break;
    }
    case RecordFormat::PLAIN_FP8: {
      const uint8_t* row = pg + off * c.row_stride;
      for (int d = 0; d < kLatentDim; ++d) o[d] = num::bf16_decode(rec::read_plain_fp8(row, d, c.fp8_scale));
      break;
    }
  }
}

bool has_duplicate_writes(const int64_t* slot, const int64_t* pos, const uint8_t* mask, int ratio, int64_t N) {
  std::vector<int64_t> s;
  s.reserve(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t)
    if (writes_token(slot, pos, mask, ratio, t)) s.push_back(slot[t]);
  std::sort(s.begin(), s.end());
  return std::adjacent_find(s.begin(), s.end()) != s.end();
}

void insert_rows_cpu(const InsertRows& io, int ratio, int64_t N, const ExecContext& ctx) {
  const float inv = io.cache.format == RecordFormat::PLAIN_FP8 ? num::div_rn(1.0f, io.cache.fp8_scale) : 1.0f;
  for_each_written_token(io.slot, io.pos, io.mask, ratio, N, ctx, [&](int64_t t) {
    float x[kLatentDim], y[kLatentDim];
    rope_latent_row(io.latent + t * kLatentDim, io.table + rope_row(io.pos[t], ratio) * kRopeDim, x, y);
    write_state(io.cache, io.slot[t], x, y, inv);
  });
}

}  // namespace dsv41kv::detail
