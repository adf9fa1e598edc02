// CPU backend of the compressor path: the normative reference the CUDA backend is compared
// with bit for bit (SPEC 0.4 item 2). It follows SPEC 4.4/4.5/5.1/5.3/7.5 literally, with the
// same program decomposition as the reference kernels:
//
//   ratio 1: one program per token t < N: skip slot < 0, latent = rmsnorm(kv_score[t][0..511]).
//   ratio 2: request programs j < num_reqs and pair programs k < ceil(N/2).
//     Phase 1 runs every program's latent (request programs read the ring, or prev_rows under
//     PCP; pair programs read only kv_score). Phase 2 runs the tail stores (policy kTail) of all
//     requests, in request order. Every ring read of the call therefore happens before any
//     ring write, which is what the concurrent GPU programs guarantee per request (and, since
//     ring blocks of one call are distinct, across requests).
//
// Arguments were validated by the public API (validate.cpp) before any of this runs; the code
// still guards the few indices whose violation would read outside memory.
//
// Threads: phase 1, the insert, the gather and the projection are split over std::threads by
// ctx.num_threads (0 = hardware concurrency). Each output row is produced by exactly one
// thread with an operation order independent of the split, so results are bit-identical for
// any thread count. Ring stores and save_ring_rows are plain copies done serially in order.
#include <algorithm>
#include <cstring>
#include <vector>

#include "compressor/backend.hpp"
#include "compressor/compress_math.hpp"
#include "core/parallel.hpp"

namespace dsv41kv::detail::cpu {
namespace {

constexpr int64_t kCompressGrain = 16;  // programs per thread range (each ~ a few us)
constexpr int64_t kInsertGrain = 16;

struct CompressIo {
  const float* kv = nullptr;
  int64_t kv_stride = 0;
  const int64_t* pos = nullptr;
  const int64_t* slot = nullptr;
  const uint16_t* norm_w = nullptr;
  float eps = 0.0f;
  uint16_t* latent = nullptr;  // [N, 512] rows of kLatentDim
  uint8_t* emitted = nullptr;  // optional [N]: 1 where this call wrote latent[t]
  const int32_t* qsl = nullptr;
  const int32_t* t2r = nullptr;
  float* ring = nullptr;
  const float* prev = nullptr;
  const int64_t* prev_idx = nullptr;

