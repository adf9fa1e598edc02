// The read-path bench's workloads (`dsv41kv bench --device cuda --read`) and the FLOPs and bytes
// of each line, counted as FlashMLA's own harness counts them (tests/lib.py of FlashMLA 9241ae3,
// ../shared/baselines/README.md), so that bench/peers/flashmla_sparse.py, which counts the same
// way on the same workloads, can be joined with it line by line. Host code, every build; the
// builders are deterministic in their seed, and tests/bench checks the counts exactly.
//
// Counts (d_qk = d_v = 512):
//   attention FLOPs   2 * h_q * tokens * keys_per_token * (d_qk + d_v)   (decode: tokens = b * s_q,
//                     keys = 128 window + the compressed keys; prefill: tokens = s_q, keys = 640)
//   decode bytes      unique key records read * record bytes + q (bf16) + o (bf16); FlashMLA counts
//                     576 bytes per 584-byte record (its data bytes), this bench the record's bytes
//                     (its scales included) on both sides of the joined table
//   prefill bytes     FlashMLA's count: valid indices * d_qk * 2 + s_q * h_q * (d_qk + d_v) * 2
//   indexer FLOPs     2 * 32 * 128 per (token, entry scored); bytes: the index-K records read, each
//                     request's union over its tokens (132 bytes a record)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv41kv/records.hpp"

namespace dsv41kv::bench {

inline constexpr int kReadDqk = 512, kReadDv = 512;
inline constexpr int kReadSq = 2;                     // query tokens per request (one MTP draft)
inline constexpr int64_t kDecodeBatches[] = {2, 64, 128, 148, 256};
inline constexpr int64_t kSwaSlotsPerReq = 256;       // a request's SWA cache: 4 pages of 64
inline constexpr int64_t kSwaStatesPerPage = 64;
inline constexpr int64_t kCmpStatesPerPage = 32;      // a c2a layer's compressed pages (block 64 / r 2)
inline constexpr int64_t kCmpEntriesPerReq = 2048;    // a request's compressed entries (64 pages)
inline constexpr int64_t kIndexerBatch = 128;
inline constexpr int64_t kIndexerNc[] = {4096, 65536, 131072, 1048576};
inline constexpr int64_t kIndexStatesPerPage = 64;
inline constexpr int64_t kPrefillTokens[] = {32768, 131072};
inline constexpr int kPrefillHeads = 64;
inline constexpr int64_t kPrefillKv = 65536;          // workspace rows (FlashMLA's largest MODEL1 case)
inline constexpr int kPrefillKeys = 640;              // keys per query (kPrefillIndexWidth)

// The decode shapes: heads and compressed keys per token (the 128-head model's 1024 compressed
// keys are beyond the API's 512-wide top-k rows: the bench runs 128 heads with 128 + 512, and the
// peer harness both 128 + 512 and FlashMLA's 128 + 1024).
struct DecodeShape {
  int heads;
  int cmp_keys;
};
inline constexpr DecodeShape kDecodeShapes[] = {{64, 512}, {128, 512}};

// The record pairs: the compressed cache's format and the SWA cache's (SPEC 6: 584 with 584, 528
// with 528, 288 compressed with a 528 SWA cache as nvfp4_ds_mla pairs them).
struct RecordPair {
  RecordFormat cmp, swa;
};
inline constexpr RecordPair kReadRecordPairs[] = {{RecordFormat::V4_584, RecordFormat::V4_584},
                                                  {RecordFormat::MXFP8_528, RecordFormat::MXFP8_528},
                                                  {RecordFormat::NVFP4_288, RecordFormat::MXFP8_528}};

double attention_flops(int64_t heads, int64_t tokens, int64_t keys_per_token);
int64_t decode_bytes(int64_t unique_swa, int swa_record_bytes, int64_t unique_cmp, int cmp_record_bytes,
                     int64_t heads, int64_t tokens);
int64_t prefill_bytes(int64_t valid_indices, int64_t heads, int64_t tokens);
double indexer_flops(int64_t entries_scored);
int64_t indexer_bytes(int64_t unique_entries);

// A 64-bit mix (splitmix64's finaliser): the builders' random numbers and the page pool choice.
uint64_t mix64(uint64_t x);

// The decode workload of one batch: request b's tokens j < s_q at window end e_j = 128 + j of its
// SWA region (slots through a shuffled table of 4 pages per request), each attending to the 128
// SWA slots e_j - 127 .. e_j and to cmp_keys distinct random entries of the request's 2048
// compressed entries (sorted ascending, as the indexer's top-k rows are), through a shuffled table
// of 64 pages per request. Every length is full.
struct DecodeWorkload {
  int64_t batch = 0, tokens = 0;
  int cmp_keys = 0;
  int64_t swa_pages = 0, cmp_pages = 0;
  std::vector<int32_t> swa_idx, swa_len;  // [tokens, 128], [tokens]
  std::vector<int32_t> cmp_idx, cmp_len;  // [tokens, 512] (entries >= cmp_keys -1), [tokens]
  int64_t unique_swa = 0, unique_cmp = 0; // distinct slots read
};
DecodeWorkload make_decode_workload(int64_t batch, int cmp_keys, uint64_t seed);

// The indexer workload: `batch` requests of s_q tokens at positions 2 n_c - 2 + j (ratio 2: the
// last token sees n_c entries, the first n_c - 1); request b's pages b * P .. b * P + P - 1 of 64
// states. A candidate consumer's rows (`candidates` [tokens, 2048]) hold min(2048, ceil(n / 8))
// distinct random blocks of the token's n visible entries, sorted ascending, then -1.
struct IndexerWorkload {
  int64_t batch = 0, tokens = 0, n_c = 0, pages_per_req = 0;
  bool consumer = false;
  std::vector<int64_t> positions;
  std::vector<int32_t> token_to_req, block_table, candidates;
  int64_t entries_scored = 0;  // sum over tokens of the entries scored (visible, in a candidate block)
  int64_t unique_entries = 0;  // sum over requests of the union of its tokens' scored entries
};
IndexerWorkload make_indexer_workload(int64_t batch, int64_t n_c, bool consumer, uint64_t seed);

// The prefill workload: `tokens` queries each with 640 distinct rows of a workspace of s_kv rows
// (s_kv >= 640): row k of token t is (a_t + k * step_t) mod s_kv, a_t random, step_t random and
// coprime to s_kv (unsorted, full length).
struct PrefillWorkload {
  int64_t tokens = 0, s_kv = 0;
  std::vector<int32_t> indices;  // [tokens, 640]
  int64_t valid_indices() const { return tokens * kPrefillKeys; }
};
PrefillWorkload make_prefill_workload(int64_t tokens, int64_t s_kv, uint64_t seed);

// The rows checked against the CPU backend: `n` requests spread over the batch (first and last
// included; fewer when the batch is smaller), each with its s_q rows.
std::vector<int64_t> sample_requests(int64_t batch, int n);

}  // namespace dsv41kv::bench
