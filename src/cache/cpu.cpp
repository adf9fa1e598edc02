// CPU backend of the cache ops: the normative reference the CUDA backend is compared with bit for
// bit (SPEC 0.4 item 2), following SPEC 5.1 / 5.3 / 5.4 / 7.5 literally through the format rules of
// formats/insert.hpp and formats/rope_bf16.hpp. Arguments were validated by the public API
// (cache.cpp, plan.cpp) before any of this runs. Inserts, the query rotation and gathers are split
// over threads by ctx.num_threads; each output is produced by one thread in an order independent of
// the split, so results do not depend on the thread count. save_ring_rows is a serial copy in
// gathered-row order.
#include <cstring>

#include "cache/backend.hpp"
#include "core/parallel.hpp"
#include "formats/rope_bf16.hpp"

namespace dsv41kv::detail::cpu {

namespace {
// The CPU insert rows of validated views.
InsertRows rows_of(const TensorView& latent, const TensorView& positions, const TensorView& table,
                   const TensorView& slots, const CacheView& cache) {
  InsertRows io;
  io.latent = latent.ptr<const uint16_t>();
  io.pos = positions.ptr<const int64_t>();
  io.table = table.ptr<const float>();
  io.slot = slots.ptr<const int64_t>();
  io.cache = cache;
  return io;
}
}  // namespace

void insert(const InsertArgs& a, const InsertPlan& p, const ExecContext& ctx) {
  insert_rows_cpu(rows_of(a.latent, a.positions, a.rope_table, a.slots, a.cache), p.ratio, p.N, ctx);
}

// SPEC 5.4: the insert of SPEC 5.1 with ratio 1 (the one insert loop), then the queries of every
// token (SPEC 9.2), each (token, head) row by one thread.
void swa_insert_q_rope(const SwaInsertArgs& a, const SwaInsertPlan& p, const ExecContext& ctx) {
  const InsertRows io = rows_of(a.kv, a.positions, a.rope_table, a.slot_swa, a.cache);
  insert_rows_cpu(io, kSwaInsertRatio, p.insert.N, ctx);

  const auto* q = a.q.ptr<const uint16_t>();
  auto* out = a.q_out.ptr<uint16_t>();
  parallel_for(p.insert.N, ctx, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* trow = io.table + io.pos[t] * kRopeDim;
      for (int64_t h = 0; h < p.heads; ++h)
        rope_bf16(q + t * p.q_token_stride + h * p.q_head_stride, out + t * p.out_token_stride + h * p.out_head_stride,
                  kLatentDim, trow, RopeDirection::kForward);
      for (int64_t h = p.heads; h < p.heads_out; ++h)
        std::memset(out + t * p.out_token_stride + h * p.out_head_stride, 0, sizeof(uint16_t) * kLatentDim);
    }
  });
}

// SPEC 5.3: out[i] = decode(state at slots[i]) for slots[i] >= 0.
void gather(const GatherArgs& a, const GatherPlan& p, const ExecContext& ctx) {
  const auto* slots = a.slots.ptr<const int64_t>();
  auto* out = a.out.ptr<uint16_t>();
  parallel_for(p.M, ctx, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      if (slots[i] >= 0) read_state(a.cache, slots[i], out + i * p.out_row_stride);
  });
}

// SPEC 7.5: copy prev_rows[g] to ring row ring_write_slots[g] for every g with a slot >= 0,
// serially in g order.
void save_ring_rows(const SaveRingRowsArgs& a, const SaveRingRowsPlan& p, const ExecContext&) {
  const auto* slots = a.ring_write_slots.ptr<const int64_t>();
  const auto* prev = a.prev_rows.ptr<const float>();
  auto* ring = a.ring.ptr<float>();
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t slot = slots[g];
    if (slot < 0) continue;
    float* dst = ring + (slot / p.cap) * p.ring_block_stride + (slot % p.cap) * p.ring_row_stride;
    std::memcpy(dst, prev + g * p.prev_row_stride, sizeof(float) * kRingRowFloats);
  }
}

}  // namespace dsv41kv::detail::cpu
