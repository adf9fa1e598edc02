// Random step batches for the CUDA-vs-CPU tests: host inputs and canary-filled outputs, plus
// device copies, with views for both backends. Every field is drawn from the test's Rng, so a
// run is reproducible from its printed seed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "dsv41kv/compressor.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {

struct GpuBatchSpec {
  int ratio = 2;
  int num_reqs = 8;
  int min_len = 0, max_len = 40;  // chunk lengths, uniform (0 allowed: empty requests)
  int64_t max_start = 4096;       // first positions uniform in [0, max_start)
  int pad_rows = 3;
  int64_t cap = 8;
  int64_t ring_block_extra = 16;  // block stride = cap*1024 + extra floats (1 -> unaligned rows)
  int64_t kv_row_extra = 0;       // kv_score row stride = 512*ratio + extra floats (% 16 == 0);
                                  // the extra floats hold NaN: a record that read them would show it
  double invalid_slot_fraction = 0.03;  // ring/cache slots forced to -1
  bool null_request = true;       // one request with every ring slot -1 (null ring block)
  RecordFormat format = RecordFormat::V4_584;
  int64_t S = 16;                 // states per page
  int64_t page_extra = 0;         // page stride = default + extra elements (1 -> unaligned pages)
  size_t cache_offset = 0;        // device cache base offset in bytes
  bool pcp = false;               // ring policy kOpenRow with prev_rows / prev_row_indices
  int64_t G = 12;                 // prev_rows count (PCP)
  float eps = 1e-6f;
  double score_scale = 2.0;
  double nonfinite_fraction = 0.0;  // kv entries set to +-Inf / NaN (insert poisoning paths)
};

struct GpuBatch {
  GpuBatchSpec s;
  int64_t N = 0, rows = 0, A = 0, ring_blocks = 0, block_stride = 0, num_pages = 0;
  int64_t page_stride = 0, table_rows = 0;
  std::vector<float> kv, table, prev_rows;
  std::vector<int64_t> pos, ring_slots, cache_slots, prev_idx;
  std::vector<int32_t> qsl, t2r;
  std::vector<uint16_t> norm_w;
  // outputs (host = CPU reference, device copies for CUDA)
  std::vector<float> ring;
  std::vector<uint16_t> latent;
  std::vector<uint8_t> cache8;
  std::vector<uint16_t> cache16;

  int64_t width() const { return int64_t{512} * s.ratio; }
  int64_t kv_stride() const { return width() + s.kv_row_extra; }
  bool bf16_cache() const { return s.format == RecordFormat::PLAIN_BF16; }

