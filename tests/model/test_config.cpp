// Model config parsing and topology (SPEC 1.1-1.3, errors E1/E4/E7 and kFormat).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dsv41kv/config.hpp"
#include "dsv41kv/safetensors.hpp"
#include "support/paths.hpp"

using namespace dsv41kv;
using json = nlohmann::json;

namespace {

json flash_json() {
  const auto bytes = st::read_file(test::source_dir() + "/docs/examples/deepseek_v41_flash_config.json");
  return json::parse(bytes.begin(), bytes.end());
}

// Parses `j`, expects an Error with `code` whose message contains every string of `parts`.
void expect_error(const json& j, ErrorCode code, std::initializer_list<const char*> parts) {
  try {
    (void)parse_model_config(j.dump(), "cfg.json");
    ADD_FAILURE() << "accepted: " << j.dump().substr(0, 200);
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

}  // namespace

TEST(ModelConfig, FlashBuiltinMatchesSpec) {
  const ModelConfig c = deepseek_v41_flash();
  EXPECT_EQ(c.num_layers(), 43);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.rms_norm_eps, 1e-20);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  ASSERT_EQ(c.layers.size(), 43u);
  for (int L = 0; L < 43; ++L) {
    const LayerInfo& li = c.layer(L);
    const int want_r = (L < 2 || L >= 40) ? 0 : (L < 20 ? 2 : 1);
    EXPECT_EQ(li.ratio, want_r) << L;
    EXPECT_EQ(li.type, want_r == 0 ? LayerType::kSwaOnly : want_r == 1 ? LayerType::kC1A : LayerType::kC2A);
    EXPECT_EQ(li.is_draft, L >= 40);
    const bool kv = L == 2 || L == 8 || L == 14 || L == 20;
    const bool idx = kv || L == 24 || L == 28 || L == 32 || L == 36;
    EXPECT_EQ(li.is_kv_source, kv) << L;
    EXPECT_EQ(li.is_index_source, idx) << L;
    if (want_r == 0) {
      EXPECT_EQ(li.kv_src, -1);
      EXPECT_EQ(li.idx_src, -1);
      continue;
    }
    // SPEC 1.3 table
    const int want_kv = L < 8 ? 2 : L < 14 ? 8 : L < 20 ? 14 : 20;
    const int want_idx = L < 24 ? want_kv : L - (L % 4);
    EXPECT_EQ(li.kv_src, want_kv) << L;
    EXPECT_EQ(li.idx_src, want_idx) << L;
  }
  for (int L = 0; L < 43; ++L) {
    EXPECT_EQ(c.layer(L).is_candidate_source, L == 20) << L;
    EXPECT_EQ(c.layer(L).is_candidate_consumer, L == 24 || L == 28 || L == 32 || L == 36) << L;
  }
  EXPECT_STREQ(layer_type_name(c.layer(5).type), "c2a");
  EXPECT_STREQ(layer_type_name(c.layer(25).type), "c1a");
  EXPECT_STREQ(layer_type_name(c.layer(41).type), "swaonly");
  EXPECT_TRUE(c.has_ratio(1) && c.has_ratio(2) && c.has_ratio(0));
  EXPECT_THROW((void)c.layer(43), Error);
  EXPECT_THROW((void)c.ratio(-1), Error);
  EXPECT_NE(describe_topology(c).find("layer  20: r=1 c1a     kv_src  20 idx_src  20 kv-source index-source candidate-source"),
            std::string::npos)
      << describe_topology(c);
  EXPECT_NE(describe_topology(c).find("layer  28: r=1 c1a     kv_src  20 idx_src  28 index-source candidate-consumer"),
            std::string::npos)
      << describe_topology(c);
}

TEST(ModelConfig, ExampleFileEqualsBuiltin) {
  const ModelConfig a = load_model_config(test::source_dir() + "/docs/examples/deepseek_v41_flash_config.json");
  const ModelConfig b = deepseek_v41_flash();
  EXPECT_EQ(a.compress_ratios, b.compress_ratios);
  EXPECT_EQ(a.kv_source_layer_ids, b.kv_source_layer_ids);
  EXPECT_EQ(a.index_source_layer_ids, b.index_source_layer_ids);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.compress_rope_theta, b.compress_rope_theta);
  EXPECT_EQ(a.rope_scaling.present, b.rope_scaling.present);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.beta_fast, b.rope_scaling.beta_fast);
  EXPECT_EQ(a.rope_scaling.beta_slow, b.rope_scaling.beta_slow);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, b.rope_scaling.original_max_position_embeddings);
  for (auto [x, y] : {std::pair{a.hidden_size, b.hidden_size}, {a.num_hidden_layers, b.num_hidden_layers},
                      {a.num_nextn_predict_layers, b.num_nextn_predict_layers},
                      {a.num_attention_heads, b.num_attention_heads}, {a.num_key_value_heads, b.num_key_value_heads},
                      {a.head_dim, b.head_dim}, {a.qk_rope_head_dim, b.qk_rope_head_dim},
                      {a.q_lora_rank, b.q_lora_rank}, {a.index_n_heads, b.index_n_heads},
                      {a.index_head_dim, b.index_head_dim}, {a.index_topk, b.index_topk},
                      {a.candidate_topk_blocks, b.candidate_topk_blocks},
                      {a.candidate_block_size, b.candidate_block_size}, {a.sliding_window, b.sliding_window},
                      {a.max_position_embeddings, b.max_position_embeddings}})
    EXPECT_EQ(x, y);
  EXPECT_EQ(a.candidate_source_layer_id, b.candidate_source_layer_id);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].kv_src, b.layers[i].kv_src);
    EXPECT_EQ(a.layers[i].idx_src, b.layers[i].idx_src);
    EXPECT_EQ(a.layers[i].type, b.layers[i].type);
  }
}