  const float* kv_row(int64_t t) const { return kv + t * kv_stride; }
  void emit(const float* a, const float* b, int64_t t, float* scratch) const {
    cmath::compress_row(a, b, norm_w, eps, scratch, latent + t * kLatentDim);
    if (emitted) emitted[t] = 1;
  }
};

CompressIo make_io(const CompressArgs& a, uint16_t* latent, uint8_t* emitted) {
  CompressIo io;
  io.kv = a.kv_score.ptr<const float>();
  io.kv_stride = a.kv_score.stride[0];
  io.pos = a.positions.ptr<const int64_t>();
  io.slot = a.slot_mapping.ptr<const int64_t>();
  io.norm_w = a.norm_weight.ptr<const uint16_t>();
  io.eps = a.eps;
  io.latent = latent;
  io.emitted = emitted;
  if (a.ratio == 2) {
    io.qsl = a.qsl.ptr<const int32_t>();
    io.t2r = a.token_to_req.ptr<const int32_t>();
    io.ring = a.ring.ptr<float>();
    if (a.policy == RingPolicy::kOpenRow && a.prev_rows.present()) {
      io.prev = a.prev_rows.ptr<const float>();
      io.prev_idx = a.prev_row_indices.ptr<const int64_t>();
    }
  }
  return io;
}

// SPEC 4.4 item 1, latent part. Returns nothing; the tail store is phase 2.
void request_program(const CompressIo& io, const CompressPlan& p, int64_t j, float* scratch) {
  const int64_t s = io.qsl[j], e = io.qsl[j + 1];
  if (s >= e || io.slot[s] < 0) return;
  const int64_t pos = io.pos[s];
  if (pos % 2 == 0) return;  // the first token opens a group: nothing to pool here
  const float* pred = nullptr;
  if (p.pcp && io.prev != nullptr && j < p.prev_indices) {
    const int64_t g = io.prev_idx[j];
    if (g >= 0 && g < p.prev_rows) pred = io.prev + g * p.prev_row_stride;  // else: ring
  }
  if (pred == nullptr) {
    const int64_t block = io.slot[s] / p.cap;
    const int64_t row = (pos - 1) % p.cap;
    pred = io.ring + block * p.ring_block_stride + row * p.ring_row_stride;
  }
  io.emit(pred, io.kv_row(s), s, scratch);
}

// SPEC 4.4 item 2.
void pair_program(const CompressIo& io, const CompressPlan& p, int64_t k, float* scratch) {
  const int64_t t0 = 2 * k;
  if (t0 >= p.N) return;
  const int64_t t = t0 + ((io.pos[t0] + 1) % 2);
  const int64_t slot = t < p.N ? io.slot[t] : -1;
  if (slot < 0) return;
  const int64_t req = io.t2r[t];
  if (req < 0 || req >= p.num_reqs || t == io.qsl[req]) return;
  if (t < 1) return;  // unreachable after validation (token 0 always starts request 0's chunk)
  io.emit(io.kv_row(t - 1), io.kv_row(t), t, scratch);
}

// SPEC 4.5: the last min(e - s, cap) rows of each chunk, ascending, slot >= 0 only.
void tail_store(const CompressIo& io, const CompressPlan& p, int64_t j) {
  const int64_t s = io.qsl[j], e = io.qsl[j + 1];
  if (s >= e || io.slot[s] < 0) return;
  const int64_t n = std::min<int64_t>(e - s, p.cap);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t t = e - n + k;
    const int64_t slot = io.slot[t];
    if (slot < 0) continue;
    float* dst = io.ring + (slot / p.cap) * p.ring_block_stride + (slot % p.cap) * p.ring_row_stride;
    std::memcpy(dst, io.kv_row(t), sizeof(float) * kRingRowFloats);
  }
}

void compress_core(const CompressArgs& a, const CompressPlan& p, const ExecContext& ctx,
                   uint16_t* latent, uint8_t* emitted) {
  const CompressIo io = make_io(a, latent, emitted);
  if (p.ratio == 1) {
    parallel_for(p.N, ctx, kCompressGrain, [&](int64_t b, int64_t e) {
      std::vector<float> scratch(kLatentDim);
      for (int64_t t = b; t < e; ++t)
        if (io.slot[t] >= 0) io.emit(nullptr, io.kv_row(t), t, scratch.data());
    });
    return;
  }
  // Phase 1: request programs then pair programs, as one index space.
  const int64_t pairs = (p.N + 1) / 2;
  parallel_for(p.num_reqs + pairs, ctx, kCompressGrain, [&](int64_t b, int64_t e) {
    std::vector<float> scratch(kLatentDim);
    for (int64_t pid = b; pid < e; ++pid) {
      if (pid < p.num_reqs) request_program(io, p, pid, scratch.data());
      else pair_program(io, p, pid - p.num_reqs, scratch.data());
    }
  });
  // Phase 2: tail stores after every ring read (policy kTail only).
  if (!p.pcp)
    for (int64_t j = 0; j < p.num_reqs; ++j) tail_store(io, p, j);
}

// ---------------------------------------------------------------- insert

struct InsertIo {
  const uint16_t* latent = nullptr;
  const int64_t* pos = nullptr;
  const float* table = nullptr;
  const int64_t* slot = nullptr;
  const uint8_t* mask = nullptr;  // optional: token t is a candidate only if mask[t]
  CacheView cache;
  float inv = 1.0f;  // plain fp8: fp32(1 / sigma), computed once
};

// Token t is written (SPEC 5.1): a valid slot, not masked, and it closes its group (only closing
// tokens are written).
bool writes_token(const InsertIo& io, int ratio, int64_t t) {
  return io.slot[t] >= 0 && (io.mask == nullptr || io.mask[t]) && (io.pos[t] + 1) % ratio == 0;
}

// SPEC 5.1 for one token.
void insert_token(const InsertIo& io, int ratio, int64_t t, float* x, float* y) {
  if (!writes_token(io, ratio, t)) return;
  const int64_t slot = io.slot[t];
  const int64_t p = io.pos[t];
  const uint16_t* lat = io.latent + t * kLatentDim;
  for (int d = 0; d < kLatentDim; ++d) x[d] = num::bf16_decode(lat[d]);
  std::memcpy(y, x, sizeof(float) * kLatentDim);
  const float* row = io.table + ((p / ratio) * ratio) * kRopeDim;  // RoPE at the group start
  for (int i = 0; i < kRopeDim / 2; ++i) {
    const int d0 = kNopeDim + 2 * i;
    num::rope_forward(x[d0], x[d0 + 1], row[i], row[kRopeDim / 2 + i], y[d0], y[d0 + 1]);
  }
  const CacheView& c = io.cache;
  const int64_t page = slot / c.states_per_page, off = slot % c.states_per_page;
  switch (c.format) {
    case RecordFormat::V4_584:
      rec::write_v4_584(static_cast<uint8_t*>(c.base) + page * c.page_stride, c.states_per_page,
                        off, x, y);
      break;
    case RecordFormat::MXFP8_528:
      rec::write_mxfp8_528(static_cast<uint8_t*>(c.base) + page * c.page_stride,
                           c.states_per_page, off, y);
      break;
    case RecordFormat::NVFP4_288:
      rec::write_nvfp4_288(static_cast<uint8_t*>(c.base) + page * c.page_stride,
                           c.states_per_page, off, y);
      break;
    case RecordFormat::PLAIN_BF16:
      rec::write_plain_bf16(
          static_cast<uint16_t*>(c.base) + page * c.page_stride + off * c.row_stride, y);
      break;
    case RecordFormat::PLAIN_FP8:
      rec::write_plain_fp8(static_cast<uint8_t*>(c.base) + page * c.page_stride + off * c.row_stride,
                           y, io.inv);
      break;
  }
}

// True when two tokens that would be written name the same slot (then the writes run serially
// in token order, so the last one wins deterministically, as in a serial reference).
bool has_duplicate_writes(const InsertIo& io, int ratio, int64_t N) {
  std::vector<int64_t> s;
  s.reserve(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t)
    if (writes_token(io, ratio, t)) s.push_back(io.slot[t]);
  std::sort(s.begin(), s.end());
  return std::adjacent_find(s.begin(), s.end()) != s.end();
}

void insert_core(const InsertIo& io, int ratio, int64_t N, const ExecContext& ctx) {
  ExecContext c = ctx;
  if (has_duplicate_writes(io, ratio, N)) c.num_threads = 1;
  parallel_for(N, c, kInsertGrain, [&](int64_t b, int64_t e) {
    std::vector<float> x(kLatentDim), y(kLatentDim);
    for (int64_t t = b; t < e; ++t) insert_token(io, ratio, t, x.data(), y.data());
  });
}

InsertIo make_insert_io(const TensorView& positions, const TensorView& table,
                        const TensorView& slots, const CacheView& cache, const uint16_t* latent,
                        const uint8_t* mask) {
  InsertIo io;
  io.latent = latent;
  io.pos = positions.ptr<const int64_t>();
  io.table = table.ptr<const float>();
  io.slot = slots.ptr<const int64_t>();
  io.mask = mask;
  io.cache = cache;
  if (cache.format == RecordFormat::PLAIN_FP8) io.inv = num::div_rn(1.0f, cache.fp8_scale);
  return io;
}

}  // namespace

