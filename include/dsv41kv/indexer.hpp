// dsv41kv: the lightning indexer (SPEC section 8) on paged index-K caches (SPEC 3.5): the index-K
// store of the kv sources (8.1), the query preparation with weight folding of every index source
// (8.2), the scores, causal visibility and top-k (8.3-8.5), the short-context shortcut (8.6) and
// the two-level candidate-block selection of layer 20 and its consumers (8.7).
//
// Every function validates all of its arguments on the host before touching any output and
// throws dsv41kv::Error (E8) naming the op, the argument, the value and what was expected. The
// backend is the device of the views (all on one device). Every op has CUDA kernels (device views
// are checked for shape only; indices a kernel cannot use write nothing): the K store, the Q
// preparation and the shortcut write the CPU's bytes; indexer_topk on CUDA computes the scores on
// tensor cores within SPEC 8.8's tolerance and needs a caller-owned `workspace`
// (indexer_topk_workspace_bytes).
//
// The per-step order of SPEC 9.8: indexer_k_store (kv sources) and indexer_prepare_q, then either
// indexer_shortcut_topk (when indexer_takes_shortcut says so) or indexer_topk.
#pragma once

#include <cstdint>

#include "dsv41kv/common.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv {

inline constexpr int kIndexHeads = 32;             // index_n_heads
inline constexpr int kCandidateBlockSize = 8;      // candidate_block_size: entries per block
inline constexpr int kCandidateTopkBlocks = 2048;  // candidate_topk_blocks: the width of a candidates row

// The record of an index-K cache (SPEC 3.5). FP8 is the default and the only format the scores
// read (SPEC 8.3 defines them over e4m3 keys with one fp32 scale); MXFP4 keys can be stored.
enum class IndexKFormat : uint8_t {
  FP8_132 = 0,    // 128 e4m3 values | fp32 scale 2^e (IndexerKFp8Layout)
  MXFP4_68 = 1,   // 64 bytes of e2m1 pairs | 4 UE8M0 bytes (IndexerKMxfp4Layout)
};
const char* index_k_format_name(IndexKFormat f);  // "fp8_132", "mxfp4_68"
int index_k_record_bytes(IndexKFormat f);         // 132, 68

// A paged index-K cache in caller-owned memory: state s of page p at base + p * page_stride, laid out
// page-segregated (the S values of a page, then their scales). It shares the block table and
// states per page S_r of the compressed cache of the same kv source (the same slot numbers), in its
// own tensor with its own page stride (bytes, >= S * record bytes; any larger value is honoured).
struct IndexKCacheView {
  void* base = nullptr;
  IndexKFormat format = IndexKFormat::FP8_132;
  int64_t num_pages = 0;
  int64_t states_per_page = 0;  // S_r
  int64_t page_stride = 0;      // bytes
  Device device = Device::CPU;

  int64_t payload_bytes() const { return states_per_page * index_k_record_bytes(format); }
  int64_t backing_bytes() const { return num_pages * page_stride; }
  // The library's default page stride (SPEC 3.1/3.6: 576-byte alignment for FP8, 512 for MXFP4).
  static IndexKCacheView with_default_strides(void* base, IndexKFormat f, int64_t num_pages,
                                              int64_t states_per_page, Device device = Device::CPU);
};

// ---------------------------------------------------------------- K store (SPEC 8.1)