TEST(ModelConfig, RatiosBeyondListAreZero) {
  json j = flash_json();
  j["compress_ratios"] = {0, 0, 2, 2};
  j["kv_source_layer_ids"] = {2};
  j["index_source_layer_ids"] = {2};
  j.erase("candidate_source_layer_id");
  const ModelConfig c = parse_model_config(j.dump());
  EXPECT_EQ(c.ratio(3), 2);
  EXPECT_EQ(c.ratio(4), 0);
  EXPECT_EQ(c.ratio(42), 0);
  EXPECT_EQ(c.layer(42).type, LayerType::kSwaOnly);
  EXPECT_EQ(c.layer(3).kv_src, 2);
}

TEST(ModelConfig, E1BadRatio) {
  json j = flash_json();
  j["compress_ratios"][5] = 4;
  expect_error(j, ErrorCode::kConfigRatio, {"E1", "compress_ratios[5]", "4", "expected 0, 1, or 2"});
  j["compress_ratios"][5] = -1;
  expect_error(j, ErrorCode::kConfigRatio, {"compress_ratios[5]", "-1"});
  j = flash_json();
  j["compress_ratios"].push_back(128);  // beyond the layers, still rejected
  expect_error(j, ErrorCode::kConfigRatio, {"compress_ratios[43]", "128"});
  // an unsupported ratio is E1 even when it is the only non-zero entry: it does not make the
  // keys of compressed layers (index_topk, ...) required first
  j = flash_json();
  for (auto& r : j["compress_ratios"]) r = 0;
  j["compress_ratios"][5] = 4;
  j.erase("index_topk");
  expect_error(j, ErrorCode::kConfigRatio, {"E1", "compress_ratios[5]", "4"});
  EXPECT_THROW((void)layer_type_of_ratio(3), Error);
}

TEST(ModelConfig, E4HeadGeometry) {
  json j = flash_json();
  j["head_dim"] = 576;
  expect_error(j, ErrorCode::kBackendUnsupported, {"E4", "head_dim", "576", "512"});
  j = flash_json();
  j["qk_rope_head_dim"] = 128;
  expect_error(j, ErrorCode::kBackendUnsupported, {"qk_rope_head_dim", "128", "64"});
  j = flash_json();
  j["index_head_dim"] = 64;
  expect_error(j, ErrorCode::kBackendUnsupported, {"index_head_dim", "64", "128"});
}

TEST(ModelConfig, E7Sources) {
  json j = flash_json();
  j.erase("kv_source_layer_ids");
  expect_error(j, ErrorCode::kTopology, {"E7", "kv_source_layer_ids", "missing or empty"});
  j = flash_json();
  j["index_source_layer_ids"] = json::array();
  j.erase("candidate_source_layer_id");
  expect_error(j, ErrorCode::kTopology, {"index_source_layer_ids"});
  j = flash_json();
  j["kv_source_layer_ids"] = {3, 8, 14, 20};  // layer 2 (r=2) has no kv source <= 2
  expect_error(j, ErrorCode::kTopology, {"layer 2", "no layer <= 2"});
  j = flash_json();
  j["kv_source_layer_ids"] = {2, 8, 14};  // layer 20 (r=1) would read layer 14 (r=2)
  expect_error(j, ErrorCode::kTopology, {"layer 20", "kv source, layer 14", "ratio 2"});
  j = flash_json();
  j["kv_source_layer_ids"] = {0, 2, 8, 14, 20};  // layer 0 is SWA-only
  expect_error(j, ErrorCode::kTopology, {"kv_source_layer_ids[0]", "ratio 0"});
  j = flash_json();
  j["kv_source_layer_ids"] = {2, 8, 14, 20, 41};  // a draft layer cannot be a source
  expect_error(j, ErrorCode::kTopology, {"kv_source_layer_ids[4]", "41"});
  j = flash_json();
  j["index_source_layer_ids"] = {2, 8, 14, 20, 24, 28, 32, 36, 36};
  expect_error(j, ErrorCode::kTopology, {"twice"});
  j = flash_json();
  j["candidate_source_layer_id"] = 21;
  expect_error(j, ErrorCode::kTopology, {"candidate_source_layer_id", "21"});
  // a kv source that is not an index source: layers 9..13 would read top-k indices of layer 2's
  // cache at layer 8's
  j = flash_json();
  j["index_source_layer_ids"] = {2, 14, 20, 24, 28, 32, 36};
  expect_error(j, ErrorCode::kTopology, {"E7", "kv source layer 8 is not in index_source_layer_ids"});
  // the candidate source: a ratio-1 kv + index source
  j = flash_json();
  j["candidate_source_layer_id"] = 14;
  expect_error(j, ErrorCode::kTopology, {"E7", "candidate_source_layer_id is layer 14 with compress ratio 2",
                                         "expected a ratio-1 layer"});
  j = flash_json();
  j["candidate_source_layer_id"] = 24;
  expect_error(j, ErrorCode::kTopology, {"E7", "candidate_source_layer_id is layer 24, which is not in "
                                         "kv_source_layer_ids"});
  j = flash_json();
  j["candidate_topk_blocks"] = 0;
  expect_error(j, ErrorCode::kInvalidArgument, {"'candidate_topk_blocks' is 0, expected a positive integer"});
  j = flash_json();
  j.erase("candidate_block_size");
  expect_error(j, ErrorCode::kInvalidArgument, {"'candidate_block_size' is 0"});
  // no compressed layer: the lists may be absent
  j = flash_json();
  j["compress_ratios"] = json::array();
  j.erase("kv_source_layer_ids");
  j.erase("index_source_layer_ids");
  j.erase("candidate_source_layer_id");
  const ModelConfig c = parse_model_config(j.dump());
  EXPECT_FALSE(c.has_ratio(1) || c.has_ratio(2));
}

