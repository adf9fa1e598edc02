// Host-side validation of the compressor path (SPEC 0.4 item 3, 4.2, 5.1, 5.3, 7.5).
//
// plan_*() checks presence, dtypes, shapes, strides and devices of every view and derives the
// sizes the backends need; it never reads tensor data, so it is valid for device views.
// check_*_values() reads index data (qsl, token_to_req, slots, positions) and is called only for
// host views: reading device memory would synchronise. The CUDA kernels instead bound every
// index they dereference and skip what is out of range (an out-of-range slot or request index
// writes nothing).
//
// Every failure throws dsv41kv::Error: E3 for a compressor ratio outside {1, 2}, E8 otherwise,
// with a message "<op>: <argument>: <what was found>, expected <what is required>".
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "compressor/backend.hpp"
#include "compressor/validate.hpp"

namespace dsv41kv::detail {
namespace {

[[noreturn]] void bad(const char* op, const char* arg, const std::string& msg) {
  invalid_argument(fmt::format("{}: {}: {}", op, arg, msg));
}

void need_present(const char* op, const TensorView& v, const char* arg, const char* what) {
  if (!v.present()) bad(op, arg, fmt::format("absent, expected {}", what));
  for (int d = 0; d < v.ndim; ++d)
    if (v.shape[static_cast<size_t>(d)] < 0)
      bad(op, arg, fmt::format("shape[{}] = {} is negative ({})", d, v.shape[static_cast<size_t>(d)],
                               v.describe()));
  v.require_span(op, arg);
}

void need_dtype(const char* op, const TensorView& v, const char* arg, DType dt) {
  if (v.dtype != dt)
    bad(op, arg, fmt::format("dtype {}, expected {} ({})", dtype_name(v.dtype), dtype_name(dt),
                             v.describe()));
}

void need_ndim(const char* op, const TensorView& v, const char* arg, int nd) {
  if (v.ndim != nd)
    bad(op, arg, fmt::format("{} dimensions, expected {} ({})", v.ndim, nd, v.describe()));
}

void need_contiguous(const char* op, const TensorView& v, const char* arg) {
  if (!v.is_contiguous())
    bad(op, arg, fmt::format("not contiguous ({}), expected row-major contiguous", v.describe()));
}

void need_data(const char* op, const TensorView& v, const char* arg) {
  if (v.numel() > 0 && v.data == nullptr)
    bad(op, arg, fmt::format("data pointer is null for {} elements", v.numel()));
}

void need_device(const char* op, const TensorView& v, const char* arg, Device dev,
                 const char* ref) {
  if (v.present() && v.device != dev)
    bad(op, arg, fmt::format("on {}, expected {} like {} (all views of one call on one device)",
                             device_name(v.device), device_name(dev), ref));
}

// A contiguous 1-D index vector of dtype dt; returns its length.
int64_t need_vector(const char* op, const TensorView& v, const char* arg, DType dt,
                    const char* what) {
  need_present(op, v, arg, what);
  need_dtype(op, v, arg, dt);
  need_ndim(op, v, arg, 1);
  need_contiguous(op, v, arg);
  need_data(op, v, arg);
  return v.shape[0];
}

// A row-major f32/bf16 matrix [rows, cols] with inner stride 1.
void need_rows(const char* op, const TensorView& v, const char* arg, DType dt, int64_t cols,
               int64_t min_rows, const char* what) {
  need_present(op, v, arg, what);
  need_dtype(op, v, arg, dt);
  need_ndim(op, v, arg, 2);
  if (v.shape[1] != cols)
    bad(op, arg, fmt::format("shape[1] = {}, expected {} ({})", v.shape[1], cols, v.describe()));
  if (v.shape[0] < min_rows)
    bad(op, arg, fmt::format("{} rows, expected at least {} ({})", v.shape[0], min_rows,
                             v.describe()));
  if (v.stride[1] != 1 && v.shape[1] > 1)
    bad(op, arg, fmt::format("inner stride {}, expected 1 ({})", v.stride[1], v.describe()));
  need_data(op, v, arg);
}

// Row stride: a multiple of 16 elements (aligned vector rows) and no overlap of rows.
void need_row_stride16(const char* op, const TensorView& v, const char* arg) {
  const int64_t rs = v.stride[0];
  if (rs % 16 != 0)
    bad(op, arg, fmt::format("row stride {} elements, expected a multiple of 16 ({})", rs,
                             v.describe()));
  if (v.shape[0] > 1 && rs < v.shape[1])
    bad(op, arg, fmt::format("row stride {} elements, expected >= {} (rows must not overlap; {})",
                             rs, v.shape[1], v.describe()));
}

struct RingGeom {
  int64_t blocks, cap, block_stride, row_stride;
};

// f32 [blocks, cap, 1024], strides [block_stride, row_stride, 1] (SPEC 3.2).
RingGeom need_ring(const char* op, const TensorView& v, const char* arg) {
  need_present(op, v, arg, "f32 [blocks, cap, 1024] ring");
  need_dtype(op, v, arg, DType::F32);
  need_ndim(op, v, arg, 3);
  if (v.shape[2] != kRingRowFloats)
    bad(op, arg, fmt::format("shape[2] = {}, expected 1024 ([kv | score] row; {})", v.shape[2],
                             v.describe()));
  if (v.shape[0] < 1) bad(op, arg, fmt::format("{} blocks, expected >= 1 ({})", v.shape[0], v.describe()));
  if (v.shape[1] < 1)
    bad(op, arg, fmt::format("capacity (shape[1]) = {}, expected >= 1 ({})", v.shape[1],
                             v.describe()));
  if (v.stride[2] != 1)
    bad(op, arg, fmt::format("inner stride {}, expected 1 ({})", v.stride[2], v.describe()));
  if (v.stride[1] < kRingRowFloats || v.stride[1] % 16 != 0)
    bad(op, arg, fmt::format("row stride {} floats, expected >= 1024 and a multiple of 16 ({})",
                             v.stride[1], v.describe()));
  if (v.stride[0] < v.shape[1] * v.stride[1])
    bad(op, arg, fmt::format("block stride {} floats, expected >= cap * row_stride = {} ({})",
                             v.stride[0], v.shape[1] * v.stride[1], v.describe()));
  need_data(op, v, arg);
  return {v.shape[0], v.shape[1], v.stride[0], v.stride[1]};
}

// f32 [G, 1024] rows of kv_score (prev_rows of PCP).
void need_prev_rows(const char* op, const TensorView& v, const char* arg) {
  need_rows(op, v, arg, DType::F32, kRingRowFloats, 0, "f32 [G, 1024]");
  need_row_stride16(op, v, arg);
}

CompressPlan plan_compress_impl(const CompressArgs& a, bool require_latent, const char* op) {
  if (a.ratio != 1 && a.ratio != 2)
    fail(ErrorCode::kCompressorRatio,
         fmt::format("{}: ratio = {}, expected 1 or 2 (compressor ratio, SPEC 1.2)", op, a.ratio));
  CompressPlan p;
  p.ratio = a.ratio;
  const int64_t width = int64_t{kLatentDim} * a.ratio;

  p.N = need_vector(op, a.slot_mapping, "slot_mapping", DType::I64, "i64 [N] slot mapping");
  p.device = a.slot_mapping.device;
  const Device dev = p.device;

  need_rows(op, a.kv_score, "kv_score", DType::F32, width, p.N, "f32 [rows >= N, 512*ratio]");
  need_row_stride16(op, a.kv_score, "kv_score");
  p.kv_row_stride = a.kv_score.stride[0];

  const int64_t npos =
      need_vector(op, a.positions, "positions", DType::I64, "i64 [>= N] positions");
  if (npos < p.N)
    bad(op, "positions", fmt::format("{} entries, expected at least N = {}", npos, p.N));

  const int64_t nw = need_vector(op, a.norm_weight, "norm_weight", DType::BF16, "bf16 [512]");
  if (nw != kLatentDim) bad(op, "norm_weight", fmt::format("{} entries, expected 512", nw));

  if (!num::is_finite(a.eps) || a.eps < 0.0f)
    bad(op, "eps", fmt::format("{}, expected a finite value >= 0 (rms_norm_eps)", a.eps));

  if (require_latent || a.latent_out.present()) {
    need_rows(op, a.latent_out, "latent_out", DType::BF16, kLatentDim, p.N,
              "bf16 [rows >= N, 512]");
    need_contiguous(op, a.latent_out, "latent_out");
  }

  if (a.policy != RingPolicy::kTail && a.policy != RingPolicy::kOpenRow)
    bad(op, "policy", fmt::format("value {}, expected kTail (0) or kOpenRow (1)",
                                  static_cast<int>(a.policy)));

  need_device(op, a.kv_score, "kv_score", dev, "slot_mapping");
  need_device(op, a.positions, "positions", dev, "slot_mapping");
  need_device(op, a.norm_weight, "norm_weight", dev, "slot_mapping");
  need_device(op, a.latent_out, "latent_out", dev, "slot_mapping");

  if (a.ratio == 1) return p;  // ring, qsl, token_to_req, prev_rows are ignored (num_reqs = 0)

  const RingGeom g = need_ring(op, a.ring, "ring");
  p.ring_blocks = g.blocks;
  p.cap = g.cap;
  p.ring_block_stride = g.block_stride;
  p.ring_row_stride = g.row_stride;

  const int64_t nq = need_vector(op, a.qsl, "qsl", DType::I32, "i32 [num_reqs + 1]");
  if (nq < 1) bad(op, "qsl", "0 entries, expected num_reqs + 1 >= 1");
  p.num_reqs = nq - 1;

  const int64_t nt =
      need_vector(op, a.token_to_req, "token_to_req", DType::I32, "i32 [N] token_to_req");
  if (nt != p.N) bad(op, "token_to_req", fmt::format("{} entries, expected N = {}", nt, p.N));

  need_device(op, a.ring, "ring", dev, "slot_mapping");
  need_device(op, a.qsl, "qsl", dev, "slot_mapping");
  need_device(op, a.token_to_req, "token_to_req", dev, "slot_mapping");

  const bool have_rows = a.prev_rows.present(), have_idx = a.prev_row_indices.present();
  if (a.policy == RingPolicy::kTail) {
    if (have_rows || have_idx)
      bad(op, have_rows ? "prev_rows" : "prev_row_indices",
          "given with ring policy kTail, expected only with kOpenRow (PCP, SPEC 7.5)");
    return p;
  }
  p.pcp = true;
  if (have_rows != have_idx)
    bad(op, have_rows ? "prev_row_indices" : "prev_rows",
        "absent while the other PCP argument is given, expected prev_rows and prev_row_indices "
        "together or neither");
  if (have_rows) {
    need_prev_rows(op, a.prev_rows, "prev_rows");
    p.prev_rows = a.prev_rows.shape[0];
    p.prev_row_stride = a.prev_rows.stride[0];
    p.prev_indices = need_vector(op, a.prev_row_indices, "prev_row_indices", DType::I64,
                                 "i64 [R <= num_reqs]");
    if (p.prev_indices > p.num_reqs)
      bad(op, "prev_row_indices",
          fmt::format("{} entries, expected at most num_reqs = {}", p.prev_indices, p.num_reqs));
    need_device(op, a.prev_rows, "prev_rows", dev, "slot_mapping");
    need_device(op, a.prev_row_indices, "prev_row_indices", dev, "slot_mapping");
  }
  return p;
}

}  // namespace

// ---------------------------------------------------------------- compress

CompressPlan plan_compress(const CompressArgs& a) { return plan_compress_impl(a, true, "compress"); }

void check_compress_values(const CompressArgs& a, const CompressPlan& p, const char* op) {
  if (p.ratio == 1) return;  // slot_mapping is only a validity mask; positions are not read
  const int64_t N = p.N, nr = p.num_reqs;
  const auto* qsl = a.qsl.ptr<const int32_t>();
  const auto* slot = a.slot_mapping.ptr<const int64_t>();
  const auto* pos = a.positions.ptr<const int64_t>();
  const auto* t2r = a.token_to_req.ptr<const int32_t>();

  if (qsl[0] != 0) bad(op, "qsl", fmt::format("qsl[0] = {}, expected 0", qsl[0]));
  for (int64_t j = 0; j < nr; ++j)
    if (qsl[j + 1] < qsl[j])
      bad(op, "qsl", fmt::format("qsl[{}] = {} < qsl[{}] = {}, expected non-decreasing", j + 1,
                                 qsl[j + 1], j, qsl[j]));
  if (qsl[nr] > N)
    bad(op, "qsl", fmt::format("qsl[num_reqs = {}] = {}, expected <= N = {}", nr, qsl[nr], N));

  const int64_t ring_slots = p.ring_blocks * p.cap;
  for (int64_t t = 0; t < N; ++t) {
    if (pos[t] < 0) bad(op, "positions", fmt::format("positions[{}] = {}, expected >= 0", t, pos[t]));
    if (slot[t] >= ring_slots)
      bad(op, "slot_mapping",
          fmt::format("slot_mapping[{}] = {}, expected < ring blocks * cap = {} * {} = {} "
                      "(or < 0 to skip)",
                      t, slot[t], p.ring_blocks, p.cap, ring_slots));
  }
  // token_to_req: the owner of every real token; a padding row that still has a valid slot
  // must name some request (the pair program reads qsl[token_to_req[t]]).
  for (int64_t j = 0; j < nr; ++j) {
    for (int64_t t = qsl[j]; t < qsl[j + 1]; ++t) {
      if (t2r[t] != j)
        bad(op, "token_to_req",
            fmt::format("token_to_req[{}] = {}, expected {} (token {} lies in request {}'s chunk "
                        "[{}, {}) of qsl)",
                        t, t2r[t], j, t, j, qsl[j], qsl[j + 1]));
      if (t > qsl[j] && pos[t] != pos[t - 1] + 1)
        bad(op, "positions",
            fmt::format("positions[{}] = {} after positions[{}] = {} in request {}, expected "
                        "consecutive positions within a request chunk",
                        t, pos[t], t - 1, pos[t - 1], j));
    }
  }
  for (int64_t t = qsl[nr]; t < N; ++t)
    if (slot[t] >= 0 && (t2r[t] < 0 || t2r[t] >= nr))
      bad(op, "token_to_req",
          fmt::format("token_to_req[{}] = {} for a padding row with slot {}, expected a request "
                      "index in [0, {})",
                      t, t2r[t], slot[t], nr));

  // Policy tail: the ring blocks written by the requests of one call are distinct (SPEC 4.2;
  // otherwise one request's tail store could race with another's ring read).
  if (!p.pcp) {
    std::unordered_map<int64_t, int64_t> owner;
    for (int64_t j = 0; j < nr; ++j) {
      const int64_t s = qsl[j], e = qsl[j + 1];
      if (s >= e || slot[s] < 0) continue;  // the request program does nothing
      for (int64_t t = s; t < e; ++t) {
        if (slot[t] < 0) continue;
        const int64_t b = slot[t] / p.cap;
        auto [it, inserted] = owner.emplace(b, j);
        if (!inserted && it->second != j)
          bad(op, "slot_mapping",
              fmt::format("ring block {} is used by requests {} and {} (slot_mapping[{}] = {}), "
                          "expected distinct ring blocks per request under ring policy kTail",
                          b, it->second, j, t, slot[t]));
      }
    }
  }
  // prev_row_indices values are not checked: out of [0, G) means "use the ring" (SPEC 7.5).
}

// ---------------------------------------------------------------- insert

InsertPlan plan_insert_impl(const InsertArgs& a, bool require_latent, const char* op) {
  if (a.ratio != 1 && a.ratio != 2)
    fail(ErrorCode::kCompressorRatio,
         fmt::format("{}: ratio = {}, expected 1 or 2 (compressor ratio, SPEC 1.2)", op, a.ratio));
  InsertPlan p;
  p.ratio = a.ratio;
  p.N = need_vector(op, a.slots, "slots", DType::I64, "i64 [N] compressed-cache slots");
  p.device = a.slots.device;
  if (require_latent || a.latent.present()) {
    need_rows(op, a.latent, "latent", DType::BF16, kLatentDim, p.N, "bf16 [rows >= N, 512]");
    need_contiguous(op, a.latent, "latent");
  }
  const int64_t npos =
      need_vector(op, a.positions, "positions", DType::I64, "i64 [>= N] positions");
  if (npos < p.N)
    bad(op, "positions", fmt::format("{} entries, expected at least N = {}", npos, p.N));
  need_rows(op, a.rope_table, "rope_table", DType::F32, kRopeDim, 1,
            "f32 [table_rows >= 1, 64]");
  need_contiguous(op, a.rope_table, "rope_table");
  p.table_rows = a.rope_table.shape[0];
  const std::string cache_arg = fmt::format("{}: cache", op);
  validate_cache(a.cache, cache_arg.c_str());
  p.capacity = a.cache.num_pages * a.cache.states_per_page;

  need_device(op, a.latent, "latent", p.device, "slots");
  need_device(op, a.positions, "positions", p.device, "slots");
  need_device(op, a.rope_table, "rope_table", p.device, "slots");
  if (a.cache.device != p.device)
    bad(op, "cache", fmt::format("on {}, expected {} like slots (all views of one call on one "
                                 "device)",
                                 device_name(a.cache.device), device_name(p.device)));
  return p;
}

void check_insert_values_impl(const InsertArgs& a, const InsertPlan& p, const char* op) {
  const auto* slot = a.slots.ptr<const int64_t>();
  const auto* pos = a.positions.ptr<const int64_t>();
  for (int64_t t = 0; t < p.N; ++t) {
    if (slot[t] < 0) continue;  // skipped: the position is not read
    if (slot[t] >= p.capacity)
      bad(op, "slots",
          fmt::format("slots[{}] = {}, expected < num_pages * states_per_page = {} * {} = {} "
                      "(or < 0 to skip)",
                      t, slot[t], a.cache.num_pages, a.cache.states_per_page, p.capacity));
    if (pos[t] < 0) bad(op, "positions", fmt::format("positions[{}] = {}, expected >= 0", t, pos[t]));
    if ((pos[t] + 1) % p.ratio != 0) continue;
    const int64_t row = (pos[t] / p.ratio) * p.ratio;
    if (row >= p.table_rows)
      bad(op, "positions",
          fmt::format("positions[{}] = {} needs RoPE table row {}: a position beyond the RoPE "
                      "table of {} rows, expected row < {}",
                      t, pos[t], row, p.table_rows, p.table_rows));
  }
}

InsertPlan plan_insert(const InsertArgs& a) { return plan_insert_impl(a, true, "insert"); }

void check_insert_values(const InsertArgs& a, const InsertPlan& p) {
  check_insert_values_impl(a, p, "insert");
}

InsertArgs insert_half(const CompressInsertArgs& a) {
  InsertArgs ia;
  ia.ratio = a.compress.ratio;
  ia.latent = a.compress.latent_out;
  ia.positions = a.compress.positions;
  ia.rope_table = a.rope_table;
  ia.slots = a.insert_slots;
  ia.cache = a.cache;
  return ia;
}

void plan_compress_insert(const CompressInsertArgs& a, CompressPlan& cp, InsertPlan& ip) {
  const char* op = "compress_insert";
  cp = plan_compress_impl(a.compress, false, op);
  ip = plan_insert_impl(insert_half(a), false, op);
  if (ip.N != cp.N)
    bad(op, "insert_slots", fmt::format("{} entries, expected N = {} (the slot_mapping length)",
                                        ip.N, cp.N));
  if (ip.device != cp.device)
    bad(op, "insert_slots", fmt::format("on {}, expected {} like slot_mapping",
                                        device_name(ip.device), device_name(cp.device)));
}

// ---------------------------------------------------------------- gather

GatherPlan plan_gather(const GatherArgs& a) {
  const char* op = "gather";
  GatherPlan p;
  p.M = need_vector(op, a.slots, "slots", DType::I64, "i64 [M] slots");
  p.device = a.slots.device;
  need_rows(op, a.out, "out", DType::BF16, kLatentDim, p.M, "bf16 [M, 512]");
  if (a.out.shape[0] > 1 && a.out.stride[0] < kLatentDim)
    bad(op, "out", fmt::format("row stride {}, expected >= 512 ({})", a.out.stride[0],
                               a.out.describe()));
  p.out_row_stride = a.out.stride[0];
  validate_cache(a.cache, "gather: cache");
  p.capacity = a.cache.num_pages * a.cache.states_per_page;
  need_device(op, a.out, "out", p.device, "slots");
  if (a.cache.device != p.device)
    bad(op, "cache", fmt::format("on {}, expected {} like slots", device_name(a.cache.device),
                                 device_name(p.device)));
  return p;
}

void check_gather_values(const GatherArgs& a, const GatherPlan& p) {
  const auto* slot = a.slots.ptr<const int64_t>();
  for (int64_t i = 0; i < p.M; ++i)
    if (slot[i] >= p.capacity)
      bad("gather", "slots",
          fmt::format("slots[{}] = {}, expected < num_pages * states_per_page = {} (or < 0 to "
                      "skip)",
                      i, slot[i], p.capacity));
}

// ---------------------------------------------------------------- save_ring_rows

SaveRingRowsPlan plan_save_ring_rows(const SaveRingRowsArgs& a) {
  const char* op = "save_ring_rows";
  SaveRingRowsPlan p;
  p.G = need_vector(op, a.ring_write_slots, "ring_write_slots", DType::I64, "i64 [G]");
  p.device = a.ring_write_slots.device;
  need_prev_rows(op, a.prev_rows, "prev_rows");
  if (a.prev_rows.shape[0] != p.G)
    bad(op, "prev_rows", fmt::format("{} rows, expected G = {} (ring_write_slots length)",
                                     a.prev_rows.shape[0], p.G));
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
  const auto* slot = a.ring_write_slots.ptr<const int64_t>();
  const int64_t n = p.ring_blocks * p.cap;
  for (int64_t g = 0; g < p.G; ++g)
    if (slot[g] >= n)
      bad("save_ring_rows", "ring_write_slots",
          fmt::format("ring_write_slots[{}] = {}, expected < ring blocks * cap = {} * {} = {} "
                      "(or < 0 to skip)",
                      g, slot[g], p.ring_blocks, p.cap, n));
}

void check_exec_context(const ExecContext& ctx, const char* op) {
  if (ctx.num_threads < 0)
    invalid_argument(fmt::format("{}: ctx.num_threads = {}, expected >= 0 (0 = hardware "
                                 "concurrency)",
                                 op, ctx.num_threads));
}

}  // namespace dsv41kv::detail