// For each token t < N with slots[t] >= 0 that closes its group ((p + 1) % ratio == 0), from its
// bf16 latent (the compressor's output, before the RoPE of the compressed insert):
//   k = bf16(wk . latent)                       fp32, the fixed order of lin::dot_fixed
//   k = bf16(rmsnorm_128(k, k_norm, eps))       SPEC 4.6's op order, 32 partials of 4 elements
//   k = bf16(forward RoPE on dims 64..127 at table row (p / ratio) * ratio)
// then the record of cache.format at slots[t] (page slots / S, state slots % S). Nothing else is
// written. N = slots.shape[0]; slots is the compressed slot mapping of SPEC 6.5 (the same slots as
// the compressed cache).
struct IndexKStoreArgs {
  int ratio = 2;            // 1 or 2 (the kv source's compress ratio)
  TensorView latent;        // bf16 [rows >= N, 512], contiguous
  TensorView positions;     // i64 [>= N], contiguous
  TensorView slots;         // i64 [N]: compressed-cache slot or -1
  TensorView wk;            // bf16 [128, 512], contiguous
  TensorView k_norm;        // bf16 [128]
  float eps = 0.0f;         // config.rms_norm_eps (finite, >= 0)
  TensorView rope_table;    // f32 [table_rows, 64] (32 cos | 32 sin), contiguous: the layer's table
  IndexKCacheView cache;
};
void indexer_k_store(const IndexKStoreArgs& args, const ExecContext& ctx = {});

// ---------------------------------------------------------------- Q preparation (SPEC 8.2)

// For every token t < T = q.shape[0] at position p = positions[t]: forward RoPE on dims 64..127 of
// each head at table row p (fp32, then bf16); per head h e_h = ceil_log2(max(amax, 1e-4) *
// fp32(1/448)) and q8[t, h, :] = e4m3(q_h * 2^-e_h); w[t, h] = (float(w_raw[t, h]) * 2^e_h) * 2^-6.
// Rows t >= T of q8 and w are not written.
struct IndexQPrepArgs {
  TensorView q;             // bf16 [T, 32, 128], contiguous: wq_b_idx(qr), before RoPE
  TensorView w_raw;         // bf16 [T, 32], contiguous: weights_proj(x)
  TensorView positions;     // i64 [>= T], contiguous
  TensorView rope_table;    // f32 [table_rows, 64], contiguous: the layer's table
  TensorView q8;            // u8 [rows >= T, 32, 128] output, contiguous (e4m3 codes)
  TensorView w;             // f32 [rows >= T, 32] output, contiguous (folded weights)
};
void indexer_prepare_q(const IndexQPrepArgs& args, const ExecContext& ctx = {});

// ---------------------------------------------------------------- scores and top-k (SPEC 8.3-8.5, 8.7)

enum class IndexerRole : uint8_t {
  kPlain = 0,              // layers 2, 8, 14 (and 20's own top-k without candidates)
  kCandidateSource = 1,    // layer 20: top-k and the candidate blocks
  kCandidateConsumer = 2,  // layers 24, 28, 32, 36: scores masked to the source's candidate blocks
};
const char* indexer_role_name(IndexerRole r);  // "plain", "candidate_source", "candidate_consumer"

