// dsv41kv: sparse MLA attention with an attention sink (SPEC section 9): the decode path over the
// paged SWA and compressed caches (9.4) with its per-step decode schedule, the prefill path over a
// bf16 workspace (9.5: the chunk plan, the workspace gather, the combined index rows, the
// attention), and the output inverse RoPE (9.6).
//
// Every function validates all of its arguments on the host before touching any output and
// throws dsv41kv::Error (E8) naming the argument, the value and what was expected. CUDA views run
// CUDA kernels on ctx.stream (the attention on tensor cores within SPEC 9.7 of the CPU, the
// gather, the index rows and the inverse RoPE bit for bit); their rows of 512 bf16 values
// must be 16-byte aligned with strides that are multiples of 8 elements (E8), and values in device
// memory (slots, lengths, page ids) are not read on the host: an index a kernel cannot use is
// masked or not written. The CPU backend is multi-threaded (ctx.num_threads) and its results do not depend on the
// thread count or on the decode schedule's split: every output is bit-identical whatever they are.
//
// Numerics (SPEC 9.2, 9.7; docs/numerics.md): fp32 scores and accumulators, exp in binary64
// rounded to fp32, probabilities kept in fp32 for the PV product, bf16 outputs (RNE). `lse` is
// the natural log-sum-exp of a row's scores without the sink, +inf for a row without a valid key
// (whose output is 0 whatever the sink).
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "dsv41kv/common.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv {

// Query heads an attention op serves: the model's 64 (or 128, padded with sink -inf heads) and
// the tensor-parallel shards of 64 heads (32, 16, 8).
inline constexpr int kAttentionHeadCounts[] = {8, 16, 32, 64, 128};
// Query tokens per request of a decode call (MTP / speculative decode), at most.
inline constexpr int kMaxDecodeQueriesPerRequest = 6;
// The model's softmax scale 512^-0.5 in fp32 (SPEC 1.1: 0x3D3504F3).
inline constexpr float kSoftmaxScale = std::bit_cast<float>(0x3D3504F3u);
// Width of a combined prefill index row (SPEC 9.5 step 2): round_up(512 + 128, 128).
inline constexpr int kPrefillIndexWidth = 640;

// ---------------------------------------------------------------- decode (SPEC 9.4)

// The decode schedule of one step and one layer type (SPEC 6.7: each layer type present in the
// model gets its own per step), planned once and used by every layer of that type: how many
// work items (splits) each query token's key list is cut into. The key list of a token (its
// valid compressed keys, then its valid SWA keys) is attended in fixed blocks of
// kDecodeKeyBlock keys whose partial results are merged by log-sum-exp in block order, and the
// sink applied once after the merge; a split is a run of whole blocks, so the split only decides
// which thread computes which block and never changes a result (split-K that is bit-identical
// for every split count and thread count).
inline constexpr int kDecodeKeyBlock = 64;

struct DecodeScheduleArgs {
  LayerType layer = LayerType::kSwaOnly;
  int64_t num_tokens = 0;    // T: decode query rows of the step (padding rows included)
  int num_heads = 64;        // H of q (one of kAttentionHeadCounts)
  int s_q = 1;               // query tokens per request, 1 .. 6; T % s_q == 0
  // Tokens per compressed kernel page (SPEC 6.7: 64 on SM90 and the CPU); the compressed cache of
  // a c1a / c2a layer has block_size / r states per page. Unused for swaonly.
  int64_t block_size = 64;
  // Where the schedule runs: CPU splits by ctx's threads; CUDA splits and head tiles by the
  // current device's SMs (the CUDA path of sparse_decode needs a CUDA schedule).
  Device device = Device::CPU;
};

struct DecodeSchedule {
  LayerType layer = LayerType::kSwaOnly;
  int64_t num_tokens = 0;
  int num_heads = 0;
  int s_q = 1;
  int64_t cmp_states_per_page = 0;  // block_size / r (0 for swaonly)
  int64_t key_width = 0;            // index entries per token: 128, or 128 + 512
  int64_t key_blocks = 0;           // ceil(key_width / kDecodeKeyBlock): the most a token has
  int64_t splits = 1;               // work items per token, 1 .. key_blocks (any value in range
                                    // gives the same results; tests set it directly)
  Device device = Device::CPU;      // as planned (DecodeScheduleArgs::device)
  // CUDA: query heads per CTA (16, 32 or 64; H % head_tile == 0, or H = 8 in a 16-row tile).
  // Any valid value gives results within SPEC 9.7; tests set it directly. 0 on the CPU.
  int head_tile = 0;
};
// f32 elements of the split-K workspace sparse_decode needs on CUDA for this schedule:
// T * splits * H * (512 + 1) for a CUDA schedule with splits > 1 (the normalized partial rows and
// their lse), else 0: the CPU backend needs none.
int64_t sparse_decode_workspace_floats(const DecodeSchedule& schedule);
// Plans the split from T, the key width and the threads of ctx (enough items to use every thread
// when T is small). E8 for a bad layer type, T < 0, a head count outside kAttentionHeadCounts,
// s_q outside 1..6 or not dividing T, or a block size that ratio r does not divide.
DecodeSchedule plan_decode_schedule(const DecodeScheduleArgs& args, const ExecContext& ctx = {});

