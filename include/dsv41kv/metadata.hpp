// dsv41kv: per-step metadata builders (SPEC section 6): ring capacity, token-to-request indices,
// ring slot mapping, token slot mappings and the ratio-2 compressed slot mapping with its PAD
// rule. CPU builders take host views; the CUDA builders (same functions, device views) run on
// ctx.stream with launch geometry fixed by the padded count N.
// The read path's metadata (SPEC 6.2, 6.6, 6.7): the decode/prefill split, the SWA window rows
// and top-k key lists of the decode tokens, the token validity mask, the prefill gather lengths,
// the sparse-MLA metadata of a layer type, and the backend check select_backend. What a decode
// step builds per layer (the window rows, the top-k slots, the validity mask, the masked lengths)
// has CUDA builders too; the split itself is a host decision (the engine's batch is host data
// and the launches of the attention depend on it), so the device builders take the split the
// host made and never read qsl's values on the host. The prefill gather lengths and the
// sparse-MLA metadata stay host builders: the prefill chunk plan reads them on the host.
//
// Every builder validates all of its arguments before it writes anything and throws
// dsv41kv::Error naming the argument, the value found and what was expected: E2 for a
// compressed-cache ratio outside {1, 2}, E8 otherwise. Structural checks (presence, dtypes,
// shapes, strides, one device per call) apply to every view; value checks (qsl, request
// indices, positions, block ids) need to read the data and run only for host views (reading
// device memory would synchronise; the CUDA builders bound every index they dereference and
// emit -1 instead). All views of one call must be on one device; a CUDA view in a build without
// CUDA is an E8 ("built without CUDA").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "dsv41kv/common.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv {

// cap = max(8, next_pow2(num_speculative_tokens + 2)) (SPEC 3.2). Throws E8 when negative.
int64_t ring_capacity(int64_t num_speculative_tokens);

// Checks qsl (i32 [num_reqs+1], contiguous): qsl[0] == 0, non-decreasing,
// qsl[num_reqs] == num_actual_tokens <= N. Host views only (E8 otherwise). `arg` prefixes
// the messages (e.g. "build_token_to_req: qsl").
void validate_qsl(const TensorView& qsl, int64_t num_actual_tokens, int64_t N, const char* arg);

// SPEC 6.2 decode/prefill split: the number of leading requests with
// query_lens[j] <= 1 + num_speculative_tokens (the decode part); every later request is a
// prefill, even a short one. E8 for num_reqs < 0, num_speculative_tokens < 0, or a null
// pointer with num_reqs > 0.
int64_t num_decode_requests(const int32_t* query_lens, int64_t num_reqs,
                            int64_t num_speculative_tokens);

// token_to_req[t] = request of token t for t < qsl[num_reqs]; 0 for padding rows t < N.
// Host views: qsl is validated (validate_qsl) against num_actual_tokens and N.
struct TokenToReqArgs {
  TensorView qsl;           // i32 [num_reqs + 1], contiguous
  TensorView token_to_req;  // i32 [N] output, contiguous
  // -1: num_actual_tokens = qsl[num_reqs] (the CUDA builder reads it on the device);
  // >= 0: must equal qsl[num_reqs] (E8, host views) and be <= N (all views).
  int64_t num_actual_tokens = -1;
};
void build_token_to_req(const TokenToReqArgs& args, const ExecContext& ctx = {});

// SPEC 6.3: ring_slot[i] = -1 for i >= num_actual_tokens or ring block <= 0 (null block),
// else b*cap + positions[i] % cap with b = ring_block_table[token_to_req[i]][0].
struct RingSlotArgs {
  TensorView token_to_req;      // i32 [N]
  TensorView positions;         // i64 [>= N]
  TensorView ring_block_table;  // i32 [num_reqs, >= 1] (row stride may exceed 1)
  int64_t num_actual_tokens = 0;
  int64_t cap = 8;              // > 0 (ring_capacity() of the config)
  TensorView ring_slots;        // i64 [N] output
  // >= 0: number of ring blocks of the ring tensor; a ring block id >= it used by a real
  // token is an E8 (host views; the CUDA builder emits -1). -1: not checked.
  int64_t num_ring_blocks = -1;
};
void build_ring_slots(const RingSlotArgs& args, const ExecContext& ctx = {});