  static GpuBatch make(const GpuBatchSpec& spec, Rng& rng) {
    GpuBatch b;
    b.s = spec;
    std::vector<int64_t> lens(static_cast<size_t>(spec.num_reqs));
    for (auto& l : lens) {
      l = rng.integer(spec.min_len, spec.max_len);
      b.A += l;
    }
    b.N = b.A + spec.pad_rows;
    b.rows = b.N + 3;
    b.ring_blocks = spec.num_reqs + 3;
    b.block_stride = spec.cap * 1024 + spec.ring_block_extra;
    b.kv.assign(static_cast<size_t>(b.rows * b.kv_stride()), NAN);
    for (int64_t t = 0; t < b.rows; ++t)
      for (int64_t c = 0; c < b.width(); ++c) {
        float v = static_cast<float>(rng.normal() * (c >= 512 ? spec.score_scale : 1.0));
        if (spec.nonfinite_fraction > 0 && rng.uniform() < spec.nonfinite_fraction) {
          const int64_t k = rng.integer(0, 2);
          v = k == 0 ? INFINITY : (k == 1 ? -INFINITY : NAN);
        }
        b.kv[static_cast<size_t>(t * b.kv_stride() + c)] = v;
      }
    b.pos.assign(static_cast<size_t>(b.N), 0);
    b.ring_slots.assign(static_cast<size_t>(b.N), -1);
    b.t2r.assign(static_cast<size_t>(b.N), 0);
    b.qsl.assign(1, 0);
    std::vector<int64_t> ids(static_cast<size_t>(b.ring_blocks));
    for (int64_t i = 0; i < b.ring_blocks; ++i) ids[static_cast<size_t>(i)] = i;
    rng.shuffle(ids);
    const int64_t null_req = spec.null_request ? rng.integer(0, spec.num_reqs - 1) : -1;
    int64_t t = 0, max_pos = 0;
    for (int64_t j = 0; j < spec.num_reqs; ++j) {
      const int64_t blk = ids[static_cast<size_t>(j)];
      const int64_t start = rng.integer(0, spec.max_start - 1);
      for (int64_t i = 0; i < lens[static_cast<size_t>(j)]; ++i, ++t) {
        const int64_t p = start + i;
        max_pos = std::max(max_pos, p);
        b.pos[static_cast<size_t>(t)] = p;
        b.t2r[static_cast<size_t>(t)] = static_cast<int32_t>(j);
        const bool invalid = j == null_req || rng.uniform() < spec.invalid_slot_fraction;
        b.ring_slots[static_cast<size_t>(t)] = invalid ? -1 : blk * spec.cap + p % spec.cap;
      }
      b.qsl.push_back(static_cast<int32_t>(t));
    }
    // compressed-cache slots: distinct for closing tokens, random junk for the others (the
    // insert must skip non-closing tokens whatever their slot)
    int64_t closing = 0;
    for (int64_t k = 0; k < b.A; ++k)
      if ((b.pos[static_cast<size_t>(k)] + 1) % spec.ratio == 0) ++closing;
    b.num_pages = (closing + spec.S - 1) / spec.S + 2;
    const int64_t capacity = b.num_pages * spec.S;
    std::vector<int64_t> perm(static_cast<size_t>(capacity));
    for (int64_t i = 0; i < capacity; ++i) perm[static_cast<size_t>(i)] = i;
    rng.shuffle(perm);
    b.cache_slots.assign(static_cast<size_t>(b.N), -1);
    int64_t next = 0;
    for (int64_t k = 0; k < b.A; ++k) {
      if ((b.pos[static_cast<size_t>(k)] + 1) % spec.ratio == 0) {
        const int64_t sl = perm[static_cast<size_t>(next++)];
        b.cache_slots[static_cast<size_t>(k)] = rng.uniform() < spec.invalid_slot_fraction ? -1 : sl;
      } else {
        b.cache_slots[static_cast<size_t>(k)] = rng.integer(-1, capacity - 1);
      }
    }
    b.table_rows = max_pos + 2;
    b.table = random_rope_table(b.table_rows, rng);
    b.norm_w = random_bf16(512, rng, 0.5, 1.0);
    b.ring = random_f32(static_cast<size_t>(b.ring_blocks * b.block_stride), rng);
    b.latent.assign(static_cast<size_t>(b.rows * 512), kBf16NaN);
    CacheView cv = CacheView::with_default_strides(nullptr, spec.format, b.num_pages, spec.S);
    b.page_stride = cv.page_stride + spec.page_extra;
    if (b.bf16_cache())
      b.cache16.assign(static_cast<size_t>(b.num_pages * b.page_stride), kBf16Canary);
    else
      b.cache8.assign(static_cast<size_t>(b.num_pages * b.page_stride), kByteCanary);
    if (spec.pcp) {
      b.prev_rows = random_f32(static_cast<size_t>(spec.G * 1024), rng, 2.0);
      const int64_t R = rng.integer(0, spec.num_reqs);
      for (int64_t j = 0; j < R; ++j) b.prev_idx.push_back(rng.integer(-2, spec.G + 1));
    }
    return b;
  }
};

