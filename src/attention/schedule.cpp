// Host planning of the attention ops: the decode schedule (SPEC 6.7, 9.4) and the prefill
// workspace capacity and greedy chunk plan (SPEC 9.5).
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "attention/backend.hpp"
#include "attention/cuda/backend_cuda.hpp"
#include "core/parallel.hpp"
#include "core/validate.hpp"

namespace dsv41kv {

namespace detail {

bool attention_head_count_ok(int64_t H) {
  return std::find(std::begin(kAttentionHeadCounts), std::end(kAttentionHeadCounts), H) !=
         std::end(kAttentionHeadCounts);
}
std::string attention_head_counts() {
  std::string s;
  for (int h : kAttentionHeadCounts) s += (s.empty() ? "" : ", ") + std::to_string(h);
  return s;
}

int64_t plan_splits(int64_t T, int64_t key_blocks, int threads) {
  if (T <= 0 || key_blocks <= 1) return 1;
  const int64_t want = (threads + T - 1) / T;
  return std::clamp<int64_t>(want, 1, key_blocks);
}

CudaDecodePlan plan_cuda_decode(int64_t T, int H, int64_t key_blocks, int sms) {
  CudaDecodePlan c;
  const auto items_of = [&](int ht) { return T * ((H + ht - 1) / ht); };
  c.head_tile = H <= 16 ? 16 : H == 32 ? 32 : 64;
  // too few (token, head group) items to fill the SMs even when split into single blocks: 16-head
  // tiles quadruple them (the keys are dequantized once per tile, which is cheap next to idle SMs)
  if (c.head_tile > 16 && items_of(c.head_tile) * key_blocks < sms) c.head_tile = 16;
  const int64_t items = items_of(c.head_tile);
  c.splits = items <= 0 || items >= sms ? 1 : std::clamp<int64_t>((sms + items - 1) / items, 1, key_blocks);
  return c;
}

bool cuda_head_tile_ok(int H, int head_tile) {
  if (head_tile != 16 && head_tile != 32 && head_tile != 64) return false;
  return H % head_tile == 0 || (H == 8 && head_tile == 16);
}

}  // namespace detail

int64_t sparse_decode_workspace_floats(const DecodeSchedule& s) {
  if (s.device != Device::CUDA || s.splits <= 1 || s.num_tokens <= 0) return 0;
  return s.num_tokens * s.splits * s.num_heads * (kLatentDim + 1);
}

DecodeSchedule plan_decode_schedule(const DecodeScheduleArgs& a, const ExecContext& ctx) {
  const char* op = "plan_decode_schedule";
  detail::check_exec_context(ctx, op);
  const int r = static_cast<int>(a.layer);
  if (r < 0 || r > 2) detail::bad_arg(op, "layer", fmt::format("{}, expected swaonly (0), c1a (1) or c2a (2)", r));
  if (a.num_tokens < 0) detail::bad_arg(op, "num_tokens", fmt::format("{}, expected >= 0", a.num_tokens));
  if (!detail::attention_head_count_ok(a.num_heads))
    detail::bad_arg(op, "num_heads",
                    fmt::format("{}, expected one of {}", a.num_heads, detail::attention_head_counts()));
  if (a.s_q < 1 || a.s_q > kMaxDecodeQueriesPerRequest)
    detail::bad_arg(op, "s_q",
                    fmt::format("{}, expected 1 .. {} query tokens per request", a.s_q, kMaxDecodeQueriesPerRequest));
  if (a.num_tokens % a.s_q != 0)
    detail::bad_arg(op, "s_q", fmt::format("{} does not divide num_tokens = {}", a.s_q, a.num_tokens));
  DecodeSchedule s;
  s.layer = a.layer;
  s.num_tokens = a.num_tokens;
  s.num_heads = a.num_heads;
  s.s_q = a.s_q;
  if (r > 0) {
    if (a.block_size < 1 || a.block_size % r != 0)
      detail::bad_arg(op, "block_size",
                      fmt::format("{}, expected a positive multiple of the ratio {} ({} layer: block_size / r "
                                  "states per compressed page)",
                                  a.block_size, r, layer_type_name(a.layer)));
    s.cmp_states_per_page = a.block_size / r;
  }
  s.key_width = kSwaWindow + (r > 0 ? kIndexTopk : 0);
  s.key_blocks = (s.key_width + kDecodeKeyBlock - 1) / kDecodeKeyBlock;
  s.device = a.device;
  if (a.device == Device::CPU) {
    s.splits = detail::plan_splits(s.num_tokens, s.key_blocks, detail::cpu_threads(ctx));
  } else {
#if defined(DSV41KV_WITH_CUDA)
    const detail::CudaDecodePlan c =
        detail::plan_cuda_decode(s.num_tokens, s.num_heads, s.key_blocks, detail::cuda::sm_count());
    s.splits = c.splits;
    s.head_tile = c.head_tile;
#else
    detail::no_cuda(op);
#endif
  }
  return s;
}

namespace {
int64_t workspace_rows(const char* op, int ratio, int64_t max_model_len, int64_t max_num_batched_tokens) {
  constexpr int64_t kLimit = int64_t{1} << 40;  // keeps 4 * (...) far from overflow
  if (ratio < 0 || ratio > 2) detail::bad_arg(op, "ratio", fmt::format("{}, expected 0, 1 or 2", ratio));
  if (max_model_len < 1 || max_model_len > kLimit)
    detail::bad_arg(op, "max_model_len", fmt::format("{}, expected 1 .. 2^40", max_model_len));
  if (max_num_batched_tokens < 1 || max_num_batched_tokens > kLimit)
    detail::bad_arg(op, "max_num_batched_tokens", fmt::format("{}, expected 1 .. 2^40", max_num_batched_tokens));
  const int64_t cmp = ratio > 0 ? (max_model_len + ratio - 1) / ratio : 0;
  return 4 * (cmp + kSwaWindow + max_num_batched_tokens);
}
}  // namespace

int64_t prefill_workspace_rows(int ratio, int64_t max_model_len, int64_t max_num_batched_tokens) {
  return workspace_rows("prefill_workspace_rows", ratio, max_model_len, max_num_batched_tokens);
}

std::vector<PrefillChunk> plan_prefill_chunks(const PrefillChunkArgs& a) {
  const char* op = "plan_prefill_chunks";
  const int64_t cap = workspace_rows(op, a.ratio, a.max_model_len, a.max_num_batched_tokens);
  const int64_t R = detail::need_vector(op, a.seq_lens, "seq_lens", DType::I32, "i32 [R] sequence lengths");
  const int64_t nG = detail::need_vector(op, a.gather_lens, "gather_lens", DType::I32, "i32 [R] gather lengths", R);
  if (nG != R) detail::bad_arg(op, "gather_lens", fmt::format("{} entries, expected R = {} (seq_lens)", nG, R));
  detail::need_on(op, a.seq_lens, "seq_lens", Device::CPU);
  detail::need_on(op, a.gather_lens, "gather_lens", Device::CPU);
  const auto* seq = a.seq_lens.ptr<const int32_t>();
  const auto* gl = a.gather_lens.ptr<const int32_t>();
  std::vector<int64_t> N(static_cast<size_t>(R)), G(static_cast<size_t>(R));
  for (int64_t b = 0; b < R; ++b) {
    if (seq[b] < 1 || seq[b] > a.max_model_len)
      detail::bad_arg(op, "seq_lens",
                      fmt::format("seq_lens[{}] = {}, expected 1 .. max_model_len = {}", b, seq[b], a.max_model_len));
    if (gl[b] < 1 || gl[b] > seq[b])
      detail::bad_arg(op, "gather_lens",
                      fmt::format("gather_lens[{}] = {}, expected 1 .. seq_lens[{}] = {}", b, gl[b], b, seq[b]));
    N[static_cast<size_t>(b)] = a.ratio > 0 ? closed_groups(int64_t{seq[b]}, a.ratio) : 0;
    G[static_cast<size_t>(b)] = gl[b];
    if (N[static_cast<size_t>(b)] + G[static_cast<size_t>(b)] > cap)
      detail::bad_arg(op, "gather_lens",
                      fmt::format("request {} needs N_b + G_b = {} + {} workspace rows, expected <= cap_ws = {}", b,
                                  N[static_cast<size_t>(b)], G[static_cast<size_t>(b)], cap));
  }
  std::vector<PrefillChunk> chunks;
  for (int64_t b = 0; b < R;) {
    PrefillChunk c;
    c.req_begin = b;
    int64_t maxN = N[static_cast<size_t>(b)], maxG = G[static_cast<size_t>(b)];
    for (++b; b < R; ++b) {
      const int64_t n = std::max(maxN, N[static_cast<size_t>(b)]), g = std::max(maxG, G[static_cast<size_t>(b)]);
      if ((b - c.req_begin + 1) * (n + g) > cap) break;
      maxN = n;
      maxG = g;
    }
    c.req_end = b;
    c.n_ch = maxN;
    c.m_ch = maxN + maxG;
    chunks.push_back(c);
  }
  return chunks;
}

}  // namespace dsv41kv