// SPEC 6.4: token slot mapping with page size `page` (SWA: 32 tokens; compressed ratio 1:
// S_1 states = tokens): slot[t] = bt[b][p / page] * page + p % page, or -1 when the physical
// page id is <= 0 (null page; the table is never modified) or for padding rows
// t >= num_actual_tokens. A logical page beyond the block-table row is an error (E8) naming the
// token, its request and position (CPU; the CUDA builder writes -1 and cannot report).
struct TokenSlotArgs {
  TensorView token_to_req;  // i32 [N]
  TensorView positions;     // i64 [>= N]
  TensorView block_table;   // i32 [num_reqs, max_pages]
  int64_t num_actual_tokens = 0;
  int64_t page = 32;
  TensorView slots;         // i64 [N] output
  // >= 0: number of physical pages of the cache; a page id >= it used by a real token is an
  // E8 (host views; the CUDA builder emits -1). -1: not checked.
  int64_t num_pages = -1;
};
void build_token_slots(const TokenSlotArgs& args, const ExecContext& ctx = {});

// SPEC 6.5: compressed slot mapping of ratio r (1 or 2; E2 otherwise) with the PAD rule:
// cslot[t] = (p+1) % r == 0 && tslot[t] != -1 && page > 0 ? page * S_r + s % S_r : -1 with
// s = p / r, page = bt[b][s / S_r]. Rows t >= num_actual_tokens are -1. Logical pages beyond
// the row: as for build_token_slots, checked only for tokens that would get a slot (closing,
// token slot != -1): a non-closing token never reads the table. `token_slots` is the
// token's ordinary slot (a masked replica under PCP has -1); absent means "all valid".
struct CompressedSlotArgs {
  int ratio = 2;
  TensorView token_to_req;  // i32 [N]
  TensorView positions;     // i64 [>= N]
  TensorView block_table;   // i32 [num_reqs, max_pages]
  TensorView token_slots;   // i64 [N] or absent
  int64_t num_actual_tokens = 0;
  int64_t states_per_page = 32;  // S_r
  TensorView slots;         // i64 [N] output
  int64_t num_pages = -1;   // as TokenSlotArgs::num_pages (checked for tokens that get a slot)
};
void build_compressed_slots(const CompressedSlotArgs& args, const ExecContext& ctx = {});

// ================================================================ the read path (SPEC 6.2, 6.6, 6.7)
//
// The SWA slot mapping of SPEC 6.4 is build_token_slots with page = 32 over the layer's SWA block
// table; is_valid_token[t] = slot_swa[t] >= 0 (SPEC 6.1).

// SPEC 6.2, the one split every read-path builder uses: the decode part is the longest prefix of
// requests with query_len <= 1 + num_speculative_tokens (num_decode_requests); since decodes come
// first, the decode tokens are rows [0, num_decode_tokens) and each is one query row.
struct DecodeSplit {
  int64_t num_reqs = 0;
  int64_t num_decodes = 0;         // requests [0, num_decodes)
  int64_t num_decode_tokens = 0;   // qsl[num_decodes]
  int64_t num_prefills = 0;        // requests [num_decodes, num_reqs)
  int64_t num_prefill_tokens = 0;  // qsl[num_reqs] - num_decode_tokens
};
// From a host qsl (i32 [num_reqs + 1], contiguous; qsl[0] == 0, non-decreasing) and
// num_speculative_tokens >= 0; E8 otherwise, the message prefixed by `op`.
DecodeSplit split_decode_prefill(const TensorView& qsl, int64_t num_speculative_tokens,
                                 const char* op = "split_decode_prefill");

// SPEC 6.6, first bullet: the SWA window rows of the decode tokens. Decode token t of request b at
// position p = positions[t]:
//   valid (slot_swa[t] >= 0): start = max(p - 127, 0), lengths[t] = p - start + 1,
//     indices[t][k] = bt[b][(start + k) / page] * page + (start + k) % page for k < lengths[t]
//     (-1 where that physical page is <= 0, the null page: SPEC 6.4 DECISION), -1 for k >= lengths[t];
//   invalid: lengths[t] = 0, the row all -1.
// lengths[t] = 0 for every row t >= num_decode_tokens (prefill tokens, padding rows, rows beyond
// the batch); the index rows t >= num_decode_tokens are not written (a row of length 0 is never
// read). A logical page beyond the block-table row, a page id >= num_pages (when >= 0) or a slot
// beyond int32 is an E8 naming the token. Returns the split.
struct SwaWindowArgs {
  TensorView qsl;                      // i32 [num_reqs + 1]
  int64_t num_speculative_tokens = 0;  // the decode threshold (SPEC 6.2)
  TensorView positions;                // i64 [>= num_decode_tokens]
  TensorView slot_swa;                 // i64 [>= num_decode_tokens]: the layer's SWA slots
  TensorView block_table;              // i32 [>= num_decodes, max_pages]: the SWA block table
  int64_t page = 32;                   // SWA tokens per page (SPEC 3.4)
  int64_t num_pages = -1;              // >= 0: pages of the SWA cache (page ids checked); -1: unchecked
  TensorView indices;                  // i32 [max_tokens >= num_decode_tokens, 128] output
  TensorView lengths;                  // i32 [max_tokens] output
  // The split of qsl that the host made from its own copy (split_decode_prefill). Required for
  // device views (E8 when null): the builder cannot read qsl, it finds each decode token's request
  // on the device and writes every row of [0, max_tokens); a value the kernel cannot use (a
  // negative position, a page beyond the row or >= num_pages, a slot beyond int32) gives -1 in
  // place and an invalid token's row. Host views: when given, it must equal the split of qsl (E8).
  const DecodeSplit* split = nullptr;
};
DecodeSplit build_swa_window(const SwaWindowArgs& args, const ExecContext& ctx = {});