// Device mirror of a GpuBatch and the argument structs of both backends.
struct GpuBatchDev {
  DeviceBuffer<float> kv, table, prev_rows, ring;
  DeviceBuffer<int64_t> pos, ring_slots, cache_slots, prev_idx;
  DeviceBuffer<int32_t> qsl, t2r;
  DeviceBuffer<uint16_t> norm_w, latent, cache16;
  DeviceBuffer<uint8_t> cache8;

  explicit GpuBatchDev(const GpuBatch& b)
      : kv(b.kv), table(b.table), ring(b.ring), pos(b.pos), ring_slots(b.ring_slots),
        cache_slots(b.cache_slots), qsl(b.qsl), t2r(b.t2r), norm_w(b.norm_w), latent(b.latent) {
    if (b.s.pcp) {
      prev_rows.upload_new(b.prev_rows.empty() ? std::vector<float>(1024) : b.prev_rows);
      prev_idx.upload_new(b.prev_idx.empty() ? std::vector<int64_t>(1, -1) : b.prev_idx);
    }
    if (b.bf16_cache()) cache16.upload_new(b.cache16, b.s.cache_offset & ~size_t{1});
    else cache8.upload_new(b.cache8, b.s.cache_offset);
  }
};

// The CompressArgs of a batch over host (dev == nullptr) or device buffers.
inline CompressArgs compress_args(GpuBatch& b, GpuBatchDev* d, bool with_latent = true) {
  const Device dv = d ? Device::CUDA : Device::CPU;
  auto V = [&](void* host, void* dev, DType dt, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(d ? dev : host, dt, shape, dv);
  };
  CompressArgs a;
  a.ratio = b.s.ratio;
  a.kv_score = TensorView::strided(d ? static_cast<void*>(d->kv.data()) : b.kv.data(), DType::F32,
                                   {b.rows, b.width()}, {b.kv_stride(), 1}, dv);
  a.positions = V(b.pos.data(), d ? d->pos.data() : nullptr, DType::I64, {b.N});
  a.slot_mapping = b.s.ratio == 2
                       ? V(b.ring_slots.data(), d ? d->ring_slots.data() : nullptr, DType::I64, {b.N})
                       : V(b.cache_slots.data(), d ? d->cache_slots.data() : nullptr, DType::I64, {b.N});
  a.norm_weight = V(b.norm_w.data(), d ? d->norm_w.data() : nullptr, DType::BF16, {512});
  a.eps = b.s.eps;
  if (with_latent)
    a.latent_out = V(b.latent.data(), d ? d->latent.data() : nullptr, DType::BF16, {b.rows, 512});
  if (b.s.ratio == 2) {
    a.ring = TensorView::strided(d ? static_cast<void*>(d->ring.data()) : b.ring.data(), DType::F32,
                                 {b.ring_blocks, b.s.cap, 1024}, {b.block_stride, 1024, 1}, dv);
    a.qsl = V(b.qsl.data(), d ? d->qsl.data() : nullptr, DType::I32,
              {static_cast<int64_t>(b.qsl.size())});
    a.token_to_req = V(b.t2r.data(), d ? d->t2r.data() : nullptr, DType::I32, {b.N});
    if (b.s.pcp) {
      a.policy = RingPolicy::kOpenRow;
      a.prev_rows = V(b.prev_rows.data(), d ? d->prev_rows.data() : nullptr, DType::F32, {b.s.G, 1024});
      a.prev_row_indices = V(b.prev_idx.data(), d ? d->prev_idx.data() : nullptr, DType::I64,
                             {static_cast<int64_t>(b.prev_idx.size())});
    }
  }
  return a;
}

inline CacheView cache_view(GpuBatch& b, GpuBatchDev* d) {
  void* base;
  if (b.bf16_cache()) base = d ? static_cast<void*>(d->cache16.data()) : b.cache16.data();
  else base = d ? static_cast<void*>(d->cache8.data()) : b.cache8.data();
  CacheView c = CacheView::with_default_strides(base, b.s.format, b.num_pages, b.s.S,
                                                d ? Device::CUDA : Device::CPU);
  c.page_stride = b.page_stride;
  c.fp8_scale = 0.5f;
  return c;
}

