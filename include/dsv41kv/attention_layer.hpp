// dsv41kv: a whole DeepSeek-V4.1 attention layer's cache work for one engine step (SPEC 9.8), as
// one call, in the SPEC's order:
//   (query RoPE + SWA insert) || compressor  ->  (compressed insert) || (index-K store, Q prep)
//   -> indexer scores / top-k (or the consumer's reuse of its index source's top-k)
//   -> sparse MLA attention with sink (decode rows, then the prefill chunks) -> output inverse RoPE.
// The layer takes the step's projected activations (the engine's GEMMs are not part of it): q
// before RoPE, the normalized kv rows, for a kv source its kv_score rows, for an index source
// the indexer's q rows and raw weights; and the layer's small weights (compressor norm, wk,
// k_norm, attn_sink). Everything goes through the public ops (compress, insert, indexer_*,
// swa_insert_q_rope, sparse_decode / sparse_prefill, attention_output_rope) on the views of
// this layer's buffers, so that the layer is exactly the ops' composition.
//
// The layers of a model share what SPEC 1.3 shares: one top-k buffer written by each index
// source and read by the layers after it, one candidates buffer written by the candidate source
// and read by its consumers, the kv sources' caches read by their consumers. `LayerShared`
// holds them and says who wrote what on which step, so that a consumer whose source has not run
// on this step is an error rather than a read of stale indices.
//
// The layer runs on cfg.device: every buffer (caches, ring, outputs, weights, RoPE table, sink,
// the shared top-k, candidates and workspace) lives there and every op runs on cfg.exec. On CUDA a
// step's call allocates nothing and never synchronises the host: the decode schedule, the split
// and the prefill chunk plan are host plans made from the step's host batch (StepMetadata's host
// copies), the index rows are built on the device, and the prefill's compacted per-request data
// go up from host staging (pageable copies, staged before the call returns). A decode-only step
// has no upload at all, so its launches can be captured in a CUDA graph (with
// ReadPathConfig::capturing_cuda_graph set, SPEC 8.6). The inputs must be on cfg.device. On CUDA
// the stats that read device data (records, keys, top-k entries, candidates, checksum) stay 0
// unless ReadPathConfig::device_stats asks for them.
// Every argument is checked before anything is written (E8 naming it, the value and what was
// expected).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv41kv/attention.hpp"
#include "dsv41kv/buffer.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/indexer.hpp"
#include "dsv41kv/pipeline.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rope.hpp"
#include "dsv41kv/safetensors.hpp"

namespace dsv41kv::pipeline {

// The read path's choices, shared by every layer of a model.
struct ReadPathConfig {
  RecordFormat swa_format = RecordFormat::V4_584;         // SPEC 3.4: 584 / 528 records, plain rows
  RecordFormat compressed_format = RecordFormat::V4_584;  // SPEC 3.3: any record format
  IndexKFormat index_k_format = IndexKFormat::FP8_132;    // the format the scores read (SPEC 3.5, 8.3)
  int num_heads = 64;          // H of the layer's q: 8, 16, 32, 64 or 128 (a tensor-parallel shard, or the model's)
  int padded_heads = 0;        // H_pad the attention runs with: 0 = H, else 64 or 128 > H (sink -inf heads)
  float softmax_scale = 0.0f;  // 0: 512^-0.5 (SPEC 1.1, fp32 0x3D3504F3)
  float eps = 0.0f;            // config.rms_norm_eps: the compressor norm and k_norm (never defaulted)
  int64_t max_model_len = 0;   // sizes the prefill workspace (SPEC 9.5 cap_ws); >= every seq_len
  // Whether the step runs under CUDA-graph capture: the indexer's shortcut is then never taken
  // (SPEC 8.6). On the CPU it only selects the scored path for tests.
  bool capturing_cuda_graph = false;
  // CUDA: fill LayerStepStats' counts and checksum, which read the step's results back (each
  // layer's run() then synchronises; for tools and tests, not for serving or graph capture). The
  // CPU always fills them.
  bool device_stats = false;
  int heads_padded() const { return padded_heads > 0 ? padded_heads : num_heads; }
};
// E8 naming the field.
void validate(const ReadPathConfig& cfg);

// The small weights of one layer (bf16 bits, row-major, host).
struct LayerWeights {
  std::vector<float> attn_sink;           // f32 [H]: per-head sink (SPEC 9.2)
  std::vector<uint16_t> compressor_norm;  // kv source: bf16 [512]
  std::vector<uint16_t> wk;               // kv source: bf16 [128, 512] (SPEC 8.1)
  std::vector<uint16_t> k_norm;           // kv source: bf16 [128]

