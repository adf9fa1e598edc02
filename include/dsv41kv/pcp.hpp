// dsv41kv: prefill context parallelism (SPEC section 7).
//
//  - plan_pcp_step: DualChunkSwap chunking of one global step into P rank-local batches and the
//    gathered [P x padded] layout (SPEC 7.2, 7.3, 7.9);
//  - the link (SPEC 7.4): local keys -> all-gather -> ring write slots, predecessor lookups and
//    gather tokens, as pure host functions (link_local_keys / link_resolve) and the two joined
//    over a Communicator (link_pcp_chunks);
//  - pcp_layer_step: one kv-source layer on one rank (SPEC 7.5, 7.6): link, gathered last rows,
//    the open-row compressor, save_ring_rows, gathered latents and the inserts over the
//    gathered rows into this rank's replicated caches;
//  - communication accounting (SPEC 7.7).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsv41kv/comm.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/records.hpp"

#if defined(DSV41KV_TEST_SEAMS)
namespace dsv41kv::seam {
// Faults the PCP oracles inject to show that their checks can fail (SPEC 10.6's mutation check):
// each must make the SPEC 7.8 check fail. A test seam: only builds with DSV41KV_TEST_SEAMS have
// it (testing.hpp).
enum class PcpFault : uint8_t {
  kNone = 0,
  kDropGatheredPredecessors = 1,  // every prev_row_indices forced to -1 (ring reads instead)
  kReverseTieBreak = 2,           // link ties by descending gathered index
  kSkipSaveRingRows = 3,          // save_ring_rows not called
  // The read path of the simulation (pcp_sim.hpp, SimConfig::read_path): the layer step itself
  // ignores these.
  kLocalSwaInsert = 4,            // each rank inserts only its own kv rows into its SWA cache
  kPerturbAttention = 5,          // the last rank's last token's attention output off by one bf16 ulp
};
}  // namespace dsv41kv::seam
#endif

