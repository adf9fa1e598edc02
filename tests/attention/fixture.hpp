// What the attention tests share: a per-test seed (printed with every failure), paged caches
// holding random *valid* records of every format (every finite code: subnormals, -0, extreme
// codes, as in the conformance files), the dequantized keys of a slot list (through the public
// gather op), the binary64 reference of SPEC 9.2 over them, and the README's agreement rule on
// canary-filled outputs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dsv41kv/attention.hpp"
#include "dsv41kv/cache.hpp"
#include "dsv41kv/conformance.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/reference.hpp"
#include "support/canary.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {

inline constexpr uint16_t kOutCanary = kBf16NaN;
inline const float kLseCanary = -12345.0f;
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// A fresh seed per test (run_seed() and the test's name), and its Rng.
class AttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = seed_for(::testing::UnitTest::GetInstance()->current_test_info()->name());
    rng_ = std::make_unique<Rng>(seed_);
  }
  Rng& rng() { return *rng_; }
  std::string seed_text() const { return "seed " + std::to_string(seed_) + " (run_seed() ^ test name)"; }

 private:
  uint64_t seed_ = 0;
  std::unique_ptr<Rng> rng_;
};

// plan_prefill_chunks of host vectors.
inline std::vector<PrefillChunk> plan_chunks(int ratio, int64_t max_model_len, int64_t max_num_batched_tokens,
                                             std::vector<int32_t>& seq_lens, std::vector<int32_t>& gather_lens) {
  PrefillChunkArgs a;
  a.ratio = ratio;
  a.max_model_len = max_model_len;
  a.max_num_batched_tokens = max_num_batched_tokens;
  a.seq_lens = view_of(seq_lens);
  a.gather_lens = view_of(gather_lens);
  return plan_prefill_chunks(a);
}

// sparse_prefill's arguments over host vectors (outputs left to the caller).
inline SparsePrefillArgs prefill_args(std::vector<uint16_t>& q, int64_t T, int64_t H, std::vector<uint16_t>& kv,
                                      std::vector<int32_t>& idx, int64_t topk, std::vector<int32_t>& len,
                                      std::vector<float>& sink, float scale) {
  SparsePrefillArgs a;
  a.q = TensorView::contiguous(q.data(), DType::BF16, {T, H, kLatentDim});
  a.kv = TensorView::contiguous(kv.data(), DType::BF16, {static_cast<int64_t>(kv.size()) / kLatentDim, kLatentDim});
  a.indices = TensorView::contiguous(idx.data(), DType::I32, {T, topk});
  a.topk_length = view_of(len);
  a.sink = view_of(sink);
  a.softmax_scale = scale;
  return a;
}

// One bad-input case of an op's arguments: what it changes and a fragment of the message.
template <class Args>
struct BadCase {
  const char* name;
  std::function<void(Args&)> mutate;
  const char* part;
};

// A random finite e4m3 code (NaN codes 0x7F, 0xFF excluded).
inline uint8_t random_e4m3(Rng& rng) {
  for (;;) {
    const auto c = static_cast<uint8_t>(rng.next());
    if ((c & 0x7F) != 0x7F) return c;
  }
}
// A random bf16 of modest size, now and then a subnormal or a signed zero.
inline uint16_t random_bf16_value(Rng& rng, double scale = 1.0) {
  const int64_t k = rng.integer(0, 19);
  if (k == 0) return static_cast<uint16_t>(rng.integer(0, 1) << 15);                           // +-0
  if (k == 1) return static_cast<uint16_t>((rng.integer(0, 1) << 15) | rng.integer(1, 0x7F));  // subnormal
  return num::bf16_encode(static_cast<float>(rng.normal() * scale));
}

// A paged cache of one format whose every state holds random valid bytes; page padding and the
// bytes beyond the pages keep the canary. By default the states span the formats' whole range
// (values up to ~30); latent_sized keeps them below ~2, the size of a normalized latent (SPEC 4.6):
// the GPU tests' inputs, because the bf16 probabilities of SPEC 9.7 bound the GPU's error by
// ~2^-9 * sum_j p_j |v_j| and SPEC 9.7's 4e-3 absolute tolerance presumes states of that size.
struct RandomCache {
  CacheView view;
  CanaryBuffer<uint8_t> u8;     // packed and fp8 backings
  CanaryBuffer<uint16_t> bf16;  // bf16 backings

