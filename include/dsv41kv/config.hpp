// dsv41kv: the model configuration (SPEC 1.1-1.3) read from a Hugging Face config.json, and the
// layer topology derived from it (ratio, layer type, kv/index sources per layer).
//
// Errors: a compress ratio not in {0,1,2} is E1 (kConfigRatio); missing/empty/inconsistent
// kv_source_layer_ids / index_source_layer_ids / candidate_source_layer_id are E7 (kTopology: a
// compressed layer's kv source of another ratio, a kv source that is not an index source, a layer
// whose index source scores another kv source's cache than the one it reads, a candidate source
// that is not a ratio-1 kv + index source); head_dim != 512,
// qk_rope_head_dim != 64, index_head_dim != 128 are E4 (kBackendUnsupported); malformed JSON,
// a missing required key or a value of the wrong type is kFormat. Every message names the key,
// the value and what was expected. No value is ever defaulted silently: rms_norm_eps in
// particular is required.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv {

// Layer type by compress ratio (SPEC 6.7): 0 -> swaonly, 1 -> c1a, 2 -> c2a.
enum class LayerType : uint8_t { kSwaOnly = 0, kC1A = 1, kC2A = 2 };
const char* layer_type_name(LayerType t);  // "swaonly", "c1a", "c2a"
LayerType layer_type_of_ratio(int ratio);  // E1 for a ratio not in {0,1,2}

// rope_scaling of the compressed (ratio > 0) layers. `present == false`: no scaling (the
// compressed table is then a plain table with compress_rope_theta).
struct RopeScaling {
  bool present = false;
  std::string type;  // "yarn" (the only supported type)
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;
};

// The role of one layer (SPEC 1.3).
struct LayerInfo {
  int index = 0;
  int ratio = 0;
  LayerType type = LayerType::kSwaOnly;
  bool is_draft = false;         // index >= num_hidden_layers (MTP/nextn layers)
  bool is_kv_source = false;     // owns a compressor, compressed cache, indexer-K cache
  bool is_index_source = false;  // runs an indexer and writes the top-k buffer
  bool is_candidate_source = false;    // == candidate_source_layer_id: writes the candidate blocks
  bool is_candidate_consumer = false;  // an index source scoring the candidate source's indexer-K
                                       // cache, masked to its candidate blocks (SPEC 8.7)
  int kv_src = -1;               // ratio > 0: the kv source whose compressed cache it reads
  int idx_src = -1;              // ratio > 0: the index source whose top-k it reads
};

struct ModelConfig {
  // dimensions
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_nextn_predict_layers = 0;
  int64_t num_attention_heads = 0;   // 0 when absent from the file
  int64_t num_key_value_heads = 0;   // 0 when absent
  int64_t head_dim = 512;
  int64_t qk_rope_head_dim = 64;
  int64_t q_lora_rank = 0;           // 0 when absent
  // indexer (required when any layer has ratio > 0)
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 128;
  int64_t index_topk = 0;
  int candidate_source_layer_id = -1;  // -1 when absent
  int64_t candidate_topk_blocks = 0;
  int64_t candidate_block_size = 0;
  // attention
  int64_t sliding_window = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 0.0;  // required; never defaulted (SPEC 1.5)
  double rope_theta = 0.0;
  double compress_rope_theta = 0.0;  // required when any layer has ratio > 0
  RopeScaling rope_scaling;
  // topology inputs
  std::vector<int> compress_ratios;  // as given (may be shorter than num_layers())
  std::vector<int> kv_source_layer_ids;
  std::vector<int> index_source_layer_ids;
  // derived by finalize_topology(): one entry per layer, draft layers included
  std::vector<LayerInfo> layers;

  int num_layers() const { return static_cast<int>(num_hidden_layers + num_nextn_predict_layers); }
  // Ratio of layer L (0 beyond the compress_ratios list). E8 for L outside [0, num_layers()).
  int ratio(int layer) const;
  const LayerInfo& layer(int layer) const;
  bool has_ratio(int r) const;  // some layer has ratio r
  bool any_compressed() const { return has_ratio(1) || has_ratio(2); }  // some layer compresses
};

// Checks the constants and the lists (E1/E4/E7/kFormat as above) and fills `cfg.layers`.
// `source` names the configuration in messages.
void finalize_topology(ModelConfig& cfg, const std::string& source = "model config");

// Parses the text of a Hugging Face config.json and finalizes the topology.
ModelConfig parse_model_config(std::string_view json_text, const std::string& source = "config.json");
// Reads and parses a config.json file (kIo when it cannot be read).
ModelConfig load_model_config(const std::string& path);

// The published DeepSeek-V4.1-Flash configuration (SPEC 1.1), rms_norm_eps = 1e-20.
ModelConfig deepseek_v41_flash();

// One line per layer group, e.g. "layers 2, 8, 14: r=2 c2a kv+index source" (for the CLI).
std::string describe_topology(const ModelConfig& cfg);

}  // namespace dsv41kv
