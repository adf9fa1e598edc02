// dsv41kv: the model-level driver. It runs every layer of a config.json topology (ratios, kv and
// index sources, the candidate source; SPEC 1.2, 1.3) over engine steps: a CacheAllocator hands
// the requests their SWA, compressed and ring blocks (pages released below the window), one
// StepMetadata is built per step, and each AttentionLayer runs in layer order on the activations
// the engine supplies for it (an ActivationSource: the projections are the engine's).
//
// The driver runs on the serving configuration's device (as AttentionLayer). The ActivationSource
// always fills host buffers; on CUDA the driver copies each layer's rows to its device buffers on
// exec.stream before the layer runs (pageable copies, no synchronisation). Errors as the pieces' (E8 naming the argument; kCapacity when a pool runs out).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "dsv41kv/allocator.hpp"
#include "dsv41kv/attention_layer.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/pipeline.hpp"

namespace dsv41kv::pipeline {

// One request of an engine step: `query_len` new tokens at positions num_computed .. (the driver
// tracks num_computed).
struct RequestStep {
  int64_t id = 0;
  int64_t query_len = 0;
};
struct EngineStep {
  std::vector<RequestStep> requests;  // decodes first (SPEC 6.1)
  int64_t padding_rows = 0;           // graph padding after the real tokens
};

// The identity of a row of a step: which request and position (padding rows are not listed).
struct TokenId {
  int64_t request = 0;
  int64_t position = 0;
};

// The engine side of a layer: its projected activations for the step's rows.
class ActivationSource {
 public:
  virtual ~ActivationSource() = default;
  // Writes rows [0, num_rows) of `out` (the driver's buffers, as the layer needs them: absent views
  // are not the layer's inputs); rows [tokens.size(), num_rows) are padding rows.
  virtual void fill(const LayerInfo& layer, std::span<const TokenId> tokens, int64_t num_rows,
                    const LayerInputs& out) = 0;
};

class ModelRunner {
 public:
  // One AttentionLayer per layer of `model` with `weights(layer)`, RoPE tables of `rope_rows`
  // rows (the plain table for ratio-0 layers, YaRN for the others, SPEC 1.4), the allocator over
  // the pools of `serving` (its swa / c1a / c2a geometry and ring blocks).
  ModelRunner(const ModelConfig& model, const ServingConfig& serving, const ReadPathConfig& read,
              const std::function<LayerWeights(const LayerInfo&)>& weights, int64_t rope_rows);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // A new request (E8 when `id` is live). `null_blocks`: the request gets no pages and no ring
  // block (its block-table rows are the null page): nothing of it is written and its outputs are 0.
  void add_request(int64_t id, bool null_blocks = false);
  // Ends a request; its pages go back to the pools.
  void finish_request(int64_t id);
  bool live(int64_t id) const;
  int64_t num_computed(int64_t id) const;  // E8 for an unknown id

  // One engine step: every request's pages for its positions, the metadata, then every layer in
  // order with its activations from `source`; `after_layer` (when given) sees each layer right
  // after its run (the shared top-k buffer then holds what it read). Advances num_computed.
  void step(const EngineStep& step, ActivationSource& source,
            const std::function<void(const AttentionLayer&)>& after_layer = {});

  const ModelConfig& model() const;
  const StepMetadata& metadata() const;          // of the last step
  std::span<const TokenId> tokens() const;       // the last step's real rows
  const StepBatch& batch() const;                // the last step's batch
  int num_layers() const;
  const AttentionLayer& layer(int index) const;  // E8 outside [0, num_layers())
  const CacheAllocator& allocator() const;
  const LayerShared& shared() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41kv::pipeline
