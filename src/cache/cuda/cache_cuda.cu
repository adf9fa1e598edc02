// CUDA backend of the cache ops (backend.hpp, namespace detail::cuda): validated arguments and
// plans into kernel parameters, launched on ctx.stream. Nothing here allocates, synchronises or
// reads device memory. The latent and the RoPE table must have 16-byte aligned data pointers
// (the insert kernel loads them as 16-byte vectors); caches, slots and gather outputs may have
// any alignment: the kernels test it per row.
#include "cache/backend.hpp"
#include "cache/cuda/params.hpp"
#include "core/cuda/cuda_util.hpp"
#include "core/validate.hpp"
#include "formats/insert.hpp"

#include <string>

#include <utility>

namespace dsv41kv::detail::cuda {

void insert(const InsertArgs& a, const InsertPlan& p, const ExecContext& ctx) {
  if (p.N == 0) return;
  InsertParams k;
  k.latent = a.latent.ptr<const uint16_t>();
  k.pos = a.positions.ptr<const int64_t>();
  k.slot = a.slots.ptr<const int64_t>();
  k.N = p.N;
  k.ratio = p.ratio;
  k.table = a.rope_table.ptr<const float>();
  k.table_rows = p.table_rows;
  k.cache = make_cache_dst(a.cache);
  require_aligned16(k.latent, "insert", "latent");
  require_aligned16(k.table, "insert", "rope_table");
  launch_insert(a.cache.format, k, as_stream(ctx.stream));
}

// SPEC 5.4: the insert kernel with ratio 1 (every token closes its group of one: the bytes of
// insert() with ratio 1), then the query RoPE kernel over every (token, head) row.
void swa_insert_q_rope(const SwaInsertArgs& a, const SwaInsertPlan& p, const ExecContext& ctx) {
  const char* op = "swa_insert_q_rope";
  if (p.insert.N == 0) return;
  for (const auto& [v, name] : {std::pair{&a.q, "q"}, std::pair{&a.q_out, "q_out"}})
    if (v->stride[0] % 8 != 0 || v->stride[1] % 8 != 0)
      bad_arg(op, name,
              "strides [" + std::to_string(v->stride[0]) + ", " + std::to_string(v->stride[1]) +
                  ", 1], expected multiples of 8 elements on cuda (16-byte rows)");
  InsertParams k;
  k.latent = a.kv.ptr<const uint16_t>();
  k.pos = a.positions.ptr<const int64_t>();
  k.slot = a.slot_swa.ptr<const int64_t>();
  k.N = p.insert.N;
  k.ratio = kSwaInsertRatio;
  k.table = a.rope_table.ptr<const float>();
  k.table_rows = p.insert.table_rows;
  k.cache = make_cache_dst(a.cache);
  require_aligned16(k.latent, op, "kv");
  require_aligned16(k.table, op, "rope_table");
  QRopeParams r;
  r.q = a.q.ptr<const uint16_t>();
  r.q_ts = p.q_token_stride;
  r.q_hs = p.q_head_stride;
  r.out = a.q_out.ptr<uint16_t>();
  r.o_ts = p.out_token_stride;
  r.o_hs = p.out_head_stride;
  r.T = p.insert.N;
  r.H = static_cast<int>(p.heads);
  r.H_pad = static_cast<int>(p.heads_out);
  r.pos = k.pos;
  r.table = k.table;
  r.table_rows = k.table_rows;
  require_aligned16(r.q, op, "q");
  require_aligned16(r.out, op, "q_out");
  launch_insert(a.cache.format, k, as_stream(ctx.stream));
  launch_q_rope(r, as_stream(ctx.stream));
}

void gather(const GatherArgs& a, const GatherPlan& p, const ExecContext& ctx) {
  if (p.M == 0) return;
  const CacheView& c = a.cache;
  const RecordInfo& ri = record_info(c.format);
  const int64_t es = static_cast<int64_t>(dtype_size(ri.element));
  GatherParams k;
  k.base = static_cast<const uint8_t*>(c.base);
  k.S = c.states_per_page;
  k.page_stride_bytes = c.page_stride * es;
  k.row_stride_bytes = c.row_stride * es;
  k.capacity = p.capacity;
  k.fp8_scale = c.fp8_scale;
  k.slot = a.slots.ptr<const int64_t>();
  k.M = p.M;
  k.out = a.out.ptr<uint16_t>();
  k.out_stride = p.out_row_stride;
  launch_gather(c.format, k, as_stream(ctx.stream));
}

void save_ring_rows(const SaveRingRowsArgs& a, const SaveRingRowsPlan& p, const ExecContext& ctx) {
  if (p.G == 0) return;
  SaveRowsParams k;
  k.prev = a.prev_rows.ptr<const float>();
  k.prev_stride = p.prev_row_stride;
  k.slot = a.ring_write_slots.ptr<const int64_t>();
  k.G = p.G;
  k.ring = a.ring.ptr<float>();
  k.ring_bs = p.ring_block_stride;
  k.ring_rs = p.ring_row_stride;
  k.cap = p.cap;
  k.ring_slots = p.ring_blocks * p.cap;
  require_aligned16(k.prev, "save_ring_rows", "prev_rows");
  launch_save_ring_rows(k, as_stream(ctx.stream));
}

}  // namespace dsv41kv::detail::cuda
