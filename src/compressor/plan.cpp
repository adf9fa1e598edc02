// Host-side validation of the compressor (SPEC 0.4 item 3, 4.2, 5.1, 7.5) with the validation kit
// (core/validate.hpp).
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

#include <span>
#include <string>
#include <unordered_map>

#include "compressor/backend.hpp"
#include "core/validate.hpp"

namespace dsv41kv::detail {
namespace {

CompressPlan plan_compress_impl(const CompressArgs& a, bool require_latent, const char* op) {
  need_ratio(op, a.ratio, ErrorCode::kCompressorRatio, "compressor ratio, SPEC 1.2");
  CompressPlan p;
  p.ratio = a.ratio;
  const int64_t width = int64_t{kLatentDim} * a.ratio;

  p.N = need_vector(op, a.slot_mapping, "slot_mapping", DType::I64, "i64 [N] slot mapping");
  p.device = a.slot_mapping.device;
  const Device dev = p.device;

  need_rows(op, a.kv_score, "kv_score", DType::F32, width, p.N, "f32 [rows >= N, 512*ratio]");
  need_row_stride16(op, a.kv_score, "kv_score");
  p.kv_row_stride = a.kv_score.stride[0];

  need_vector(op, a.positions, "positions", DType::I64, "i64 [>= N] positions", p.N);

  const int64_t nw = need_vector(op, a.norm_weight, "norm_weight", DType::BF16, "bf16 [512]");
  if (nw != kLatentDim) bad_arg(op, "norm_weight", fmt::format("{} entries, expected 512", nw));

  if (!num::is_finite(a.eps) || a.eps < 0.0f)
    bad_arg(op, "eps", fmt::format("{}, expected a finite value >= 0 (rms_norm_eps)", a.eps));

  if (require_latent || a.latent_out.present()) {
    need_rows(op, a.latent_out, "latent_out", DType::BF16, kLatentDim, p.N,
              "bf16 [rows >= N, 512]");
    need_contiguous(op, a.latent_out, "latent_out");
  }

  if (a.policy != RingPolicy::kTail && a.policy != RingPolicy::kOpenRow)
    bad_arg(op, "policy", fmt::format("value {}, expected kTail (0) or kOpenRow (1)",
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

  const int64_t nq = need_vector(op, a.qsl, "qsl", DType::I32, "i32 [num_reqs + 1]", 1);
  p.num_reqs = nq - 1;

  const int64_t nt =
      need_vector(op, a.token_to_req, "token_to_req", DType::I32, "i32 [N] token_to_req");
  if (nt != p.N) bad_arg(op, "token_to_req", fmt::format("{} entries, expected N = {}", nt, p.N));

  need_device(op, a.ring, "ring", dev, "slot_mapping");
  need_device(op, a.qsl, "qsl", dev, "slot_mapping");
  need_device(op, a.token_to_req, "token_to_req", dev, "slot_mapping");

  const bool have_rows = a.prev_rows.present(), have_idx = a.prev_row_indices.present();
  if (a.policy == RingPolicy::kTail) {
    if (have_rows || have_idx)
      bad_arg(op, have_rows ? "prev_rows" : "prev_row_indices",
          "given with ring policy kTail, expected only with kOpenRow (PCP, SPEC 7.5)");
    return p;
  }
  p.pcp = true;
  if (have_rows != have_idx)
    bad_arg(op, have_rows ? "prev_row_indices" : "prev_rows",
        "absent while the other PCP argument is given, expected prev_rows and prev_row_indices "
        "together or neither");
  if (have_rows) {
    need_rows(op, a.prev_rows, "prev_rows", DType::F32, kRingRowFloats, 0, "f32 [G, 1024]");
    need_row_stride16(op, a.prev_rows, "prev_rows");
    p.prev_rows = a.prev_rows.shape[0];
    p.prev_row_stride = a.prev_rows.stride[0];
    p.prev_indices = need_vector(op, a.prev_row_indices, "prev_row_indices", DType::I64,
                                 "i64 [R <= num_reqs]");
    if (p.prev_indices > p.num_reqs)
      bad_arg(op, "prev_row_indices",
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

  check_qsl(op, "qsl", std::span(qsl, static_cast<size_t>(nr + 1)), N);

  const int64_t ring_slots = p.ring_blocks * p.cap;
  for (int64_t t = 0; t < N; ++t) {
    if (pos[t] < 0) bad_arg(op, "positions", fmt::format("positions[{}] = {}, expected >= 0", t, pos[t]));
    if (slot[t] >= ring_slots)
      bad_arg(op, "slot_mapping",
          fmt::format("slot_mapping[{}] = {}, expected < ring blocks * cap = {} * {} = {} "
                      "(or < 0 to skip)",
                      t, slot[t], p.ring_blocks, p.cap, ring_slots));
  }
  // token_to_req: the owner of every real token; a padding row that still has a valid slot
  // must name some request (the pair program reads qsl[token_to_req[t]]).
  for (int64_t j = 0; j < nr; ++j) {
    for (int64_t t = qsl[j]; t < qsl[j + 1]; ++t) {
      if (t2r[t] != j)
        bad_arg(op, "token_to_req",
            fmt::format("token_to_req[{}] = {}, expected {} (token {} lies in request {}'s chunk "
                        "[{}, {}) of qsl)",
                        t, t2r[t], j, t, j, qsl[j], qsl[j + 1]));
      if (t > qsl[j] && pos[t] != pos[t - 1] + 1)
        bad_arg(op, "positions",
            fmt::format("positions[{}] = {} after positions[{}] = {} in request {}, expected "
                        "consecutive positions within a request chunk",
                        t, pos[t], t - 1, pos[t - 1], j));
    }
  }
  for (int64_t t = qsl[nr]; t < N; ++t)
    if (slot[t] >= 0 && (t2r[t] < 0 || t2r[t] >= nr))
      bad_arg(op, "token_to_req",
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
          bad_arg(op, "slot_mapping",
              fmt::format("ring block {} is used by requests {} and {} (slot_mapping[{}] = {}), "
                          "expected distinct ring blocks per request under ring policy kTail",
                          b, it->second, j, t, slot[t]));
      }
    }
  }
  // prev_row_indices values are not checked: out of [0, G) means "use the ring" (SPEC 7.5).
}

// ---------------------------------------------------------------- compress_insert

InsertViews insert_half(const CompressInsertArgs& a) {
  InsertViews v;
  v.ratio = a.compress.ratio;
  v.latent = &a.compress.latent_out;
  v.positions = &a.compress.positions;
  v.rope_table = &a.rope_table;
  v.slots = &a.insert_slots;
  v.slots_arg = "insert_slots";
  v.cache = &a.cache;
  return v;
}

void plan_compress_insert(const CompressInsertArgs& a, CompressPlan& cp, InsertPlan& ip) {
  const char* op = "compress_insert";
  cp = plan_compress_impl(a.compress, false, op);
  ip = plan_insert(op, insert_half(a), false);
  if (ip.N != cp.N)
    bad_arg(op, "insert_slots", fmt::format("{} entries, expected N = {} (the slot_mapping length)", ip.N, cp.N));
  if (ip.device != cp.device)
    bad_arg(op, "insert_slots",
            fmt::format("on {}, expected {} like slot_mapping", device_name(ip.device), device_name(cp.device)));
}

}  // namespace dsv41kv::detail