  // Deterministic weights for (layer, H, seed): sinks N(0, 1) (about the scale of a layer's
  // logits), norm weights 1 + N(0, 0.1), wk N(0, 1/sqrt(512)); all rounded to bf16 / fp32.
  static LayerWeights from_seed(const LayerInfo& layer, int num_heads, uint64_t seed);
  // From a safetensors file, with P = "layers.<L>.attn." (the tensor names, dtypes and shapes):
  //   P + "attn_sink"                 f32 [H]
  //   P + "compressor.norm.weight"    bf16 [512]       (kv sources)
  //   P + "indexer.wk.weight"         bf16 [128, 512]  (kv sources)
  //   P + "indexer.k_norm.weight"     bf16 [128]       (kv sources)
  // kFormat naming the file and the tensor when one is missing or of another dtype or shape.
  static LayerWeights from_safetensors(const st::SafetensorsFile& file, const LayerInfo& layer, int num_heads);
};

// The projected activations of one layer for a step of N rows (padding rows included), host
// views. Rows past N are not read.
struct LayerInputs {
  TensorView q;         // bf16 [>= N, H, 512], inner stride 1: the queries before RoPE
  TensorView kv;        // bf16 [>= N, 512], contiguous: the normalized kv rows (the SWA entries)
  TensorView kv_score;  // kv source: f32 [>= N, 512 r], inner stride 1, row stride % 16 == 0; else absent
  TensorView index_q;   // index source: bf16 [>= N, 32, 128], contiguous (wq_b_idx . qr, before RoPE); else absent
  TensorView w_raw;     // index source: bf16 [>= N, 32], contiguous (weights_proj(x)); else absent
};

// What one layer wrote and read on a step (for tools and tests).
struct LayerStepStats {
  int64_t swa_records = 0;         // SWA records written (tokens with slot_swa >= 0)
  int64_t compressed_records = 0;  // kv source: records written (closing tokens with a slot)
  int64_t index_keys = 0;          // kv source: index keys stored
  bool shortcut = false;           // index source: the top-k came from the shortcut (SPEC 8.6)
  int64_t topk_entries = 0;        // compressed keys attended: the valid entries of the top-k rows read
  int64_t topk_max = 0;            // the longest top-k prefix of the step
  int64_t candidate_blocks = 0;    // candidate source: blocks kept; consumer: blocks read
  int64_t candidate_masked = 0;    // consumer: visible entries the candidate blocks excluded
  int64_t swa_keys = 0;            // window keys attended
  int64_t decode_rows = 0, prefill_rows = 0, prefill_chunks = 0;
  uint64_t checksum = 0;           // FNV-1a of the output rows of the real tokens
  double ms = 0;                   // wall time of run()
};

class AttentionLayer;

// What the layers of a model share in a step (SPEC 1.3): the top-k and candidates buffers of
// max_tokens rows, the prefill workspace, the layers themselves (a consumer reads its kv
// source's caches), and who wrote the buffers on which StepMetadata generation.
class LayerShared {
 public:
  LayerShared(const ServingConfig& cfg, const ReadPathConfig& read, const ModelConfig& model);
  ~LayerShared();
  LayerShared(const LayerShared&) = delete;
  LayerShared& operator=(const LayerShared&) = delete;

  // The layer objects by model layer index (nullptr: not constructed). A layer registers itself
  // here when constructed with this object and unregisters when destroyed.
  const AttentionLayer* layer(int index) const;
  TensorView topk() const;        // i32 [max_tokens, 512]
  TensorView candidates() const;  // i32 [max_tokens, 2048]
  int topk_writer() const;        // the layer whose top-k the buffer holds (-1: none yet)
  int candidates_writer() const;

