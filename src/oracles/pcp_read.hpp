// The read path of the PCP simulation (pcp_sim.hpp, SimConfig::read_path; SPEC 7.6 steps 2-4):
// the simulation's kv-source layer as a pipeline::AttentionLayer, one per rank and one for the
// single-rank run, each with its own SWA, compressed (the first configured format) and index-K
// caches, its own top-k buffer and prefill workspace (LayerShared) and its own StepMetadata. The
// engine's activations come from oracles::SeededActivations: a token's q, kv and index inputs are
// functions of (seed, request, position) only, so they are the same on whichever rank computes it.
//
// A rank's step: prepare() its local batch (the rank's chunks as requests), write_gathered() the
// step's gathered kv rows into its SWA cache and the gathered latents into its index-K cache (the
// PCP layer step inserts the gathered latents into compressed_cache() with the other caches),
// then AttentionLayer::run_queries over its own rows. The single-rank run: prepare() the unsplit
// batch and AttentionLayer::run.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dsv41kv/attention_layer.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/pipeline.hpp"
#include "dsv41kv/read_path_check.hpp"
#include "dsv41kv/rope.hpp"

namespace dsv41kv::pcp::read_path {

// The model layer the simulation's layer is (a one-layer topology: a kv + index source).
inline constexpr int kLayer = 0;
// Tokens per SWA page (SPEC 3.4's default).
inline constexpr int64_t kSwaPageTokens = 32;
// The SWA pages of a workload request: every position 0 .. start + prompt_len + decode_steps - 1.
inline int64_t swa_pages_of(const Workload::Request& r) {
  return (r.start + r.prompt_len + r.decode_steps - 1) / kSwaPageTokens + 1;
}

// The host bytes one Layer of `max_tokens` rows holds (for the simulation's estimate before it
// allocates): its SWA (swa_pages pages), compressed (`format`, num_pages pages of S states) and
// index-K caches, its per-row buffers (inputs, rotated queries, attention and output rows of
// H_pad heads, index rows, top-k and candidate rows, index lists), its ring (none: the ring is
// counted by the simulation) and the prefill workspace.
double layer_bytes(int ratio, RecordFormat format, int num_heads, int64_t swa_pages, int64_t num_pages, int64_t S,
                   int64_t max_model_len, int64_t max_tokens);

// What every layer of one simulation shares.
struct Setup {
  ModelConfig model;                // one layer of the simulation's ratio
  pipeline::ServingConfig serving;  // the pools' geometry; max_tokens / max_requests are per layer
  pipeline::ReadPathConfig read;
  pipeline::LayerWeights weights;   // compressor norm = the simulation's (the PCP step uses it too)
  RopeTable table;                  // the simulation's table, used by every insert and RoPE
  uint64_t seed = 0;                // the activations'
  // Per workload request: its ring block and block-table rows (query_len / num_computed unset).
  std::vector<pipeline::StepRequest> requests;
};

// The setup of a simulation's layer: cfg's ratio, first format (the compressed cache the
// attention reads; the SWA cache in the same record, 584 for NVFP4, SPEC 3.4), heads, eps and
// shortcut choice; the workload's requests with their ring blocks, compressed block-table rows
// `cpages` and SWA pages (assigned here: shuffled distinct pages covering every position, none
// for a null-block request); the pools (num_pages compressed pages of S states, ring_blocks
// ring blocks); the simulation's RoPE table, compressor norm and plain-fp8 scale. E8 (naming
// ReadPathConfig's field) for a head count the attention does not take.
Setup make_setup(const SimConfig& cfg, const Workload& w, int64_t S, int64_t num_pages,
                 const std::vector<std::vector<int32_t>>& cpages, int64_t ring_blocks, const RopeTable& table,
                 const std::vector<uint16_t>& norm, float fp8_scale);

// One request of a layer's batch: `query_len` rows of workload request `id` from position
// `num_computed` on; id < 0 is an empty placeholder (a rank without a segment, SPEC 7.2).
struct BatchRequest {
  int32_t id = -1;
  int64_t num_computed = 0, query_len = 0;
};

class Layer {
 public:
  Layer(const Setup& s, int64_t max_tokens, int64_t max_requests);
  ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // Builds the step's metadata over `reqs` and `padding_rows` padding rows and fills the
  // activations of its real rows (padding rows zero).
  void prepare(std::span<const BatchRequest> reqs, int64_t padding_rows);
  const pipeline::StepMetadata& meta() const { return meta_; }
  // The prepared batch's real rows.
  std::span<const pipeline::TokenId> tokens() const { return tokens_; }
  // The prepared rows' q, kv, index_q and w_raw ([max_tokens] rows; kv_score absent).
  const pipeline::LayerInputs& inputs() const { return in_; }
  pipeline::AttentionLayer& layer() { return *layer_; }
  const pipeline::AttentionLayer& layer() const { return *layer_; }
  const pipeline::LayerShared& shared() const { return *shared_; }

  // SPEC 7.6 steps 2-3 on a rank: the gathered kv rows [G, 512] into the SWA cache at the gathered
  // SWA slots (the SWA record is insert()'s for ratio 1, cache.hpp), the gathered latents [G, 512]
  // into the index-K cache at the gathered compressed slots; positions are the gathered ones.
  void write_gathered(const TensorView& kv, const TensorView& latent, const TensorView& positions,
                      const TensorView& swa_slots, const TensorView& cslots, const ExecContext& ctx);

  // Every byte of the read path's caches.
  std::span<const uint8_t> swa_bytes() const;
  std::span<const uint8_t> compressed_bytes() const;
  std::span<const uint8_t> index_k_bytes() const;
  // The three caches' bytes copied from `other` (a layer of the same Setup).
  void copy_caches_from(const Layer& other);

 private:
  const Setup& setup_;
  int64_t max_tokens_ = 0;
  std::unique_ptr<pipeline::LayerShared> shared_;
  std::unique_ptr<pipeline::AttentionLayer> layer_;
  pipeline::StepMetadata meta_;
  oracles::SeededActivations activations_;
  Buffer q_, kv_, index_q_, w_raw_;
  pipeline::LayerInputs in_;
  std::vector<pipeline::TokenId> tokens_;
};

}  // namespace dsv41kv::pcp::read_path