void compress(const CompressArgs& a, const CompressPlan& p, const ExecContext& ctx) {
  if (p.N == 0) return;
  compress_core(a, p, ctx, a.latent_out.ptr<uint16_t>(), nullptr);
}

void insert(const InsertArgs& a, const InsertPlan& p, const ExecContext& ctx) {
  if (p.N == 0) return;
  const InsertIo io = make_insert_io(a.positions, a.rope_table, a.slots, a.cache,
                                     a.latent.ptr<const uint16_t>(), nullptr);
  insert_core(io, p.ratio, p.N, ctx);
}

// The fused op on the CPU: compress (both phases), then insert every token that emitted a
// latent in this call and has insert_slots[t] >= 0 (and is closing). A token without a latent
// (slot_mapping < 0, or a chunk whose first token has a ring slot < 0) is not inserted: in the
// fused kernel there is no latent for it. Without latent_out, latents live in a scratch buffer.
void compress_insert(const CompressInsertArgs& a, const CompressPlan& cp, const InsertPlan& ip,
                     const ExecContext& ctx) {
  if (cp.N == 0) return;
  std::vector<uint16_t> scratch;
  uint16_t* latent = a.compress.latent_out.ptr<uint16_t>();
  if (!a.compress.latent_out.present()) {
    scratch.resize(static_cast<size_t>(cp.N) * kLatentDim);
    latent = scratch.data();
  }
  std::vector<uint8_t> emitted(static_cast<size_t>(cp.N), 0);
  compress_core(a.compress, cp, ctx, latent, emitted.data());
  const InsertIo io = make_insert_io(a.compress.positions, a.rope_table, a.insert_slots, a.cache,
                                     latent, emitted.data());
  insert_core(io, ip.ratio, ip.N, ctx);
}