// Decode attention (SPEC 9.2, 9.4) of T query rows, each with its own key set: the SWA keys
// swa_indices[t][0 .. swa_lens[t]) of the layer's SWA cache and, unless the schedule is swaonly,
// the compressed keys cmp_indices[t][0 .. cmp_lens[t]) of the kv source's compressed cache.
// Entries are global slots (page * S + offset); a negative entry is masked; entries at or past a
// row's length are ignored whatever they hold; a slot at or beyond the cache's num_pages * S is
// an E8 (host views). K = V = the dequantized 512-d state (SPEC 5.3).
struct SparseDecodeArgs {
  const DecodeSchedule* schedule = nullptr;  // plan_decode_schedule for this T, H, s_q, layer
  int s_q = 1;                // query tokens per request (must equal the schedule's)
  TensorView q;               // bf16 [T, H, 512] (already rotated), inner stride 1
  CacheView swa_cache;        // v4_584, mxfp8_528, bf16 or fp8 (288 is a compressed-cache format)
  TensorView swa_indices;     // i32 [rows >= T, 128], inner stride 1
  TensorView swa_lens;        // i32 [>= T], each 0 .. 128
  CacheView cmp_cache;        // c1a / c2a: any format, states_per_page == the schedule's
  TensorView cmp_indices;     // c1a / c2a: i32 [rows >= T, 512]; swaonly: absent
  TensorView cmp_lens;        // c1a / c2a: i32 [>= T], each 0 .. 512; swaonly: absent
  TensorView sink;            // f32 [H]; -inf: no effect; +inf: output 0; NaN is an E8
  float softmax_scale = 0.0f; // finite, > 0 (the model's 512^-0.5)
  TensorView out;             // bf16 [rows >= T, H, 512], inner stride 1; rows >= T untouched
  TensorView lse;             // f32 [rows >= T, H], inner stride 1; rows >= T untouched
  // CUDA with splits > 1: f32 [>= sparse_decode_workspace_floats(*schedule)] on the device,
  // 16-byte aligned, caller-owned (no allocation per call; graph-capturable); otherwise unused.
  TensorView workspace;
};
void sparse_decode(const SparseDecodeArgs& args, const ExecContext& ctx = {});

// ---------------------------------------------------------------- prefill (SPEC 9.5)

// Rows of the prefill workspace (cap_ws of SPEC 9.5): 4 * (ceil(max_model_len / r) [r > 0] + 128
// + max_num_batched_tokens). E8 for a ratio outside {0, 1, 2} or sizes < 1.
int64_t prefill_workspace_rows(int ratio, int64_t max_model_len, int64_t max_num_batched_tokens);

// One chunk of prefill requests [req_begin, req_end) (indices into the prefill requests of the
// step) with its constants N_ch = max N_b and M_ch = max N_b + max G_b.
struct PrefillChunk {
  int64_t req_begin = 0, req_end = 0;
  int64_t n_ch = 0, m_ch = 0;
  int64_t num_reqs() const { return req_end - req_begin; }
};

// The greedy chunk plan of SPEC 9.5 over the step's prefill requests: a request joins the current
// chunk while #reqs * (max N + max G) <= cap_ws, with N_b = seq_len_b / r (0 for r = 0) and the
// gather length G_b (SPEC 6.6, built by the metadata). Host views only. E8 for a bad ratio or
// size, seq_len outside 1 .. max_model_len, G_b outside 1 .. seq_len, or a request whose N_b + G_b
// alone exceeds cap_ws.
struct PrefillChunkArgs {
  int ratio = 0;                     // the layer's compress ratio: 0, 1, 2
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 0;
  TensorView seq_lens;               // i32 [R]
  TensorView gather_lens;            // i32 [R]: G_b
};
std::vector<PrefillChunk> plan_prefill_chunks(const PrefillChunkArgs& args);