  RandomCache() = default;
  RandomCache(RecordFormat f, int64_t S, int64_t pages, int64_t extra_stride, Rng& rng, bool latent_sized = false)
      : scale_hi_(latent_sized ? 119 : 123), nv_scale_hi_(latent_sized ? 0x28 : 0x3F), rope_scale_(latent_sized ? 1.0 : 2.0) {
    const RecordInfo& ri = record_info(f);
    view = CacheView::with_default_strides(nullptr, f, pages, S);
    view.page_stride += extra_stride;
    view.fp8_scale = latent_sized ? 1.0f / 256 : 0.0625f;
    if (ri.element == DType::BF16) {
      bf16 = CanaryBuffer<uint16_t>(static_cast<size_t>(pages * view.page_stride), kBf16Canary);
      view.base = bf16.data();
    } else {
      u8 = CanaryBuffer<uint8_t>(static_cast<size_t>(pages * view.page_stride), kByteCanary);
      view.base = u8.data();
    }
    for (int64_t p = 0; p < pages; ++p)
      for (int64_t r = 0; r < S; ++r) fill_state(p, r, rng);
  }
  RandomCache(const RandomCache&) = delete;
  RandomCache& operator=(const RandomCache&) = delete;
  int64_t capacity() const { return view.num_pages * view.states_per_page; }

 private:
  int scale_hi_, nv_scale_hi_;  // UE8M0 exponents 117 .. scale_hi_; e4m3 NVFP4 scales 1 .. nv_scale_hi_
  double rope_scale_;
  void fill_state(int64_t p, int64_t r, Rng& rng) {
    const int64_t S = view.states_per_page;
    if (view.format == RecordFormat::PLAIN_BF16) {
      uint16_t* row = bf16.data() + p * view.page_stride + r * view.row_stride;
      for (int d = 0; d < kLatentDim; ++d) row[d] = random_bf16_value(rng);
      return;
    }
    uint8_t* pg = u8.data() + p * view.page_stride;
    switch (view.format) {
      case RecordFormat::V4_584: {
        uint8_t* val = pg + V4Layout::value_offset(S, r);
        for (int d = 0; d < kNopeDim; ++d) val[d] = random_e4m3(rng);
        for (int i = 0; i < kRopeDim; ++i) {
          const uint16_t b = random_bf16_value(rng, rope_scale_);
          val[kNopeDim + 2 * i] = static_cast<uint8_t>(b & 0xFF);
          val[kNopeDim + 2 * i + 1] = static_cast<uint8_t>(b >> 8);
        }
        uint8_t* sc = pg + V4Layout::scale_offset(S, r);
        for (int k = 0; k < 7; ++k) sc[k] = static_cast<uint8_t>(rng.integer(117, scale_hi_));
        sc[7] = 0;
        break;
      }
      case RecordFormat::MXFP8_528: {
        uint8_t* val = pg + Mxfp8Layout::value_offset(S, r);
        for (int d = 0; d < kLatentDim; ++d) val[d] = random_e4m3(rng);
        uint8_t* sc = pg + Mxfp8Layout::scale_offset(S, r);
        for (int k = 0; k < 16; ++k) sc[k] = static_cast<uint8_t>(rng.integer(117, scale_hi_));
        break;
      }
      case RecordFormat::NVFP4_288: {
        uint8_t* val = pg + Nvfp4Layout::value_offset(S, r);
        for (int j = 0; j < kLatentDim / 2; ++j) val[j] = static_cast<uint8_t>(rng.next());
        uint8_t* sc = pg + Nvfp4Layout::scale_offset(S, r);
        // positive scales 2^-9 (subnormal) .. 1.875 (latent-sized: .. 0.25), now and then zero
        for (int k = 0; k < 32; ++k) sc[k] = static_cast<uint8_t>(rng.integer(0, 15) == 0 ? 0 : rng.integer(1, nv_scale_hi_));
        break;
      }
      case RecordFormat::PLAIN_FP8: {
        uint8_t* row = pg + r * view.row_stride;
        for (int d = 0; d < kLatentDim; ++d) row[d] = random_e4m3(rng);
        break;
      }
      case RecordFormat::PLAIN_BF16: break;
    }
  }
};

