// Host-side validation of the cache ops (SPEC 0.4 item 3, 5.1, 5.3, 7.5) with the validation
// kit (core/validate.hpp): E3 for a ratio outside {1, 2}, E8 otherwise, with a message
// "<op>: <argument>: <what was found>, expected <what is required>".
#include <fmt/format.h>

#include <span>

#include "cache/backend.hpp"
#include "core/validate.hpp"

namespace dsv41kv::detail {

InsertViews insert_views(const InsertArgs& a) {
  InsertViews v;
  v.ratio = a.ratio;
  v.latent = &a.latent;
  v.positions = &a.positions;
  v.rope_table = &a.rope_table;
  v.slots = &a.slots;
  v.cache = &a.cache;
  return v;
}

InsertViews swa_insert_views(const SwaInsertArgs& a) {
  InsertViews v;
  v.kind = InsertKind::kSwa;
  v.ratio = kSwaInsertRatio;
  v.latent = &a.kv;
  v.latent_arg = "kv";
  v.positions = &a.positions;
  v.rope_table = &a.rope_table;
  v.slots = &a.slot_swa;
  v.slots_arg = "slot_swa";
  v.cache = &a.cache;
  return v;
}

namespace {

// bf16 [rows >= T, heads >= 1, 512], inner stride 1, heads and rows that do not overlap
// (head stride >= 512, token stride >= (heads - 1) * head stride + 512).
void need_head_rows(const char* op, const TensorView& v, const char* arg, int64_t T) {
  need_present(op, v, arg, "bf16 [rows >= T, heads, 512]");
  need_dtype(op, v, arg, DType::BF16);
  need_ndim(op, v, arg, 3);
  if (v.shape[2] != kLatentDim)
    bad_arg(op, arg, fmt::format("shape[2] = {}, expected 512 ({})", v.shape[2], v.describe()));
  if (v.shape[1] < 1) bad_arg(op, arg, fmt::format("{} heads, expected >= 1 ({})", v.shape[1], v.describe()));
  if (v.shape[0] < T)
    bad_arg(op, arg, fmt::format("{} rows, expected at least T = {} ({})", v.shape[0], T, v.describe()));
  if (v.stride[2] != 1) bad_arg(op, arg, fmt::format("inner stride {}, expected 1 ({})", v.stride[2], v.describe()));
  if (v.shape[1] > 1 && v.stride[1] < kLatentDim)
    bad_arg(op, arg, fmt::format("head stride {}, expected >= 512 ({})", v.stride[1], v.describe()));
  const int64_t row = (v.shape[1] - 1) * v.stride[1] + kLatentDim;
  if (v.shape[0] > 1 && v.stride[0] < row)
    bad_arg(op, arg,
            fmt::format("token stride {}, expected >= (heads - 1) * head stride + 512 = {} ({})", v.stride[0], row,
                        v.describe()));
  need_data(op, v, arg);
}

// True when the bytes two present views address intersect.
bool overlaps(const TensorView& a, const TensorView& b) {
  int64_t na = 0, nb = 0;
  if (!a.span_bytes(na) || !b.span_bytes(nb) || na == 0 || nb == 0) return false;
  const auto* pa = static_cast<const char*>(a.data);
  const auto* pb = static_cast<const char*>(b.data);
  return pa < pb + nb && pb < pa + na;
}

}  // namespace

SwaInsertPlan plan_swa_insert(const SwaInsertArgs& a, const InsertViews& v) {
  static constexpr const char* op = "swa_insert_q_rope";
  SwaInsertPlan p;
  p.insert = plan_insert(op, v, true);
  const int64_t T = p.insert.N;
  need_head_rows(op, a.q, "q", T);
  need_head_rows(op, a.q_out, "q_out", T);
  p.heads = a.q.shape[1];
  p.heads_out = a.q_out.shape[1];
  if (!(p.heads_out == p.heads || ((p.heads_out == 64 || p.heads_out == 128) && p.heads_out > p.heads)))
    bad_arg(op, "q_out",
            fmt::format("{} heads for H = {} query heads, expected H_pad = H, or 64 or 128 (> H) with the padded "
                        "heads zeroed",
                        p.heads_out, p.heads));
  const bool in_place = a.q_out.data == a.q.data && a.q_out.stride == a.q.stride && p.heads_out == p.heads;
  if (!in_place && overlaps(a.q, a.q_out))
    bad_arg(op, "q_out",
            fmt::format("overlaps q ({} vs {}), expected disjoint memory or q itself (same data and strides, "
                        "H_pad == H)",
                        a.q_out.describe(), a.q.describe()));
  p.q_token_stride = a.q.stride[0];
  p.q_head_stride = a.q.stride[1];
  p.out_token_stride = a.q_out.stride[0];
  p.out_head_stride = a.q_out.stride[1];
  need_device(op, a.q, "q", p.insert.device, "slot_swa");
  need_device(op, a.q_out, "q_out", p.insert.device, "slot_swa");
  return p;
}

void check_swa_insert_values(const SwaInsertArgs& a, const InsertViews& v, const SwaInsertPlan& p) {
  static constexpr const char* op = "swa_insert_q_rope";
  check_insert_values(op, v, p.insert);
  const auto* pos = a.positions.ptr<const int64_t>();
  for (int64_t t = 0; t < p.insert.N; ++t) {
    if (pos[t] < 0)
      bad_arg(op, "positions", fmt::format("positions[{}] = {}, expected >= 0 (its queries are rotated)", t, pos[t]));
    if (pos[t] >= p.insert.table_rows)
      bad_arg(op, "positions",
              fmt::format("positions[{}] = {} needs RoPE table row {} for its queries: a position beyond the RoPE "
                          "table of {} rows, expected row < {}",
                          t, pos[t], pos[t], p.insert.table_rows, p.insert.table_rows));
  }
}

GatherPlan plan_gather(const GatherArgs& a) {
  const char* op = "gather";
  GatherPlan p;
  p.M = need_vector(op, a.slots, "slots", DType::I64, "i64 [M] slots");
  p.device = a.slots.device;
  need_rows(op, a.out, "out", DType::BF16, kLatentDim, p.M, "bf16 [M, 512]");
  if (a.out.shape[0] > 1 && a.out.stride[0] < kLatentDim)
    bad_arg(op, "out", fmt::format("row stride {}, expected >= 512 ({})", a.out.stride[0], a.out.describe()));
  p.out_row_stride = a.out.stride[0];
  validate_cache(a.cache, "gather: cache");
  p.capacity = a.cache.num_pages * a.cache.states_per_page;
  need_device(op, a.out, "out", p.device, "slots");
  if (a.cache.device != p.device)
    bad_arg(op, "cache",
            fmt::format("on {}, expected {} like slots", device_name(a.cache.device), device_name(p.device)));
  return p;
}

void check_gather_values(const GatherArgs& a, const GatherPlan& p) {
  check_slots_below("gather", "slots", std::span(a.slots.ptr<const int64_t>(), static_cast<size_t>(p.M)), p.capacity,
                    "num_pages * states_per_page");
}

SaveRingRowsPlan plan_save_ring_rows(const SaveRingRowsArgs& a) {
  const char* op = "save_ring_rows";
  SaveRingRowsPlan p;
  p.G = need_vector(op, a.ring_write_slots, "ring_write_slots", DType::I64, "i64 [G]");
  p.device = a.ring_write_slots.device;
  need_rows(op, a.prev_rows, "prev_rows", DType::F32, kRingRowFloats, 0, "f32 [G, 1024]");
  need_row_stride16(op, a.prev_rows, "prev_rows");
  if (a.prev_rows.shape[0] != p.G)
    bad_arg(op, "prev_rows",
            fmt::format("{} rows, expected G = {} (ring_write_slots length)", a.prev_rows.shape[0], p.G));
  p.prev_row_stride = a.prev_rows.stride[0];
  const RingGeom g = need_ring(op, a.ring, "ring");
  p.cap = g.cap;
  p.ring_blocks = g.blocks;
  p.ring_block_stride = g.block_stride;
  p.ring_row_stride = g.row_stride;
  need_device(op, a.prev_rows, "prev_rows", p.device, "ring_write_slots");
  need_device(op, a.ring, "ring", p.device, "ring_write_slots");
  return p;
}

void check_save_ring_rows_values(const SaveRingRowsArgs& a, const SaveRingRowsPlan& p) {
  check_slots_below("save_ring_rows", "ring_write_slots",
                    std::span(a.ring_write_slots.ptr<const int64_t>(), static_cast<size_t>(p.G)),
                    p.ring_blocks * p.cap, fmt::format("ring blocks * cap = {} * {}", p.ring_blocks, p.cap));
}

}  // namespace dsv41kv::detail