  struct Impl;
  Impl& impl() { return *impl_; }
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// One layer of a model (its role from the config's topology, SPEC 1.3) with its SWA cache and,
// for a kv source, its ring (ratio 2), compressed cache and index-K cache of the configured
// geometry (ServingConfig), and its outputs of max_tokens rows.
class AttentionLayer {
 public:
  // E8 for a configuration without the SWA cache or without the layer's
  // compressed type, weights of other sizes, a table without rows; E8 when `shared` already
  // holds a layer with this index.
  AttentionLayer(const ServingConfig& cfg, const ReadPathConfig& read, const ModelConfig& model, int layer,
                 const LayerWeights& weights, const RopeTable& table, LayerShared& shared);
  ~AttentionLayer();
  AttentionLayer(const AttentionLayer&) = delete;
  AttentionLayer& operator=(const AttentionLayer&) = delete;

  // The layer's step on metadata built from the same configuration (SPEC 9.8 order). E8 before
  // any write when: the metadata is of another configuration; an input is missing, of another
  // dtype or shape, or fewer rows than N; a position has no RoPE table row; the kv source (for a
  // consumer of its caches) or the index source (for a reader of its top-k) has not run on this
  // metadata generation; a candidate consumer's source did not write the candidates on it.
  void run(const StepMetadata& meta, const LayerInputs& in);

  // The read half of run() for one PCP rank (SPEC 7.6 step 4): the caller has already written
  // the step's gathered rows (every rank's tokens) into this layer's caches through swa_cache(),
  // compressed_cache() and index_k_cache() (steps 1-3), and `meta` is the rank's local batch (its
  // own query rows, local positions and per-request lengths). Runs the query RoPE without the SWA
  // insert, for an index source Q prep and the top-k, the attention and the inverse RoPE of meta's
  // rows; writes no cache, no ring and no latent (in.kv_score is not read and may be absent; the
  // stats count no record written). The shortcut of SPEC 8.6 is decided by `step_max_seq_len`,
  // the largest seq_len of the global step, so that every rank takes the branch the unsplit batch
  // takes (E8 when it is below meta's own). Errors as run().
  void run_queries(const StepMetadata& meta, const LayerInputs& in, int64_t step_max_seq_len);
  // The write half of run(): the SWA insert with the query RoPE and, for a kv source, the
  // compressor, the compressed insert and the index-K store of meta's rows; no indexer, no
  // attention, no outputs (last_stats() holds only the time). For state that exists before the
  // steps a caller attends, such as a prompt prefix computed earlier. Errors as run().
  void run_writes(const StepMetadata& meta, const LayerInputs& in);
  // The stream and CPU threads of the following steps (cfg.exec until then): the layer's ops run
  // on it; its buffers stay on the configured device. E8 for negative num_threads.
  void set_exec(const ExecContext& exec);

  const LayerInfo& info() const;
  const LayerStepStats& last_stats() const;
  // The last step's rows [0, N):
  TensorView output() const;          // bf16 [max_tokens, H, 512]: after the inverse RoPE (padded heads dropped)
  TensorView attention_out() const;   // bf16 [max_tokens, H_pad, 512]: the attention before the inverse RoPE
  TensorView lse() const;             // f32 [max_tokens, H_pad]: +inf for a row without keys
  TensorView q_rotated() const;       // bf16 [max_tokens, H_pad, 512]: the queries the attention read
  uint64_t last_generation() const;   // the metadata generation of the last run (0: never ran)
  // Caches (views of the layer's buffers; a consumer's compressed cache is its kv source's).
  const CacheView& swa_cache() const;
  const CacheView& compressed_cache() const;       // kv source only (E8 otherwise)
  const IndexKCacheView& index_k_cache() const;    // kv source only (E8 otherwise)
  TensorView ring() const;                         // ratio-2 kv source: f32 [ring_blocks, cap, 1024]
  TensorView latent() const;                       // kv source: bf16 [max_tokens, 512] (closing rows)
  const std::vector<float>& sink() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41kv::pipeline
