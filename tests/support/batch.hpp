// A packed step batch for the compressor tests, built the way SPEC 10.1.1 describes, and the
// expectations written independently of the library's program decomposition: a token's
// predecessor is simply "the previous token of its chunk, else the ring row (p-1) % cap".
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/compress_math.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/reference.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {

struct BatchSpec {
  int ratio = 2;
  std::vector<int> lengths;         // per request chunk
  std::vector<int64_t> starts;      // first position per request
  int64_t cap = 8;
  int64_t ring_blocks = 6;
  int64_t ring_block_stride = 8208;  // floats
  int pad_rows = 2;                  // slot/request rows beyond A
  int extra_kv_rows = 3;             // kv_score rows beyond N
  int64_t table_rows = 32;
  RecordFormat format = RecordFormat::V4_584;
  int64_t num_pages = 3;
  int64_t states_per_page = 0;  // 0: 256 / ratio
  float eps = 1e-20f;
  double score_scale = 1.0;
};

struct Batch {
  BatchSpec spec;
  int ratio = 2;
  int64_t A = 0, N = 0, rows = 0, num_reqs = 0, cap = 8, S = 0;
  std::vector<float> kv;  // [rows, 512 * ratio], row stride 512 * ratio
  std::vector<int64_t> positions, ring_slots, cache_slots;
  std::vector<int32_t> qsl, t2r;
  std::vector<int64_t> req_block;  // ring block per request
  std::vector<uint16_t> norm_w;
  std::vector<float> table;
  std::vector<float> ring_in;      // ring backing before the step
  CanaryBuffer<float> ring;        // ring backing under test (starts as ring_in)
  CanaryBuffer<uint16_t> latent;   // [rows, 512], NaN
  CanaryBuffer<uint8_t> cache_u8;  // packed / fp8 backing
  CanaryBuffer<uint16_t> cache_bf16;
  int64_t page_stride = 0;

  int64_t width() const { return int64_t{512} * ratio; }
  const float* kv_row(int64_t t) const { return kv.data() + t * width(); }
  const float* ring_in_row(int64_t block, int64_t row) const {
    return ring_in.data() + block * spec.ring_block_stride + row * 1024;
  }

  static Batch make(const BatchSpec& s, Rng& rng) {
    Batch b;
    b.spec = s;
    b.ratio = s.ratio;
    b.cap = s.cap;
    b.num_reqs = static_cast<int64_t>(s.lengths.size());
    for (int l : s.lengths) b.A += l;
    b.N = b.A + s.pad_rows;
    b.rows = b.N + s.extra_kv_rows;
    b.S = s.states_per_page > 0 ? s.states_per_page : 256 / s.ratio;
    b.kv.resize(static_cast<size_t>(b.rows * b.width()));
    for (int64_t t = 0; t < b.rows; ++t)
      for (int64_t c = 0; c < b.width(); ++c)
        b.kv[static_cast<size_t>(t * b.width() + c)] =
            static_cast<float>(rng.normal() * (c >= 512 ? s.score_scale : 1.0));
    b.positions.assign(static_cast<size_t>(b.N), 0);
    b.ring_slots.assign(static_cast<size_t>(b.N), -1);
    b.cache_slots.assign(static_cast<size_t>(b.N), -1);
    b.t2r.assign(static_cast<size_t>(b.N), 0);
    b.qsl.assign(1, 0);
    std::vector<int64_t> ids(static_cast<size_t>(s.ring_blocks));
    for (int64_t i = 0; i < s.ring_blocks; ++i) ids[static_cast<size_t>(i)] = i;
    rng.shuffle(ids);
    int64_t t = 0;
    for (int64_t j = 0; j < b.num_reqs; ++j) {
      const int64_t blk = ids[static_cast<size_t>(j % s.ring_blocks)];
      b.req_block.push_back(blk);
      for (int i = 0; i < s.lengths[static_cast<size_t>(j)]; ++i, ++t) {
        const int64_t p = s.starts[static_cast<size_t>(j)] + i;
        b.positions[static_cast<size_t>(t)] = p;
        b.t2r[static_cast<size_t>(t)] = static_cast<int32_t>(j);
        b.ring_slots[static_cast<size_t>(t)] = blk * s.cap + p % s.cap;
        b.cache_slots[static_cast<size_t>(t)] = ((b.num_reqs - 1 - j) % s.num_pages) * b.S + p / s.ratio;
      }
      b.qsl.push_back(static_cast<int32_t>(t));
    }
    b.norm_w = random_bf16(512, rng, 0.5, 1.0);
    b.table = random_rope_table(s.table_rows, rng);
    b.ring_in = random_f32(static_cast<size_t>(s.ring_blocks * s.ring_block_stride), rng);
    b.ring = CanaryBuffer<float>(b.ring_in.size(), 0.0f);
    b.ring.vec() = b.ring_in;
    b.latent = CanaryBuffer<uint16_t>(static_cast<size_t>(b.rows * 512), kBf16NaN);
    const RecordInfo& ri = record_info(s.format);
    CacheView cv = CacheView::with_default_strides(nullptr, s.format, s.num_pages, b.S);
    b.page_stride = cv.page_stride;
    if (ri.element == DType::BF16)
      b.cache_bf16 = CanaryBuffer<uint16_t>(static_cast<size_t>(s.num_pages * b.page_stride), kBf16Canary);
    else
      b.cache_u8 = CanaryBuffer<uint8_t>(static_cast<size_t>(s.num_pages * b.page_stride), kByteCanary);
    return b;
  }

  CacheView cache_view() {
    void* base = record_info(spec.format).element == DType::BF16
                     ? static_cast<void*>(cache_bf16.data())
                     : static_cast<void*>(cache_u8.data());
    CacheView cv = CacheView::with_default_strides(base, spec.format, spec.num_pages, S);
    cv.fp8_scale = 0.5f;
    return cv;
  }

  TensorView ring_view() {
    return TensorView::strided(ring.data(), DType::F32, {spec.ring_blocks, cap, 1024},
                               {spec.ring_block_stride, 1024, 1});
  }

  CompressArgs compress_args() {
    CompressArgs a;
    a.ratio = ratio;
    a.kv_score = TensorView::contiguous(kv.data(), DType::F32, {rows, width()});
    a.positions = view_of(positions);
    a.slot_mapping = ratio == 2 ? view_of(ring_slots) : view_of(cache_slots);
    a.norm_weight = view_of(norm_w);
    a.eps = spec.eps;
    a.latent_out = latent.view({rows, 512});
    a.ring = ring_view();
    a.qsl = view_of(qsl);
    a.token_to_req = view_of(t2r);
    return a;
  }

  InsertArgs insert_args() {
    InsertArgs a;
    a.ratio = ratio;
    a.latent = latent.view({rows, 512});
    a.positions = view_of(positions);
    a.rope_table = TensorView::contiguous(table.data(), DType::F32, {spec.table_rows, 64});
    a.slots = view_of(cache_slots);
    a.cache = cache_view();
    return a;
  }

  CompressInsertArgs compress_insert_args(bool with_latent) {
    CompressInsertArgs a;
    a.compress = compress_args();
    if (!with_latent) a.compress.latent_out = TensorView{};
    a.rope_table = TensorView::contiguous(table.data(), DType::F32, {spec.table_rows, 64});
    a.insert_slots = view_of(cache_slots);
    a.cache = cache_view();
    return a;
  }

  // ---------------------------------------------------------------- expectations

  int64_t chunk_start(int64_t t) const { return qsl[static_cast<size_t>(t2r[static_cast<size_t>(t)])]; }
  bool is_real(int64_t t) const { return t < A; }
  bool closing(int64_t t) const { return (positions[static_cast<size_t>(t)] + 1) % ratio == 0; }
  // The compress op's validity slot of token t.
  int64_t compress_slot(int64_t t) const {
    return ratio == 2 ? ring_slots[static_cast<size_t>(t)] : cache_slots[static_cast<size_t>(t)];
  }
  // Does token t get a latent (every block id here is >= 0, so all real slots are valid)?
  bool emits(int64_t t) const {
    if (!is_real(t) || compress_slot(t) < 0 || !closing(t)) return false;
    if (ratio == 2 && ring_slots[static_cast<size_t>(chunk_start(t))] < 0) return t != chunk_start(t);
    return true;
  }
  // Predecessor row of a ratio-2 closing token: previous token of the chunk, else the ring row.
  const float* predecessor(int64_t t) const {
    if (ratio == 1) return nullptr;
    if (t != chunk_start(t)) return kv_row(t - 1);
    const int64_t p = positions[static_cast<size_t>(t)];
    return ring_in_row(ring_slots[static_cast<size_t>(t)] / cap, (p - 1) % cap);
  }
  // Expected latent of an emitting token via the shared routine.
  std::vector<uint16_t> expected_latent(int64_t t) const {
    std::vector<float> scratch(512);
    std::vector<uint16_t> out(512);
    cmath::compress_row(predecessor(t), kv_row(t), norm_w.data(), spec.eps, scratch.data(),
                        out.data());
    return out;
  }
  // The binary64 reference latent of an emitting token (SPEC 4.6 with exact exp/sqrt/division).
  std::vector<double> reference_latent(int64_t t) const {
    return reference::latent(predecessor(t), kv_row(t), norm_w.data(), static_cast<double>(spec.eps));
  }
  // Ring backing after a kTail step: the last min(len, cap) tokens of every chunk whose first
  // token has a valid slot, at their slots.
  std::vector<float> expected_ring() const {
    std::vector<float> r = ring_in;
    if (ratio != 2) return r;
    for (int64_t j = 0; j < num_reqs; ++j) {
      const int64_t s = qsl[static_cast<size_t>(j)], e = qsl[static_cast<size_t>(j + 1)];
      if (s >= e || ring_slots[static_cast<size_t>(s)] < 0) continue;
      for (int64_t t = std::max(s, e - cap); t < e; ++t) {
        const int64_t slot = ring_slots[static_cast<size_t>(t)];
        if (slot < 0) continue;
        std::copy(kv_row(t), kv_row(t) + 1024,
                  r.begin() + (slot / cap) * spec.ring_block_stride + (slot % cap) * 1024);
      }
    }
    return r;
  }
};

// x (exact latent) and y (forward RoPE at table row `row`, SPEC 1.4 contraction).
inline void rope_xy(const uint16_t* lat, const float* table, int64_t row, float* x, float* y) {
  for (int d = 0; d < 512; ++d) x[d] = y[d] = num::bf16_decode(lat[d]);
  const float* tr = table + row * 64;
  for (int i = 0; i < 32; ++i)
    num::rope_forward(x[448 + 2 * i], x[449 + 2 * i], tr[i], tr[32 + i], y[448 + 2 * i],
                      y[449 + 2 * i]);
}

// Writes the record of `f` for latent `lat` at `slot` into an expected backing (bytes or bf16).
inline void write_expected(void* base, RecordFormat f, int64_t S, int64_t page_stride,
                           int64_t row_stride, float fp8_scale, int64_t slot, const uint16_t* lat,
                           const float* table, int64_t row) {
  float x[512], y[512];
  rope_xy(lat, table, row, x, y);
  const int64_t page = slot / S, off = slot % S;
  auto* b8 = static_cast<uint8_t*>(base);
  switch (f) {
    case RecordFormat::V4_584: rec::write_v4_584(b8 + page * page_stride, S, off, x, y); break;
    case RecordFormat::MXFP8_528: rec::write_mxfp8_528(b8 + page * page_stride, S, off, y); break;
    case RecordFormat::NVFP4_288: rec::write_nvfp4_288(b8 + page * page_stride, S, off, y); break;
    case RecordFormat::PLAIN_BF16:
      rec::write_plain_bf16(static_cast<uint16_t*>(base) + page * page_stride + off * row_stride, y);
      break;
    case RecordFormat::PLAIN_FP8:
      rec::write_plain_fp8(b8 + page * page_stride + off * row_stride, y, 1.0f / fp8_scale);
      break;
  }
}

// The batch of the validation tests (three requests of 1, 5 and 13 tokens starting at 7, 8, 13),
// and the check that a rejected call wrote nothing into its canary-filled outputs.
inline Batch base_batch(int ratio = 2) {
  Rng rng(123 + ratio);
  BatchSpec s;
  s.ratio = ratio;
  s.lengths = {1, 5, 13};
  s.starts = {7, 8, 13};
  return Batch::make(s, rng);
}
inline void expect_untouched(const Batch& b) {
  EXPECT_TRUE(bits_equal(b.ring_in, b.ring.vec(), "ring"));
  EXPECT_TRUE(b.latent.untouched()) << "latent written";
  EXPECT_TRUE(b.cache_u8.untouched()) << "cache written";
}

}  // namespace dsv41kv::test
