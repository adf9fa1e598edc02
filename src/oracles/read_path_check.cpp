// The read path's oracles (read_path_check.hpp).
#include "dsv41kv/read_path_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/host_copy.hpp"
#include "core/parallel.hpp"
#include "dsv41kv/reference.hpp"
#include "dsv41kv/rng.hpp"
#include "dsv41kv/buffer.hpp"
#include "formats/insert.hpp"

namespace dsv41kv::oracles {

namespace {

// The hash stream of one token's values of one input of one layer.
uint64_t token_key(uint64_t seed, int layer, int input, const pipeline::TokenId& t) {
  uint64_t h = splitmix64(seed ^ 0xA5A5A5A5A5A5A5A5ull);
  h = splitmix64(h ^ static_cast<uint64_t>(layer));
  h = splitmix64(h ^ static_cast<uint64_t>(input));
  h = splitmix64(h ^ static_cast<uint64_t>(t.request));
  return splitmix64(h ^ static_cast<uint64_t>(t.position));
}

void fill_bf16(uint16_t* row, int64_t n, uint64_t key, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) row[i] = num::bf16_encode(hash_float(splitmix64(key + static_cast<uint64_t>(i)), lo, hi));
}

template <class T>
void fill_rows(const TensorView& v, std::span<const pipeline::TokenId> tokens, int64_t num_rows, int64_t row_elems,
               uint64_t seed, int layer, int input, float lo, float hi) {
  auto* base = v.ptr<T>();
  const int64_t stride = v.stride[0];
  for (size_t t = 0; t < tokens.size(); ++t) {
    T* row = base + static_cast<int64_t>(t) * stride;
    const uint64_t key = token_key(seed, layer, input, tokens[t]);
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t i = 0; i < row_elems; ++i) row[i] = hash_float(splitmix64(key + static_cast<uint64_t>(i)), lo, hi);
    } else {
      fill_bf16(row, row_elems, key, lo, hi);
    }
  }
  for (int64_t t = static_cast<int64_t>(tokens.size()); t < num_rows; ++t)
    std::memset(base + t * stride, 0, static_cast<size_t>(row_elems) * sizeof(T));
}

using HostBytes = detail::HostCopy;

// A cache view whose backing is on the host (a copy of a device cache's whole backing).
CacheView host_cache(const CacheView& c, std::vector<uint8_t>& store, const ExecContext& ctx) {
  if (c.device == Device::CPU || c.base == nullptr) return c;
  store.resize(c.backing_bytes());
  download_view(TensorView::contiguous(c.base, DType::U8, {static_cast<int64_t>(store.size())}, c.device), store.data(),
                ctx);
  CacheView h = c;
  h.base = store.data();
  h.device = Device::CPU;
  return h;
}

}  // namespace

void SeededActivations::fill(const LayerInfo& layer, std::span<const pipeline::TokenId> tokens, int64_t num_rows,
                             const pipeline::LayerInputs& out) {
  const int L = layer.index;
  fill_rows<uint16_t>(out.q, tokens, num_rows, out.q.shape[1] * kLatentDim, seed_, L, 0, -1.0f, 1.0f);
  fill_rows<uint16_t>(out.kv, tokens, num_rows, kLatentDim, seed_, L, 1, -2.0f, 2.0f);
  if (out.kv_score.present())
    fill_rows<float>(out.kv_score, tokens, num_rows, out.kv_score.shape[1], seed_, L, 2, -2.0f, 2.0f);
  if (out.index_q.present())
    fill_rows<uint16_t>(out.index_q, tokens, num_rows, int64_t{kIndexHeads} * kIndexHeadDim, seed_, L, 3, -1.0f, 1.0f);
  if (out.w_raw.present()) fill_rows<uint16_t>(out.w_raw, tokens, num_rows, kIndexHeads, seed_, L, 4, -1.0f, 1.0f);
}

LayerCheck check_layer_dense(const pipeline::ModelRunner& runner, const pipeline::AttentionLayer& layer,
                             std::span<const int64_t> rows, const ExecContext& ctx) {
  return check_layer_dense(runner.metadata(), runner.shared(), layer, rows, ctx);
}