namespace dsv41kv::pcp {

// ---------------------------------------------------------------- planner (SPEC 7.2, 7.3)

enum class DecodePlacement : uint8_t {
  kReplicated = 0,  // every rank holds every decode; only rank 0's copy writes KV (default)
  kOwner = 1,       // test mode: decode g lives on rank (g + step) mod P only (SPEC 7.9)
};
const char* placement_name(DecodePlacement p);
DecodePlacement parse_placement(const std::string& name);  // "replicated" | "owner", E8

// One request of the global step, in global order (decodes, i.e. !is_prefilling, first).
struct GlobalRequest {
  int64_t query_len = 0;     // >= 0
  int64_t num_computed = 0;  // >= 0
  bool is_prefilling = false;
};

struct PlanOptions {
  int P = 1;                              // 1..1024
  int64_t step = 0;                       // step counter (owner placement)
  DecodePlacement placement = DecodePlacement::kReplicated;
  int64_t graph_padding = 0;              // 0: padded = max_k n_k; else padded = this (E9 if
                                          //   below the largest rank's token count)
  int64_t graph_pad_multiple = 0;         // > 0 (and graph_padding 0): padded = max_k n_k
                                          //   rounded up to a multiple of this (at least one)
  int64_t num_speculative_tokens = 0;     // E6 when > 0 and P > 1
};

// A local request of one rank: a chunk of one global request.
struct LocalSegment {
  int32_t global_req = -1;   // -1: the placeholder empty request of a rank with no segment
  int64_t chunk_offset = 0;  // query offset of the chunk within the global request
  int64_t len = 0;
  bool writes_kv = false;    // this copy's rows write KV (prefill chunks, the writing decode copy)
};

struct RankBatch {
  std::vector<LocalSegment> segments;  // local requests, >= 1
  std::vector<int32_t> qsl;            // [num_reqs + 1]
  std::vector<int64_t> positions;      // [padded]; padding rows 0
  std::vector<int32_t> local_to_global_req;  // [num_reqs]; -1 for the placeholder
  int64_t num_tokens = 0;              // n_k
  int64_t num_reqs() const { return static_cast<int64_t>(segments.size()); }
};

struct StepPlan {
  int P = 1;
  int64_t padded = 0;
  int64_t largest_rank_tokens = 0;        // max_k n_k
  int64_t num_global_tokens = 0;          // sum of query_len
  std::vector<int32_t> global_qsl;        // [num_global_reqs + 1] of the unsplit batch
  std::vector<RankBatch> ranks;           // [P]
  // Gathered layout [P * padded], rank-major.
  std::vector<int64_t> gathered_source;   // global token index (0 for PAD rows, as vLLM)
  std::vector<uint8_t> gathered_kv_write; // KV write mask: false for PAD and masked replicas
  std::vector<int32_t> gathered_req;      // global request (0 for PAD rows)
  std::vector<int64_t> gathered_positions;
  std::vector<int64_t> restore_index;     // [num_global_tokens]: gathered row whose output is
                                          //   the token's (the KV-writing copy)
  std::vector<int64_t> tokens_per_rank() const;
};

// Builds every rank's local batch. E6 (PCP + speculative tokens), E9 (graph padding below the
// largest rank), E8 (negative lengths, a decode after a prefill, P out of range).
StepPlan plan_pcp_step(std::span<const GlobalRequest> requests, const PlanOptions& opt);

// ---------------------------------------------------------------- link (SPEC 7.4)

// num_rows = min(N, 2 * max_num_seqs), identical on every rank.
int64_t link_num_rows(int64_t N, int64_t max_num_seqs);
// key(slot, pos) = (slot < 0 || pos < 0) ? -1 : ((slot / cap) << 32) | pos.
int64_t link_key(int64_t slot, int64_t pos, int64_t cap);

// One rank's inputs: ring slots of the local batch (SPEC 6.3, N = padded), local qsl and
// positions.
struct LinkInput {
  std::span<const int64_t> ring_slots;  // [N]
  std::span<const int32_t> qsl;         // [num_reqs + 1]
  std::span<const int64_t> positions;   // [>= N]
  int64_t cap = 8;
  int64_t max_num_seqs = 0;
};

struct LinkLocal {
  int64_t num_rows = 0;
  int64_t R = 0;                        // min(num_reqs, num_rows)
  std::vector<int64_t> local_keys;      // [num_rows]
  std::vector<int64_t> gather_tokens;   // [num_rows]: last local token of request j, 0 beyond R
};
// First half: validates the batch (E8) and E10, builds keys and gather tokens.
LinkLocal link_local_keys(const LinkInput& in);

struct LinkResult {
  int64_t num_rows = 0;
  int64_t R = 0;
  std::vector<int64_t> sorted_keys;        // [P * num_rows]
  std::vector<int64_t> order;              // [P * num_rows] gathered index of sorted_keys[i]
  std::vector<int64_t> ring_write_slots;   // [P * num_rows]
  std::vector<int64_t> prev_row_indices;   // [R]
  std::vector<int64_t> gather_tokens;      // [num_rows]
};
// Second half, from the already-gathered keys of all P ranks ([P * num_rows], rank-major). Ties
// of equal keys are broken by gathered index (DECISION 13).
LinkResult link_resolve(const LinkInput& in, const LinkLocal& local,
                        std::span<const int64_t> all_keys, int P);
// Both halves with the all-gather of the keys over `comm` (one collective).
LinkResult link_pcp_chunks(const LinkInput& in, Communicator& comm);

// ---------------------------------------------------------------- communication (SPEC 7.7)

// Bytes one rank contributes (sent) and receives (the gathered output, own segment included,
// as SPEC 7.7 counts) in one step, per kind of collective.
struct CommVolume {
  uint64_t keys_sent = 0, keys_received = 0;            // link keys, once per step (ratio 2)
  uint64_t positions_sent = 0, positions_received = 0;  // once per step
  uint64_t rows_sent = 0, rows_received = 0;            // last rows, per ratio-2 layer
  uint64_t latents_sent = 0, latents_received = 0;      // latents, per kv-source layer
  uint64_t swa_kv_sent = 0, swa_kv_received = 0;        // SWA kv rows, per layer (its read path)
  uint64_t replaced_received = 0;  // the replaced design: all-gather of every kv_score row,
                                   //   P * padded * 4096 per ratio-2 layer
  uint64_t sent() const { return keys_sent + positions_sent + rows_sent + latents_sent + swa_kv_sent; }
  uint64_t received() const {
    return keys_received + positions_received + rows_received + latents_received + swa_kv_received;
  }
  CommVolume& operator+=(const CommVolume& o);
};
// The SPEC 7.7 formulas for one step with one kv-source layer of `ratio`; with `swa_kv` also the
// layer's gathered SWA kv rows (P * padded * 1024 bytes received), which only a step that runs
// the read path moves.
CommVolume expected_comm_volume(int P, int64_t padded, int64_t num_rows, int ratio, bool swa_kv = false);

// E8 (naming `op`) for num_speculative_tokens < 0; E6 for PCP (P > 1) with speculative tokens.
void check_pcp_speculation(const char* op, int P, int64_t num_speculative_tokens);

// ---------------------------------------------------------------- one layer on one rank

// Views of this rank's buffers for one kv-source layer. Local tensors have N = padded rows;
// gathered ones P * padded. The gathered compressed slot mapping is built from the global batch
// (identical on every rank, -1 for PAD rows and masked replicas).
struct LayerStepArgs {
  int ratio = 2;
  int64_t cap = 8;                 // ratio 2
  int64_t max_num_seqs = 0;        // ratio 2 (num_rows)
  float eps = 0.0f;
  TensorView kv_score;             // f32 [padded, 512 * ratio]
  TensorView positions;            // i64 [padded] local positions
  TensorView qsl;                  // i32 [num_reqs + 1] local
  TensorView token_to_req;         // i32 [padded] local
  TensorView ring_slots;           // i64 [padded] local ring slots (ratio 2)
  TensorView ring;                 // f32 [blocks, cap, 1024] this rank's ring (ratio 2)
  TensorView norm_weight;          // bf16 [512]
  TensorView gathered_positions;   // i64 [P * padded] (gathered once per step by the caller)
  TensorView gathered_cslots;      // i64 [P * padded]
  TensorView rope_table;           // f32 [rows, 64]
  std::vector<CacheView> caches;   // this rank's replicated compressed caches (any formats)
  TensorView latent;               // bf16 [padded, 512] scratch/output (local latents)
  TensorView gathered_latent;      // bf16 [P * padded, 512] scratch/output
#if defined(DSV41KV_TEST_SEAMS)
  seam::PcpFault fault = seam::PcpFault::kNone;  // test seam (dsv41kv/test_seam.hpp)
#endif
  ExecContext exec;                // CPU threads for compress/insert (0 = hardware concurrency)
};

struct LayerStepResult {
  LinkResult link;                 // ratio 2 (empty for ratio 1)
  CommVolume volume;               // keys, rows and latents of this layer (not positions)
};

// SPEC 7.5 + 7.6 for one layer on rank comm.rank(). Every rank must call it in the same step
// (collectives), even with zero local tokens.
LayerStepResult pcp_layer_step(const LayerStepArgs& a, Communicator& comm);

}  // namespace dsv41kv::pcp