// SPEC 6.6, second bullet: per prefill request b (the i-th prefill, b = num_decodes + i),
// prefix_len = seq_lens[b] - query_len, gather_lens[i] = G_b = query_len + min(prefix_len, 127),
// gather_starts[i] = seq_lens[b] - G_b: the positions [gather_start_b, seq_len_b) its prefill
// gathers from the SWA cache (SPEC 9.5). Entries i >= num_prefills are zeroed. seq_lens[b] <
// query_len or < 0 is an E8. Returns the split.
struct PrefillGatherArgs {
  TensorView qsl;                      // i32 [num_reqs + 1]
  int64_t num_speculative_tokens = 0;
  TensorView seq_lens;                 // i64 [>= num_reqs]: num_computed + query_len (SPEC 6.1)
  TensorView gather_lens;              // i64 [>= num_prefills] output
  TensorView gather_starts;            // i64 [same length] output
};
DecodeSplit build_prefill_gather(const PrefillGatherArgs& args, const ExecContext& ctx = {});

// SPEC 6.6, third bullet: the decode tokens' top-k lists as global slots of the layer's kv-source
// compressed cache (S = states_per_page = S_r). Decode token t of request b, k < K = topk.shape[1]:
//   valid (slot_swa[t] >= 0): i = topk[t][k], indices[t][k] = i >= 0 ? bt[b][i / S] * S + i % S : -1
//     (-1 where that page is <= 0), lengths[t] = the number of entries indices[t][k] >= 0;
//   invalid: the row all -1, lengths[t] = 0.
// lengths[t] = 0 for t >= num_decode_tokens; those index rows are not written. The -1 entries stay
// in place (no compaction). Errors as for build_swa_window (an entry's logical page i / S beyond
// the row names the token and the entry). Returns the split.
struct DecodeTopkSlotArgs {
  TensorView qsl;                      // i32 [num_reqs + 1]
  int64_t num_speculative_tokens = 0;
  TensorView slot_swa;                 // i64 [>= num_decode_tokens]: validity of the tokens
  TensorView topk;                     // i32 [>= num_decode_tokens, K]: compressed-entry indices (SPEC 8.5)
  TensorView block_table;              // i32 [>= num_decodes, max_pages]: the kv source's compressed pages
  int64_t states_per_page = 64;        // S_r of the kv source's compressed cache
  int64_t num_pages = -1;              // as SwaWindowArgs::num_pages
  TensorView indices;                  // i32 [max_tokens >= num_decode_tokens, K] output
  TensorView lengths;                  // i32 [max_tokens] output
  const DecodeSplit* split = nullptr;  // as SwaWindowArgs::split (an unusable entry gives -1)
};
DecodeSplit build_decode_topk_slots(const DecodeTopkSlotArgs& args, const ExecContext& ctx = {});

// SPEC 6.1: token_valid[t] = slot_swa[t] >= 0 ? 1 : 0 for t < N (i64 [N] in, i32 [N] out, one
// device). E8 for other dtypes, lengths or devices.
void build_token_valid(const TensorView& slot_swa, const TensorView& token_valid, const ExecContext& ctx = {});

// SPEC 6.1 / 9.3, an invalid token has no key: lengths[t] = 0 where token_valid[t] == 0, for
// t < lengths.shape[0] <= token_valid.shape[0] (i32 views, one device); other entries untouched.
void mask_invalid_lengths(const TensorView& token_valid, const TensorView& lengths, const ExecContext& ctx = {});

// The device a backend is selected for: the CPU (optionally emulating the SM100 record profile,
// SPEC 6.7) or a CUDA device by compute capability.
struct ComputeDevice {
  Device kind = Device::CPU;
  int major = 0, minor = 0;    // CUDA: compute capability
  bool sm100_profile = false;  // CPU: the SM100 profile (528-byte records, 128-token kernel pages)
  static ComputeDevice cpu(bool sm100_profile = false);
  static ComputeDevice cuda(int major, int minor);
  bool sm90_profile() const;   // the CPU's default profile or CUDA major 9
  std::string describe() const;  // "cpu", "cpu (SM100 profile)", "cuda sm_90"
};
// Tokens per kernel page of the compressed caches (SPEC 3.6, 6.7): 64 on the SM90 profile (SM90
// family, the CPU), 128 otherwise.
int64_t kernel_block_size(const ComputeDevice& device);