LayerCheck check_layer_dense(const pipeline::StepMetadata& meta, const pipeline::LayerShared& shared,
                             const pipeline::AttentionLayer& layer, std::span<const int64_t> rows,
                             const ExecContext& ctx) {
  const LayerInfo& li = layer.info();
  const int Hp = static_cast<int>(layer.attention_out().shape[1]);
  const int64_t A = meta.num_tokens();
  std::vector<int64_t> all;
  if (rows.empty()) {
    for (int64_t t = 0; t < A; ++t) all.push_back(t);
    rows = all;
  }
  // device runs are read back first (the check is a host computation)
  const HostBytes h_pos(meta.positions(), ctx), h_t2r(meta.token_to_req(), ctx), h_slot(meta.swa_slots(), ctx);
  const auto* pos = h_pos.as<int64_t>();
  const auto* t2r = h_t2r.as<int32_t>();
  const auto* slot_swa = h_slot.as<int64_t>();
  const TensorView swa_bt = meta.host_swa_block_table();
  const int64_t P = meta.config().swa.page_tokens;
  std::vector<uint8_t> swa_store, cmp_store;
  const CacheView swa = host_cache(layer.swa_cache(), swa_store, ctx);
  const int r = li.ratio;
  const pipeline::AttentionLayer* src = r > 0 ? shared.layer(li.kv_src) : nullptr;
  const CacheView cmp = src ? host_cache(src->compressed_cache(), cmp_store, ctx) : CacheView{};
  const TensorView cbt = r > 0 ? meta.host_block_table(r) : TensorView{};
  const int64_t S = r > 0 ? meta.config().states_per_page(r) : 0;
  const HostBytes h_topk(shared.topk(), ctx);
  const auto* topk = h_topk.as<int32_t>();
  std::vector<float> sink(static_cast<size_t>(Hp), -std::numeric_limits<float>::infinity());
  std::copy(layer.sink().begin(), layer.sink().end(), sink.begin());
  const double scale = kSoftmaxScale;
  const size_t n = rows.size(), head = kLatentDim;
  std::vector<double> ref_out(n * static_cast<size_t>(Hp) * head), ref_lse(n * static_cast<size_t>(Hp));
  std::vector<uint16_t> out(n * static_cast<size_t>(Hp) * head);
  std::vector<float> lse(n * static_cast<size_t>(Hp));
  const HostBytes h_q(layer.q_rotated(), ctx), h_o(layer.attention_out(), ctx), h_l(layer.lse(), ctx);
  const auto* q = h_q.as<uint16_t>();
  const auto* o = h_o.as<uint16_t>();
  const auto* l = h_l.as<float>();
  // the host reference runs on the CPU's threads (no stream)
  ExecContext host_ctx = ctx;
  host_ctx.stream = nullptr;
  detail::parallel_for(static_cast<int64_t>(n), host_ctx, 1, [&](int64_t i0, int64_t i1) {
    std::vector<uint16_t> keys;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = rows[static_cast<size_t>(i)], p = pos[t], b = t2r[t];
      keys.clear();
      auto push = [&](const CacheView& c, int64_t slot) {
        keys.resize(keys.size() + head);
        detail::read_state(c, slot, keys.data() + keys.size() - head);
      };
      if (slot_swa[t] >= 0) {  // SPEC 9.3: an invalid token has no key
        if (r > 0) {           // C(t): the top-k prefix of the kv source's entries
          const int64_t k = std::min<int64_t>(closed_groups(p + 1, int64_t{r}), kIndexTopk);
          for (int64_t j = 0; j < k; ++j) {
            const int32_t e = topk[t * kIndexTopk + j];
            if (e < 0) continue;
            const int32_t page = cbt.ptr<const int32_t>()[b * cbt.stride[0] + e / S];
            if (page > 0) push(cmp, int64_t{page} * S + e % S);
          }
        }
        for (int64_t u = swa_window_start(p); u <= p; ++u) {  // W(p)
          const int32_t page = swa_bt.ptr<const int32_t>()[b * swa_bt.stride[0] + u / P];
          if (page > 0) push(swa, int64_t{page} * P + u % P);
        }
      }
      const reference::AttentionResult ref = reference::sparse_attention(
          q + t * Hp * kLatentDim, kLatentDim, Hp, keys.data(), static_cast<int64_t>(keys.size() / head), sink.data(), scale);
      std::copy(ref.out.begin(), ref.out.end(), ref_out.begin() + i * Hp * kLatentDim);
      std::copy(ref.lse.begin(), ref.lse.end(), ref_lse.begin() + i * Hp);
      std::copy(o + t * Hp * kLatentDim, o + (t + 1) * Hp * kLatentDim, out.begin() + i * Hp * kLatentDim);
      std::copy(l + t * Hp, l + (t + 1) * Hp, lse.begin() + i * Hp);
    }
  });
  LayerCheck c;
  c.rows = static_cast<int64_t>(n);
  c.out = conformance::check_attention_out(out.data(), ref_out.data(), c.rows * Hp);
  c.lse = conformance::check_attention_lse(lse.data(), ref_lse.data(), c.rows * Hp);
  return c;
}

conformance::ReadCheck compare_layer_rows(const uint16_t* out, const uint16_t* ref, int64_t rows, int num_heads) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(num_heads) * kLatentDim;
  std::vector<double> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = num::bf16_decode(ref[i]);
  return conformance::check_attention_out(out, r.data(), rows * num_heads, kNopeDim);  // after SPEC 9.6
}

}  // namespace dsv41kv::oracles