// SPEC 5.3: out[i] = decode(state at slots[i]) for slots[i] >= 0.
void gather(const GatherArgs& a, const GatherPlan& p, const ExecContext& ctx) {
  if (p.M == 0) return;
  const auto* slots = a.slots.ptr<const int64_t>();
  auto* out = a.out.ptr<uint16_t>();
  const CacheView c = a.cache;
  parallel_for(p.M, ctx, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t slot = slots[i];
      if (slot < 0) continue;
      const int64_t page = slot / c.states_per_page, off = slot % c.states_per_page;
      uint16_t* o = out + i * p.out_row_stride;
      switch (c.format) {
        case RecordFormat::V4_584: {
          const auto* pg = static_cast<const uint8_t*>(c.base) + page * c.page_stride;
          for (int d = 0; d < kLatentDim; ++d) o[d] = rec::read_v4_584(pg, c.states_per_page, off, d);
          break;
        }
        case RecordFormat::MXFP8_528: {
          const auto* pg = static_cast<const uint8_t*>(c.base) + page * c.page_stride;
          for (int d = 0; d < kLatentDim; ++d)
            o[d] = rec::read_mxfp8_528(pg, c.states_per_page, off, d);
          break;
        }
        case RecordFormat::NVFP4_288: {
          const auto* pg = static_cast<const uint8_t*>(c.base) + page * c.page_stride;
          for (int d = 0; d < kLatentDim; ++d)
            o[d] = rec::read_nvfp4_288(pg, c.states_per_page, off, d);
          break;
        }
        case RecordFormat::PLAIN_BF16: {
          const auto* row =
              static_cast<const uint16_t*>(c.base) + page * c.page_stride + off * c.row_stride;
          std::memcpy(o, row, sizeof(uint16_t) * kLatentDim);
          break;
        }
        case RecordFormat::PLAIN_FP8: {
          const auto* row =
              static_cast<const uint8_t*>(c.base) + page * c.page_stride + off * c.row_stride;
          for (int d = 0; d < kLatentDim; ++d) o[d] = rec::read_plain_fp8(row, d, c.fp8_scale);
          break;
        }
      }
    }
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
