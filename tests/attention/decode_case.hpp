// A random decode call (SPEC 9.4) of the attention tests (and a random prefill call over a
// workspace, RandomPrefill): paged SWA and compressed caches of given
// formats with random valid records, index rows with every length pattern (0, full, random, all
// masked, masked entries inside the prefix, garbage past the length), random queries and sinks
// (finite, -inf, +inf; padded heads with q = 0 and sink -inf), and the binary64 expectation.
#pragma once

#include <memory>
#include <vector>

#include "attention/fixture.hpp"

namespace dsv41kv::test {

struct DecodeSpec {
  int H = 16;
  int real_heads = 0;  // 0: all heads real; else heads >= real_heads are padding
  int64_t T = 5;
  int s_q = 1;
  RecordFormat swa_format = RecordFormat::V4_584;
  int64_t swa_S = 32, swa_pages = 9, swa_extra = 0;
  int ratio = 2;  // 0: swaonly
  RecordFormat cmp_format = RecordFormat::V4_584;
  int64_t block_size = 64, cmp_pages = 7, cmp_extra = 96;
  int64_t extra_index_rows = 1;  // index buffers have rows beyond T (persistent buffers)
  bool latent_sized = false;     // states of a normalized latent's size (RandomCache)
};

inline float default_scale() { return num::u2f(0x3D3504F3u); }  // 512^-0.5

struct DecodeCase {
  DecodeSpec spec;
  std::unique_ptr<RandomCache> swa, cmp;
  std::vector<int32_t> swa_idx, swa_len, cmp_idx, cmp_len;
  std::vector<uint16_t> q;
  std::vector<float> sink;
  float scale = default_scale();
  DecodeSchedule schedule;

  LayerType layer() const { return spec.ratio == 0 ? LayerType::kSwaOnly : static_cast<LayerType>(spec.ratio); }

  static DecodeCase make(const DecodeSpec& s, Rng& rng) {
    DecodeCase c;
    c.spec = s;
    c.swa = std::make_unique<RandomCache>(s.swa_format, s.swa_S, s.swa_pages, s.swa_extra, rng, s.latent_sized);
    const int64_t rows = s.T + s.extra_index_rows;
    fill_rows(c.swa_idx, c.swa_len, rows, kSwaWindow, c.swa->capacity(), s.T, rng);
    if (s.ratio > 0) {
      c.cmp = std::make_unique<RandomCache>(s.cmp_format, s.block_size / s.ratio, s.cmp_pages, s.cmp_extra, rng,
                                           s.latent_sized);
      fill_rows(c.cmp_idx, c.cmp_len, rows, kIndexTopk, c.cmp->capacity(), s.T, rng);
    }
    const int real = s.real_heads > 0 ? s.real_heads : s.H;
    c.q.assign(static_cast<size_t>(s.T * s.H * kLatentDim), 0);
    for (int64_t t = 0; t < s.T; ++t)
      for (int h = 0; h < real; ++h)
        for (int d = 0; d < kLatentDim; ++d)
          c.q[static_cast<size_t>((t * s.H + h) * kLatentDim + d)] = num::bf16_encode(static_cast<float>(rng.normal()));
    c.sink.resize(static_cast<size_t>(s.H));
    for (int h = 0; h < s.H; ++h)
      c.sink[static_cast<size_t>(h)] = h >= real         ? -kInf
                                       : h % 7 == 3      ? -kInf
                                       : h % 11 == 5     ? kInf
                                                         : static_cast<float>(rng.normal() * 2.0);
    c.plan(0, 1);
    return c;
  }

  // The schedule arguments of this case on `device`.
  DecodeScheduleArgs schedule_args(Device device) const {
    DecodeScheduleArgs a;
    a.layer = layer();
    a.num_tokens = spec.T;
    a.num_heads = spec.H;
    a.s_q = spec.s_q;
    a.block_size = spec.block_size;
    a.device = device;
    return a;
  }
  // A schedule planned for `threads`; splits > 0 overrides the planned split.
  void plan(int64_t splits, int threads) {
    schedule = plan_decode_schedule(schedule_args(Device::CPU), ExecContext{nullptr, threads});
    if (splits > 0) schedule.splits = splits;
  }
  // The CUDA schedule of the current device; splits / head_tile > 0 override the planned ones.
  void plan_cuda(int64_t splits = 0, int head_tile = 0) {
    schedule = plan_decode_schedule(schedule_args(Device::CUDA));
    if (splits > 0) schedule.splits = splits;
    if (head_tile > 0) schedule.head_tile = head_tile;
  }

  SparseDecodeArgs args(Outputs& o) {
    SparseDecodeArgs a;
    a.schedule = &schedule;
    a.s_q = spec.s_q;
    a.q = TensorView::contiguous(q.data(), DType::BF16, {spec.T, spec.H, kLatentDim});
    a.swa_cache = swa->view;
    const int64_t rows = spec.T + spec.extra_index_rows;
    a.swa_indices = TensorView::contiguous(swa_idx.data(), DType::I32, {rows, kSwaWindow});
    a.swa_lens = view_of(swa_len);
    if (spec.ratio > 0) {
      a.cmp_cache = cmp->view;
      a.cmp_indices = TensorView::contiguous(cmp_idx.data(), DType::I32, {rows, kIndexTopk});
      a.cmp_lens = view_of(cmp_len);
    }
    a.sink = view_of(sink);
    a.softmax_scale = scale;
    a.out = o.out_view();
    a.lse = o.lse_view();
    return a;
  }