inline InsertArgs insert_args(GpuBatch& b, GpuBatchDev* d) {
  const Device dv = d ? Device::CUDA : Device::CPU;
  InsertArgs a;
  a.ratio = b.s.ratio;
  a.latent = TensorView::contiguous(d ? static_cast<void*>(d->latent.data()) : b.latent.data(),
                                    DType::BF16, {b.rows, 512}, dv);
  a.positions = TensorView::contiguous(d ? static_cast<void*>(d->pos.data()) : b.pos.data(),
                                       DType::I64, {b.N}, dv);
  a.rope_table = TensorView::contiguous(d ? static_cast<void*>(d->table.data()) : b.table.data(),
                                        DType::F32, {b.table_rows, 64}, dv);
  a.slots = TensorView::contiguous(d ? static_cast<void*>(d->cache_slots.data()) : b.cache_slots.data(),
                                   DType::I64, {b.N}, dv);
  a.cache = cache_view(b, d);
  return a;
}

inline CompressInsertArgs compress_insert_args(GpuBatch& b, GpuBatchDev* d, bool with_latent) {
  CompressInsertArgs a;
  a.compress = compress_args(b, d, with_latent);
  const InsertArgs ia = insert_args(b, d);
  a.rope_table = ia.rope_table;
  a.insert_slots = ia.slots;
  a.cache = ia.cache;
  return a;
}

// Whole-backing comparisons of the CPU reference (host vectors of `b`) with the device copies.
inline ::testing::AssertionResult outputs_equal(const GpuBatch& b, const GpuBatchDev& d,
                                                const std::string& what) {
  auto r = bits_equal(b.latent, d.latent.download(), what + ": latent backing");
  if (!r) return r;
  r = bits_equal(b.ring, d.ring.download(), what + ": ring backing");
  if (!r) return r;
  if (b.bf16_cache()) return bits_equal(b.cache16, d.cache16.download(), what + ": cache backing");
  return bits_equal(b.cache8, d.cache8.download(), what + ": cache backing");
}

// A batch spec as a short name for test messages.
inline std::string gpu_batch_name(const GpuBatchSpec& s) {
  return std::string("r") + std::to_string(s.ratio) + " " + record_info(s.format).name +
         " reqs " + std::to_string(s.num_reqs) + " len " + std::to_string(s.min_len) + ".." +
         std::to_string(s.max_len) + (s.pcp ? " pcp" : "") + " ring+" +
         std::to_string(s.ring_block_extra) + " page+" + std::to_string(s.page_extra) + " off " +
         std::to_string(s.cache_offset);
}

// Sizes that exercise both program geometries (<= 1024 programs: four warps per token).
inline std::vector<GpuBatchSpec> gpu_batch_shapes(int ratio) {
  std::vector<GpuBatchSpec> v;
  GpuBatchSpec decode;
  decode.ratio = ratio;
  decode.num_reqs = 200;
  decode.min_len = 1;
  decode.max_len = 1;
  v.push_back(decode);
  GpuBatchSpec small;  // short chunks, empty requests, wraps of the ring
  small.ratio = ratio;
  small.num_reqs = 9;
  small.max_len = 30;
  small.ring_block_extra = 1;  // unaligned ring rows
  small.page_extra = 3;        // unaligned pages
  small.cache_offset = 5;
  v.push_back(small);
  GpuBatchSpec prefill;  // > 1024 programs: one warp per token
  prefill.ratio = ratio;
  prefill.num_reqs = 6;
  // DSV41KV_GPU_TEST_SMALL=1 (sanitizer runs): still > 1024 programs for both ratios
  const bool small_mode = std::getenv("DSV41KV_GPU_TEST_SMALL") != nullptr;
  prefill.min_len = small_mode ? 360 : 300;
  prefill.max_len = small_mode ? 420 : 900;
  prefill.S = 64 / ratio;
  v.push_back(prefill);
  return v;
}

}  // namespace dsv41kv::test