// The sparse-MLA metadata of one step for one layer type (SPEC 6.7: built once per step per layer
// type present, swaonly, c1a and c2a, which differ in compressed page size):
// req_id_per_token = token_to_req (SPEC 6.1: the request of each real token, 0 for padding rows),
// for c1a / c2a the compressed slot mapping of ratio r over the type's block table
// (build_compressed_slots with S_r states per page, the PAD rule with token_slots), the split of
// SPEC 6.2, topk_tokens and the kernel block size of the device.
struct SparseMlaMetadataArgs {
  LayerType type = LayerType::kC1A;
  ComputeDevice device;                // sets kernel_block_size
  int64_t states_per_page = 0;         // S_r (c1a, c2a); 0: kernel_block_size / r
  int64_t num_speculative_tokens = 0;
  TensorView qsl;                      // i32 [num_reqs + 1]
  TensorView positions;                // i64 [>= N]
  TensorView block_table;              // c1a / c2a: i32 [num_reqs, max_pages] compressed pages; swaonly: absent
  TensorView token_slots;              // c1a / c2a: i64 [N] or absent (SPEC 6.5 PAD rule); swaonly: absent
  int64_t num_pages = -1;              // as CompressedSlotArgs::num_pages
  TensorView req_id_per_token;         // i32 [N] output
  TensorView compressed_slots;         // c1a / c2a: i64 [N] output; swaonly: absent
};
struct SparseMlaMetadata {
  LayerType type = LayerType::kSwaOnly;
  int ratio = 0;
  DecodeSplit split;
  int64_t num_actual_tokens = 0;       // qsl[num_reqs]
  int64_t num_tokens = 0;              // N, padding rows included
  int64_t topk_tokens = 0;             // 512 for c1a / c2a (SPEC 9.4), 0 for swaonly
  int64_t kernel_block_size = 0;       // 64 / 128 tokens
  int64_t states_per_page = 0;         // S_r (0 for swaonly)
  TensorView req_id_per_token;         // the outputs
  TensorView compressed_slots;
};
SparseMlaMetadata build_sparse_mla_metadata(const SparseMlaMetadataArgs& args, const ExecContext& ctx = {});

// SPEC 6.7: the attention backends of vLLM's sparse_mla.py.
enum class AttentionBackend : uint8_t {
  kSparse = 0,  // FLASHMLA_SPARSE_DSV41: implemented by dsv41kv on SM90 and the CPU
  kMega = 1,    // FLASHMLA_MEGA_ATTN_DSV41: SM100 only, not implemented (its formats exist at kernel level)
};
const char* attention_backend_name(AttentionBackend b);  // "FLASHMLA_SPARSE_DSV41", ...

struct BackendOptions {
  AttentionBackend backend = AttentionBackend::kSparse;
  DType model_dtype = DType::BF16;     // the dtype the model runs in
};
struct BackendSelection {
  AttentionBackend backend = AttentionBackend::kSparse;
  std::string kv_cache_dtype;          // resolved: "fp8_ds_mla" ("auto" and "fp8" resolve to it)
  RecordFormat swa_format = RecordFormat::V4_584;         // SPEC 3.4: the platform's record
  RecordFormat compressed_format = RecordFormat::V4_584;  // SPEC 3.3
  int64_t kernel_block_size = 0;       // tokens per compressed kernel page
  int64_t topk_tokens = 0;             // 512
};
// Checks every row of SPEC 6.7's capability table for `options.backend` on `device`: model dtype,
// head size (head_dim 512 = 448 + 64 RoPE), MLA (one KV head), sparse (index_topk 512 and the
// 128-token window), kv-cache dtype, kernel block size (block_size 0: the device's), compute
// capability and what dsv41kv implements. When any check fails it throws ONE dsv41kv::Error
// listing every failing check with its code (E4: head size, dtype, kv-cache dtype, block size,
// MLA / sparse geometry; E5: compute capability, or no dsv41kv implementation for the device); the
// error's code is the smallest one listed. The mega-attention backend always fails (SM100 only,
// not implemented). On success: auto / fp8 / fp8_ds_mla -> 584-byte records on the SM90 profile,
// 528 on the SM100 profile (the CPU's emulation).
BackendSelection select_backend(const ModelConfig& config, const ComputeDevice& device,
                                std::string_view kv_cache_dtype = "auto", int64_t block_size = 0,
                                const BackendOptions& options = {});

}  // namespace dsv41kv
