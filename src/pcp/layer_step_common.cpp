#include "pcp/layer_step_common.hpp"

#include <fmt/format.h>

#include "core/validate.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::pcp::step_common {

void check_view(const char* op, const TensorView& v, const char* name, DType dt, int64_t rows,
                int64_t cols, Device device) {
  const std::string what = cols == 0 ? fmt::format("{} [>= {}]", dtype_name(dt), rows)
                                     : fmt::format("{} [>= {}, {}] with inner stride 1", dtype_name(dt), rows, cols);
  detail::need_present(op, v, name, what.c_str());
  detail::need_on(op, v, name, device);
  if (cols == 0) detail::need_vector(op, v, name, dt, what.c_str(), rows);
  else detail::need_rows(op, v, name, dt, cols, rows, what.c_str());
}

int64_t check_step_views(const char* op, const LayerStepArgs& a, int P, Device device) {
  detail::need_present(op, a.positions, "positions", "i64 [padded]");
  detail::need_ndim(op, a.positions, "positions", 1);
  const int64_t padded = a.positions.shape[0];
  const int64_t G = static_cast<int64_t>(P) * padded;
  check_view(op, a.positions, "positions", DType::I64, padded, 0, device);
  check_view(op, a.kv_score, "kv_score", DType::F32, padded, static_cast<int64_t>(kLatentDim) * a.ratio, device);
  check_view(op, a.latent, "latent", DType::BF16, padded, kLatentDim, device);
  detail::need_contiguous(op, a.latent, "latent");
  check_view(op, a.gathered_latent, "gathered_latent", DType::BF16, G, kLatentDim, device);
  detail::need_contiguous(op, a.gathered_latent, "gathered_latent");
  check_view(op, a.gathered_positions, "gathered_positions", DType::I64, G, 0, device);
  check_view(op, a.gathered_cslots, "gathered_cslots", DType::I64, G, 0, device);
  if (a.gathered_cslots.shape[0] != G)
    detail::bad_arg(op, "gathered_cslots",
                    fmt::format("{} entries, expected exactly P * padded = {} ({})", a.gathered_cslots.shape[0], G,
                                a.gathered_cslots.describe()));
  return padded;
}

void open_row_compress(const LayerStepArgs& a, int64_t padded, const TensorView& slot_mapping,
                       const TensorView& prev_rows, const TensorView& prev_row_indices,
                       const TensorView& ring_write_slots, const ExecContext& ctx) {
  if (padded <= 0) return;
  CompressArgs c;
  c.ratio = a.ratio;
  c.kv_score = a.kv_score;
  c.positions = a.positions;
  c.slot_mapping = slot_mapping;
  c.norm_weight = a.norm_weight;
  c.eps = a.eps;
  c.latent_out = a.latent;
  if (a.ratio == 2) {
    c.ring = a.ring;
    c.qsl = a.qsl;
    c.token_to_req = a.token_to_req;
    c.token_to_req.shape[0] = padded;
    c.policy = RingPolicy::kOpenRow;
    c.prev_rows = prev_rows;
    c.prev_row_indices = prev_row_indices;
  }
  compress(c, ctx);
  if (a.ratio == 2 && !faults_of(a).skip_save_ring_rows && prev_rows.present()) {
    SaveRingRowsArgs s;
    s.prev_rows = prev_rows;
    s.ring_write_slots = ring_write_slots;
    s.ring = a.ring;
    save_ring_rows(s, ctx);
  }
}

CommVolume layer_volume(int P, int64_t padded, int64_t num_rows, int ratio) {
  CommVolume v = expected_comm_volume(P, padded, num_rows, ratio);
  v.positions_sent = v.positions_received = 0;
  return v;
}

void gather_latents_and_insert(const LayerStepArgs& a, Communicator& comm, int64_t padded,
                               Device device, const ExecContext& ctx) {
  const int64_t G = static_cast<int64_t>(comm.size()) * padded;
  const size_t bytes = static_cast<size_t>(padded) * kLatentDim * 2;
  comm.all_gather(a.latent.data, bytes, a.gathered_latent.data, device, ctx);
  if (G == 0) return;
  for (const CacheView& cache : a.caches) {
    InsertArgs ins;
    ins.ratio = a.ratio;
    ins.latent = a.gathered_latent;
    ins.latent.shape[0] = G;
    ins.positions = a.gathered_positions;
    ins.positions.shape[0] = G;
    ins.rope_table = a.rope_table;
    ins.slots = a.gathered_cslots;
    ins.cache = cache;
    insert(ins, ctx);
  }
}

}  // namespace dsv41kv::pcp::step_common