// For every token t < T = positions.shape[0]: n_c = (p + 1) / ratio entries of the kv source's
// index-K cache are visible; entry i of request b = token_to_req[t] is state i % S of page
// block_table[b][i / S].
//   I(t, i) = sum_h w[t, h] * max(0, D(t, h, i)) * sk[i],  D = sum_d e4m3(q8[t, h, d]) * e4m3(k8[i, d])
// in binary64, heads ascending, rounded once to fp32 (D is exact in binary64 in any order); -inf
// for i >= n_c and, for a consumer, unless i / 8 is in candidates[t].
// topk[t] = the K = min(512, #finite scores) entries ranked by (score desc, index asc), sorted
// ascending, then -1; a token with token_valid[t] == 0 gets a row of -1. Every row t < T is
// written whole; rows >= T are not touched.
// Candidate source: candidates[t] = the top min(2048, ceil(n_c / 8)) blocks by (block score desc,
// block asc), the block score being the max of its visible entries' scores and +inf for the newest
// block (n_c - 1) / 8; sorted ascending, then -1 (all -1 for an invalid token). Its own top-k uses
// the unmasked scores. Candidate consumer: candidates[t] is read: for a valid token a strictly
// ascending prefix of blocks below ceil(n_c / 8), then -1.
struct IndexerTopkArgs {
  int ratio = 1;                       // 1 or 2: the kv source's compress ratio
  IndexerRole role = IndexerRole::kPlain;
  TensorView q8;                       // u8 [rows >= T, 32, 128], contiguous (indexer_prepare_q)
  TensorView w;                        // f32 [rows >= T, 32], contiguous
  TensorView positions;                // i64 [T], contiguous
  TensorView token_to_req;             // i32 [T], contiguous: request of each token (read when valid)
  TensorView token_valid;              // i32 [T], contiguous: 0 for a padding/invalid token; absent: all valid
  TensorView block_table;              // i32 [num_reqs, max_pages]: pages of each request's index-K cache
  IndexKCacheView k_cache;             // FP8_132: the kv source's index-K cache
  TensorView topk;                     // i32 [rows >= T, 512] output (row stride >= 512)
  TensorView candidates;               // i32 [rows >= T, 2048]: written by a source, read by a consumer, absent for plain
  TensorView scores;                   // optional f32 [rows >= T, cols >= max n_c of the valid tokens] output:
                                       // I(t, i) for i < cols (-inf where not visible or masked; all -inf
                                       // for an invalid token)
  TensorView workspace;                // CUDA: u8 [>= indexer_topk_workspace_bytes(T, block_table.shape[1],
                                       // k_cache.states_per_page, role)], 16-byte aligned, caller-owned
                                       // (its contents need no initialisation); not read on the CPU
  int group_tokens = 0;                // CUDA tuning, 0..8: consecutive tokens of one request scored
                                       // against one read of its keys (best: the decode tokens per
                                       // request); 0: the library's choice (2). Results do not depend on it
  int score_blocks_per_sm = 0;         // CUDA tuning: 0 (the library's choice, 2), 1 or 2: the scoring
                                       // kernel's registers capped for that many resident blocks per SM
                                       // (the chunk kernel)
  int score_kernel = 0;                // CUDA tuning: the scoring kernel of a plain or source layer:
                                       // 0 (the library's choice: warpgroup where it applies), 1 chunk
                                       // (every case), 2 warpgroup (sm_90a; key rows 16-byte aligned,
                                       // S % 4 == 0, group_tokens <= 2). Results agree within SPEC 8.8
};
void indexer_topk(const IndexerTopkArgs& args, const ExecContext& ctx = {});

// Bytes of indexer_topk's CUDA workspace for T tokens whose block table has max_pages pages per
// request of states_per_page states (so n_c <= max_pages * states_per_page): per token, the
// (score, index) candidates of every 4096-entry chunk and, for a candidate source, the block
// scores. E8 for a negative count or a role outside the enum.
int64_t indexer_topk_workspace_bytes(int64_t T, int64_t max_pages, int64_t states_per_page, IndexerRole role);

// ---------------------------------------------------------------- short-context shortcut (SPEC 8.6)

// The host decision of a step: true when max_seq_len_in_batch / ratio <= 512 (integer division:
// the largest n_c of the step fits a top-k row), never while a CUDA graph is captured. Every index
// source of that ratio takes the same branch. E8 for a ratio outside {1, 2} or a negative length.
bool indexer_takes_shortcut(int64_t max_seq_len_in_batch, int ratio, bool capturing_cuda_graph = false);

// The shortcut's top-k: topk[t][j] = j for j < n_c(positions[t]), -1 after; an invalid token's row
// all -1. Scoring and the candidate buffer are skipped (the K store still runs). The output equals
// indexer_topk's whenever every visible score is finite. E8 for a valid token with n_c > 512 (the
// step should not have taken the shortcut).
struct IndexerShortcutArgs {
  int ratio = 1;
  TensorView positions;    // i64 [T], contiguous
  TensorView token_valid;  // i32 [T] or absent (all valid)
  TensorView topk;         // i32 [rows >= T, 512] output
};
void indexer_shortcut_topk(const IndexerShortcutArgs& args, const ExecContext& ctx = {});

}  // namespace dsv41kv
