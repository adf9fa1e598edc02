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
