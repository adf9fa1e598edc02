// CPU backend of the compressor: the normative reference the CUDA backend is compared with bit
// for bit (SPEC 0.4 item 2). It follows SPEC 4.4/4.5/7.5 literally (and 5.1 through the insert
// rule of formats/insert.hpp), with the same program decomposition as the reference kernels:
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
// Threads: phase 1 and the insert are split over std::threads by ctx.num_threads (0 = hardware
// concurrency). Each output row is produced by exactly one thread with an operation order
// independent of the split, so results are bit-identical for any thread count. Ring stores are
// plain copies done serially in order.
#include <algorithm>
#include <cstring>
#include <vector>

#include "compressor/backend.hpp"
#include "formats/compress_math.hpp"
#include "core/parallel.hpp"

namespace dsv41kv::detail::cpu {
namespace {

constexpr int64_t kCompressGrain = 16;  // programs per thread range (each ~ a few us)

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
  if (!closes_group(pos, 2)) return;  // the first token opens a group: nothing to pool here
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

}  // namespace

void compress(const CompressArgs& a, const CompressPlan& p, const ExecContext& ctx) {
  if (p.N == 0) return;
  compress_core(a, p, ctx, a.latent_out.ptr<uint16_t>(), nullptr);
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
  InsertRows io;
  io.latent = latent;
  io.pos = a.compress.positions.ptr<const int64_t>();
  io.table = a.rope_table.ptr<const float>();
  io.slot = a.insert_slots.ptr<const int64_t>();
  io.mask = emitted.data();
  io.cache = a.cache;
  insert_rows_cpu(io, ip.ratio, ip.N, ctx);
}

}  // namespace dsv41kv::detail::cpu