  // The valid slots of row t of one key list.
  static std::vector<int64_t> valid(const std::vector<int32_t>& idx, const std::vector<int32_t>& len, int64_t width,
                                    int64_t t) {
    std::vector<int64_t> s;
    for (int32_t j = 0; j < len[static_cast<size_t>(t)]; ++j)
      if (idx[static_cast<size_t>(t * width + j)] >= 0) s.push_back(idx[static_cast<size_t>(t * width + j)]);
    return s;
  }
  // The dequantized key set of token t: its compressed keys, then its SWA keys.
  std::vector<uint16_t> keys(int64_t t) const {
    std::vector<uint16_t> k;
    if (spec.ratio > 0) k = dequantized(cmp->view, valid(cmp_idx, cmp_len, kIndexTopk, t));
    append(k, dequantized(swa->view, valid(swa_idx, swa_len, kSwaWindow, t)));
    return k;
  }
  Expected expected() const {
    Expected e;
    e.H = spec.H;
    for (int64_t t = 0; t < spec.T; ++t)
      e.add(q.data() + t * spec.H * kLatentDim, kLatentDim, keys(t), sink.data(), scale);
    return e;
  }

 private:
  // Rows of `width` entries: row t % 5 == 0 full, 1 empty (length 0), 2 all masked, 3 one to four
  // entries, 4 a random length; some entries inside the length masked, the entries past it
  // garbage (ignored by the op).
  static void fill_rows(std::vector<int32_t>& idx, std::vector<int32_t>& len, int64_t rows, int64_t width,
                        int64_t capacity, int64_t T, Rng& rng) {
    idx.assign(static_cast<size_t>(rows * width), 0);
    len.assign(static_cast<size_t>(rows), 0);
    for (int64_t t = 0; t < rows; ++t) {
      const int64_t kind = t % 5;
      const int64_t n = t >= T      ? rng.integer(0, width)
                        : kind == 0 ? width
                        : kind == 1 ? 0
                        : kind == 3 ? rng.integer(1, 4)  // a few keys: the sink weighs as much as they do
                                    : rng.integer(1, width);
      len[static_cast<size_t>(t)] = static_cast<int32_t>(n);
      for (int64_t j = 0; j < width; ++j) {
        int32_t v;
        if (j >= n) v = static_cast<int32_t>(rng.integer(0, 1) ? rng.integer(capacity, int64_t{1} << 30) : rng.integer(-99, -1));
        else if (kind == 2 || rng.integer(0, 9) == 0) v = -1;
        else v = static_cast<int32_t>(rng.integer(0, capacity - 1));
        idx[static_cast<size_t>(t * width + j)] = v;
      }
    }
  }
};

// A random sparse_prefill call over a workspace of s_kv bf16 rows: row t of the index rows has
// length 0 (t = 1), topk (t = 2) or a random one; its entries are masked (t = 3: all; else one in
// ten below 0, one in ten at or past s_kv) or random rows; sinks +inf (head 2), -inf (head 5) or
// normal. Outputs left to the caller.
struct RandomPrefill {
  int64_t T = 0, H = 0, s_kv = 0, topk = 0;
  std::vector<uint16_t> kv, q;
  std::vector<int32_t> idx, len;
  std::vector<float> sink;
  RandomPrefill(int64_t T_, int64_t H_, int64_t s_kv_, int64_t topk_, Rng& rng)
      : T(T_), H(H_), s_kv(s_kv_), topk(topk_), kv(static_cast<size_t>(s_kv_ * kLatentDim)),
        q(static_cast<size_t>(T_ * H_ * kLatentDim)), idx(static_cast<size_t>(T_ * topk_)), len(static_cast<size_t>(T_)),
        sink(static_cast<size_t>(H_)) {
    for (auto& v : kv) v = random_bf16_value(rng, 3.0);
    for (auto& v : q) v = num::bf16_encode(static_cast<float>(rng.normal()));
    for (int64_t t = 0; t < T; ++t) {
      len[static_cast<size_t>(t)] = static_cast<int32_t>(t == 1 ? 0 : t == 2 ? topk : rng.integer(1, topk));
      for (int64_t j = 0; j < topk; ++j) {
        const int64_t k = rng.integer(0, 9);  // masked: < 0 or >= s_kv
        idx[static_cast<size_t>(t * topk + j)] =
            static_cast<int32_t>(t == 3 || k == 0 ? -1 : k == 1 ? rng.integer(s_kv, 1 << 20) : rng.integer(0, s_kv - 1));
      }
    }
    for (int64_t h = 0; h < H; ++h)
      sink[static_cast<size_t>(h)] = h == 2 ? kInf : h == 5 ? -kInf : static_cast<float>(rng.normal());
  }
  SparsePrefillArgs args(Outputs& o) {
    SparsePrefillArgs a = prefill_args(q, T, H, kv, idx, topk, len, sink, default_scale());
    a.out = o.out_view();
    a.lse = o.lse_view();
    return a;
  }
};

}  // namespace dsv41kv::test
