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