TEST(ModelConfig, RequiredKeysAndTypes) {
  json j = flash_json();
  j.erase("rms_norm_eps");
  expect_error(j, ErrorCode::kFormat, {"'rms_norm_eps'", "missing", "no default"});
  j = flash_json();
  j["rms_norm_eps"] = nullptr;
  expect_error(j, ErrorCode::kFormat, {"'rms_norm_eps'", "missing"});
  j = flash_json();
  j["rms_norm_eps"] = "1e-6";
  expect_error(j, ErrorCode::kFormat, {"'rms_norm_eps'", "\"1e-6\"", "a number"});
  for (const char* key : {"hidden_size", "num_hidden_layers", "head_dim", "qk_rope_head_dim", "rope_theta",
                          "max_position_embeddings", "sliding_window", "compress_ratios", "compress_rope_theta",
                          "index_head_dim", "index_topk"}) {
    j = flash_json();
    j.erase(key);
    expect_error(j, ErrorCode::kFormat, {key, "missing"});
  }
  j = flash_json();
  j["hidden_size"] = 51.5;
  expect_error(j, ErrorCode::kFormat, {"'hidden_size'", "51.5", "an integer"});
  j = flash_json();
  j["compress_ratios"][3] = "2";
  expect_error(j, ErrorCode::kFormat, {"compress_ratios[3]", "an integer"});
  j = flash_json();
  j["compress_ratios"] = 2;
  expect_error(j, ErrorCode::kFormat, {"compress_ratios", "a list"});
  j = flash_json();
  j["rope_scaling"]["type"] = "linear";
  expect_error(j, ErrorCode::kFormat, {"rope_scaling.type", "linear", "yarn"});
  j = flash_json();
  j["rope_scaling"].erase("factor");
  expect_error(j, ErrorCode::kFormat, {"rope_scaling.factor", "missing"});
  j = flash_json();
  j["rope_scaling"] = 3;
  expect_error(j, ErrorCode::kFormat, {"rope_scaling"});
  j = flash_json();
  j["rms_norm_eps"] = -1e-6;
  expect_error(j, ErrorCode::kInvalidArgument, {"rms_norm_eps", "-1e-06"});
  j = flash_json();
  j["num_hidden_layers"] = 0;
  expect_error(j, ErrorCode::kInvalidArgument, {"num_hidden_layers", "0"});
  // rope_type spelling and integral floats are accepted; null rope_scaling = no scaling
  j = flash_json();
  j["rope_scaling"].erase("type");
  j["rope_scaling"]["rope_type"] = "yarn";
  j["hidden_size"] = 5120.0;
  EXPECT_EQ(parse_model_config(j.dump()).rope_scaling.type, "yarn");
  j["rope_scaling"] = nullptr;
  EXPECT_FALSE(parse_model_config(j.dump()).rope_scaling.present);
  // rms_norm_eps is taken as given
  j = flash_json();
  j["rms_norm_eps"] = 1e-6;
  EXPECT_EQ(parse_model_config(j.dump()).rms_norm_eps, 1e-6);
}

TEST(ModelConfig, MalformedJson) {
  for (const char* text : {"", "{", "{\"hidden_size\": }", "[1, 2]", "\"x\"", "null", "{} {}"}) {
    try {
      (void)parse_model_config(text, "bad.json");
      ADD_FAILURE() << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFormat) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
  }
  try {
    (void)load_model_config("/nonexistent/config.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
  }
}