// Step 1 of SPEC 9.5, the workspace gather of one chunk: for its bi-th request b,
//   workspace[bi * M_ch + i]        = dequantized compressed entry i < N_b of b (r > 0),
//   workspace[bi * M_ch + N_ch + k] = dequantized SWA token at position gather_start_b + k, k < G_b,
// through the requests' block tables (slot = table[b][x / S] * S + x % S, SPEC 3.1; the kernels do
// not special-case page 0). Every other workspace row is left untouched. Host values: G_b, N_b
// within the chunk's constants, gather_start_b + G_b <= seq_len_b, table columns inside the
// table, page ids in [0, num_pages) (E8 otherwise).
struct WorkspaceGatherArgs {
  int ratio = 0;
  PrefillChunk chunk;
  TensorView seq_lens;          // i32 [R]
  TensorView gather_lens;       // i32 [R]: G_b
  TensorView gather_starts;     // i32 [R]: gather_start_b (SPEC 6.6, built by the metadata)
  CacheView swa_cache;          // any SWA format (as sparse_decode)
  TensorView swa_block_table;   // i32 [R, pages]
  CacheView cmp_cache;          // r > 0
  TensorView cmp_block_table;   // r > 0: i32 [R, pages]; r = 0: absent
  TensorView workspace;         // bf16 [rows >= chunk.num_reqs() * M_ch, 512], inner stride 1
};
void gather_prefill_workspace(const WorkspaceGatherArgs& args, const ExecContext& ctx = {});

// Step 2 of SPEC 9.5, the combined index rows of the chunk's query tokens (width 640, -1 filled):
// with topk_len = r > 0 ? min(n_c(p), 512) : 0, entry j < topk_len is M_ch * bi + i for
// i = topk[t][j] when 0 <= i < N_ch, else -1 (in place); then the window rows
// M_ch * bi + N_ch + (swa_start - gather_start_b) + k for k < swa_len, swa_start =
// max(p - 127, 0, gather_start_b), swa_len = p - swa_start + 1; length topk_len + swa_len.
// Host values: every token's request inside the chunk, its position inside the request's gathered
// range [gather_start_b, gather_start_b + G_b) (E8 otherwise).
struct PrefillIndexArgs {
  int ratio = 0;
  PrefillChunk chunk;
  TensorView positions;         // i64 [T]: the chunk's query tokens
  TensorView token_to_req;      // i32 [T]: prefill request index of each token (in the chunk)
  TensorView gather_lens;       // i32 [R]
  TensorView gather_starts;     // i32 [R]
  TensorView topk;              // r > 0: i32 [rows >= T, 512] (SPEC 8.5); r = 0: absent
  TensorView indices;           // i32 [rows >= T, 640] output; rows >= T untouched
  TensorView lengths;           // i32 [>= T] output (topk_length); entries >= T untouched
};
void build_prefill_indices(const PrefillIndexArgs& args, const ExecContext& ctx = {});

// Step 3 of SPEC 9.5: the attention of SPEC 9.2 over a bf16 workspace (K = V = its rows). Token
// t attends to kv[indices[t][j]] for j < topk_length[t]; an entry < 0 or >= s_kv is masked,
// entries at or past topk_length[t] are ignored whatever they hold. Same numerics, key blocks and
// merge order as sparse_decode: for the same keys in the same order both give the same bits.
struct SparsePrefillArgs {
  TensorView q;               // bf16 [T, H, 512], inner stride 1
  TensorView kv;              // bf16 [s_kv >= 0, 512], inner stride 1
  TensorView indices;         // i32 [rows >= T, topk >= 1], inner stride 1
  TensorView topk_length;     // i32 [>= T], each 0 .. topk
  TensorView sink;            // f32 [H]
  float softmax_scale = 0.0f;
  TensorView out;             // bf16 [rows >= T, H, 512]
  TensorView lse;             // f32 [rows >= T, H]
};
void sparse_prefill(const SparsePrefillArgs& args, const ExecContext& ctx = {});

// ---------------------------------------------------------------- output inverse RoPE (SPEC 9.6)

// out[t, h] = o[t, h] with the inverse rotation of SPEC 1.4 on dims 448..511 at row
// positions[t] of the layer's own table (plain for ratio 0, YaRN for ratio > 0), in fp32, stored
// bf16; NoPE dims copied. Only the real heads 0 .. num_real_heads - 1 are kept: `out` has
// num_real_heads heads and the padded heads of `o` are neither read nor written anywhere. `out`
// may be `o` itself (same data and strides, num_real_heads == H): the rotation is in place.
struct OutputRopeArgs {
  TensorView o;               // bf16 [T, H, 512], inner stride 1 (the attention output)
  int num_real_heads = 0;     // 1 .. H
  TensorView positions;       // i64 [>= T], each 0 .. table rows - 1
  TensorView rope_table;      // f32 [table_rows, 64], contiguous
  TensorView out;             // bf16 [rows >= T, num_real_heads, 512]; rows >= T untouched
};
void attention_output_rope(const OutputRopeArgs& args, const ExecContext& ctx = {});

}  // namespace dsv41kv