// The dequantized states at `slots` (bf16 [n, 512]) through the public gather op (SPEC 5.3).
inline std::vector<uint16_t> dequantized(const CacheView& c, const std::vector<int64_t>& slots) {
  std::vector<uint16_t> out(slots.size() * kLatentDim, 0);
  if (slots.empty()) return out;
  std::vector<int64_t> s = slots;
  GatherArgs g;
  g.cache = c;
  g.slots = view_of(s);
  g.out = TensorView::contiguous(out.data(), DType::BF16, {static_cast<int64_t>(s.size()), kLatentDim});
  gather(g);
  return out;
}

// Concatenation of key rows.
inline void append(std::vector<uint16_t>& a, const std::vector<uint16_t>& b) { a.insert(a.end(), b.begin(), b.end()); }

// The binary64 reference of every token (rows of `ref_out` [T * H * 512], `ref_lse` [T * H]),
// filled token by token by the caller with add().
struct Expected {
  int H = 0;
  std::vector<double> out, lse;
  void add(const uint16_t* q_tok, int64_t q_head_stride, const std::vector<uint16_t>& keys, const float* sink,
           double scale) {
    const auto r = reference::sparse_attention(q_tok, q_head_stride, H, keys.data(),
                                               static_cast<int64_t>(keys.size() / kLatentDim), sink, scale);
    out.insert(out.end(), r.out.begin(), r.out.end());
    lse.insert(lse.end(), r.lse.begin(), r.lse.end());
  }
};

// The outputs of an attention op in canary-filled buffers with `extra` rows beyond T.
struct Outputs {
  int64_t T = 0, H = 0, extra = 0;
  CanaryBuffer<uint16_t> out;
  CanaryBuffer<float> lse;
  Outputs(int64_t T_, int64_t H_, int64_t extra_ = 2)
      : T(T_), H(H_), extra(extra_), out(static_cast<size_t>((T_ + extra_) * H_ * kLatentDim), kOutCanary),
        lse(static_cast<size_t>((T_ + extra_) * H_), kLseCanary) {}
  TensorView out_view() { return TensorView::contiguous(out.data(), DType::BF16, {T, H, kLatentDim}); }
  TensorView lse_view() { return TensorView::contiguous(lse.data(), DType::F32, {T, H}); }
  bool rows_beyond_untouched() const {
    for (size_t i = static_cast<size_t>(T * H * kLatentDim); i < out.size(); ++i)
      if (out[i] != kOutCanary) return false;
    for (size_t i = static_cast<size_t>(T * H); i < lse.size(); ++i)
      if (num::f2u(lse[i]) != num::f2u(kLseCanary)) return false;
    return true;
  }
  bool same_bits(const Outputs& o) const { return out.vec() == o.out.vec() && lse.vec() == o.lse.vec(); }
};

// The README's agreement rule (SPEC 9.7) on every row of `o`, and the canary beyond T.
inline void expect_agrees(const Outputs& o, const Expected& e, const std::string& what) {
  const conformance::ReadCheck co = conformance::check_attention_out(o.out.data(), e.out.data(), o.T * o.H);
  const conformance::ReadCheck cl = conformance::check_attention_lse(o.lse.data(), e.lse.data(), o.T * o.H);
  EXPECT_TRUE(co.pass) << what << ": " << co.summary << "; " << co.detail;
  EXPECT_TRUE(cl.pass) << what << ": " << cl.summary << "; " << cl.detail;
  EXPECT_TRUE(o.rows_beyond_untouched()) << what << ": rows beyond T were written";
}

}  // namespace dsv41kv::test
