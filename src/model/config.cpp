// Model configuration and topology (SPEC 1.1-1.3, 6.7).
#include "dsv41kv/config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/file.hpp"

namespace dsv41kv {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad_key(const std::string& source, const std::string& key, const json& v, const char* expected) {
  fail(ErrorCode::kFormat, fmt::format("{}: key '{}' is {} ({}), expected {}", source, key, v.dump(), v.type_name(),
                                       expected));
}
[[noreturn]] void missing_key(const std::string& source, const std::string& key, const char* expected) {
  fail(ErrorCode::kFormat,
       fmt::format("{}: required key '{}' is missing (expected {}; no default is substituted)", source, key, expected));
}

std::optional<int64_t> json_int(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

struct Reader {
  const json& j;
  std::string source;
  std::string prefix;  // "rope_scaling." for nested objects

  const json* find(const char* key) const {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }
  int64_t integer(const char* key) const {
    const json* v = find(key);
    if (!v) missing_key(source, prefix + key, "an integer");
    const auto i = json_int(*v);
    if (!i) bad_key(source, prefix + key, *v, "an integer");
    return *i;
  }
  int64_t integer_or(const char* key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  double number(const char* key) const {
    const json* v = find(key);
    if (!v) missing_key(source, prefix + key, "a number");
    if (!v->is_number()) bad_key(source, prefix + key, *v, "a number");
    return v->get<double>();
  }
  double number_or(const char* key, double dflt) const { return has(key) ? number(key) : dflt; }
  std::vector<int> int_list(const char* key) const {
    const json* v = find(key);
    if (!v) missing_key(source, prefix + key, "a list of integers");
    if (!v->is_array()) bad_key(source, prefix + key, *v, "a list of integers");
    std::vector<int> out;
    for (size_t i = 0; i < v->size(); ++i) {
      const auto x = json_int((*v)[i]);
      if (!x || *x < INT32_MIN || *x > INT32_MAX)
        bad_key(source, fmt::format("{}{}[{}]", prefix, key, i), (*v)[i], "an integer");
      out.push_back(static_cast<int>(*x));
    }
    return out;
  }
};

// max{s in ids : s <= L}, or -1.
int source_at_or_below(const std::vector<int>& ids, int L) {
  int best = -1;
  for (int s : ids)
    if (s <= L && s > best) best = s;
  return best;
}

}  // namespace

const char* layer_type_name(LayerType t) {
  switch (t) {
    case LayerType::kSwaOnly: return "swaonly";
    case LayerType::kC1A: return "c1a";
    case LayerType::kC2A: return "c2a";
  }
  return "?";
}

LayerType layer_type_of_ratio(int ratio) {
  switch (ratio) {
    case 0: return LayerType::kSwaOnly;
    case 1: return LayerType::kC1A;
    case 2: return LayerType::kC2A;
    default:
      fail(ErrorCode::kConfigRatio,
           fmt::format("unsupported DeepSeek V4.1 compress_ratio {}; expected 0, 1, or 2", ratio));
  }
}

int ModelConfig::ratio(int L) const {
  if (L < 0 || L >= num_layers())
    invalid_argument(fmt::format("layer {} is outside the model's {} layers", L, num_layers()));
  return static_cast<size_t>(L) < compress_ratios.size() ? compress_ratios[static_cast<size_t>(L)] : 0;
}

const LayerInfo& ModelConfig::layer(int L) const {
  if (L < 0 || static_cast<size_t>(L) >= layers.size())
    invalid_argument(fmt::format("layer {} is outside the model's {} layers (topology {})", L, num_layers(),
                                 layers.empty() ? "not finalized" : "finalized"));
  return layers[static_cast<size_t>(L)];
}

bool ModelConfig::has_ratio(int r) const {
  for (int L = 0; L < num_layers(); ++L)
    if (ratio(L) == r) return true;
  return false;
}

void finalize_topology(ModelConfig& c, const std::string& src) {
  auto need_positive = [&](const char* key, int64_t v) {
    if (v <= 0) invalid_argument(fmt::format("{}: '{}' is {}, expected a positive integer", src, key, v));
  };
  need_positive("hidden_size", c.hidden_size);
  need_positive("num_hidden_layers", c.num_hidden_layers);
  if (c.num_nextn_predict_layers < 0)
    invalid_argument(fmt::format("{}: 'num_nextn_predict_layers' is {}, expected >= 0", src, c.num_nextn_predict_layers));
  if (c.num_hidden_layers + c.num_nextn_predict_layers > 100000)
    invalid_argument(fmt::format("{}: {} + {} layers is implausibly many", src, c.num_hidden_layers,
                                 c.num_nextn_predict_layers));
  need_positive("max_position_embeddings", c.max_position_embeddings);
  need_positive("sliding_window", c.sliding_window);

  // SPEC 1.1 checks: the backends serve exactly this head geometry (E4).
  if (c.head_dim != 512)
    fail(ErrorCode::kBackendUnsupported,
         fmt::format("{}: 'head_dim' is {}, expected 512 (448 NoPE + 64 RoPE dims); no DeepSeek-V4.1 backend "
                     "serves other head sizes", src, c.head_dim));
  if (c.qk_rope_head_dim != 64)
    fail(ErrorCode::kBackendUnsupported,
         fmt::format("{}: 'qk_rope_head_dim' is {}, expected 64", src, c.qk_rope_head_dim));
  if (c.index_head_dim != 128)
    fail(ErrorCode::kBackendUnsupported,
         fmt::format("{}: 'index_head_dim' is {}, expected 128", src, c.index_head_dim));
  if (!(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps >= 0.0))
    invalid_argument(fmt::format("{}: 'rms_norm_eps' is {}, expected a finite non-negative number", src, c.rms_norm_eps));
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 1.0))
    invalid_argument(fmt::format("{}: 'rope_theta' is {}, expected a number > 1", src, c.rope_theta));

  // E1: every listed ratio, including entries beyond the model's layers.
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    const int r = c.compress_ratios[i];
    if (r < 0 || r > 2)
      fail(ErrorCode::kConfigRatio,
           fmt::format("{}: compress_ratios[{}] is {}: unsupported DeepSeek V4.1 compress_ratio; expected 0, 1, "
                       "or 2 (ratios 4 and 128 are DeepSeek-V4.0 only)", src, i, r));
  }

  const int n = c.num_layers();
  const bool any_compressed = c.any_compressed();

  if (any_compressed) {
    if (!(std::isfinite(c.compress_rope_theta) && c.compress_rope_theta > 1.0))
      invalid_argument(fmt::format("{}: 'compress_rope_theta' is {}, expected a number > 1 (layers with compress "
                                   "ratio > 0 use it)", src, c.compress_rope_theta));
    need_positive("index_topk", c.index_topk);
    const RopeScaling& s = c.rope_scaling;
    if (s.present) {
      if (s.type != "yarn")
        fail(ErrorCode::kFormat, fmt::format("{}: 'rope_scaling.type' is \"{}\", expected \"yarn\"", src, s.type));
      if (!(std::isfinite(s.factor) && s.factor >= 1.0))
        invalid_argument(fmt::format("{}: 'rope_scaling.factor' is {}, expected a number >= 1", src, s.factor));
      if (!(std::isfinite(s.beta_fast) && std::isfinite(s.beta_slow) && s.beta_slow > 0.0 && s.beta_fast > s.beta_slow))
        invalid_argument(fmt::format("{}: rope_scaling beta_fast {} / beta_slow {}, expected beta_fast > beta_slow > 0",
                                     src, s.beta_fast, s.beta_slow));
      need_positive("rope_scaling.original_max_position_embeddings", s.original_max_position_embeddings);
    }
  }

  // E7: the source lists.
  auto check_ids = [&](const std::vector<int>& ids, const char* key) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const int s = ids[i];
      if (s < 0 || s >= c.num_hidden_layers)
        fail(ErrorCode::kTopology, fmt::format("{}: {}[{}] is {}, expected a layer in [0, {}) (num_hidden_layers)",
                                               src, key, i, s, c.num_hidden_layers));
      if (c.ratio(s) == 0)
        fail(ErrorCode::kTopology, fmt::format("{}: {}[{}] is layer {}, which has compress ratio 0 (SWA-only); a "
                                               "source layer needs ratio 1 or 2", src, key, i, s));
      for (size_t k = 0; k < i; ++k)
        if (ids[k] == s)
          fail(ErrorCode::kTopology, fmt::format("{}: {} lists layer {} twice", src, key, s));
    }
  };
  check_ids(c.kv_source_layer_ids, "kv_source_layer_ids");
  check_ids(c.index_source_layer_ids, "index_source_layer_ids");

  std::vector<LayerInfo> layers(static_cast<size_t>(n));
  for (int L = 0; L < n; ++L) {
    LayerInfo& li = layers[static_cast<size_t>(L)];
    li.index = L;
    li.ratio = c.ratio(L);
    li.type = layer_type_of_ratio(li.ratio);
    li.is_draft = L >= c.num_hidden_layers;
    const bool hidden = L < c.num_hidden_layers;
    li.is_kv_source = hidden && std::count(c.kv_source_layer_ids.begin(), c.kv_source_layer_ids.end(), L) > 0;
    li.is_index_source = hidden && std::count(c.index_source_layer_ids.begin(), c.index_source_layer_ids.end(), L) > 0;
    if (li.ratio == 0) continue;
    if (c.kv_source_layer_ids.empty())
      fail(ErrorCode::kTopology, fmt::format("{}: layer {} has compress ratio {} but kv_source_layer_ids is missing "
                                             "or empty", src, L, li.ratio));
    if (c.index_source_layer_ids.empty())
      fail(ErrorCode::kTopology, fmt::format("{}: layer {} has compress ratio {} but index_source_layer_ids is "
                                             "missing or empty", src, L, li.ratio));
    li.kv_src = source_at_or_below(c.kv_source_layer_ids, L);
    li.idx_src = source_at_or_below(c.index_source_layer_ids, L);
    if (li.kv_src < 0)
      fail(ErrorCode::kTopology, fmt::format("{}: layer {} has compress ratio {} but kv_source_layer_ids {} has no "
                                             "layer <= {}", src, L, li.ratio, c.kv_source_layer_ids, L));
    if (li.idx_src < 0)
      fail(ErrorCode::kTopology, fmt::format("{}: layer {} has compress ratio {} but index_source_layer_ids {} has "
                                             "no layer <= {}", src, L, li.ratio, c.index_source_layer_ids, L));
    if (c.ratio(li.kv_src) != li.ratio)
      fail(ErrorCode::kTopology, fmt::format("{}: layer {} has compress ratio {} but its kv source, layer {}, has "
                                             "ratio {}; they must be equal", src, L, li.ratio, li.kv_src,
                                             c.ratio(li.kv_src)));
  }
  // SPEC 1.3: a compressed layer reads the compressed cache of kv_src(L) at the indices of the top-k
  // of idx_src(L), which name entries of the cache that index source scores, kv_src(idx_src(L)).
  // Every kv source must be an index source: then idx_src(L) lies between kv_src(L) and L, so its
  // kv source is kv_src(L) (and its ratio the layer's), the one cache both refer to.
  for (const int s : c.kv_source_layer_ids)
    if (!layers[static_cast<size_t>(s)].is_index_source)
      fail(ErrorCode::kTopology, fmt::format("{}: kv source layer {} is not in index_source_layer_ids {}: a kv source "
                                             "runs the indexer over its own indexer-K cache, and the layers up to the "
                                             "next kv source read top-k indices into its compressed cache", src, s,
                                             c.index_source_layer_ids));
  const int cs = c.candidate_source_layer_id;
  if (cs >= 0 && (cs >= n || !layers[static_cast<size_t>(cs)].is_index_source))
    fail(ErrorCode::kTopology, fmt::format("{}: candidate_source_layer_id is {}, expected one of "
                                           "index_source_layer_ids {}", src, cs, c.index_source_layer_ids));
  if (cs >= 0) {
    // SPEC 1.3, 8.7: the candidate source scores its own (ratio-1) indexer-K cache and keeps blocks
    // of it; its consumers are the later index sources that score the same cache.
    LayerInfo& cl = layers[static_cast<size_t>(cs)];
    if (cl.ratio != 1)
      fail(ErrorCode::kTopology, fmt::format("{}: candidate_source_layer_id is layer {} with compress ratio {}, "
                                             "expected a ratio-1 layer", src, cs, cl.ratio));
    if (!cl.is_kv_source)
      fail(ErrorCode::kTopology, fmt::format("{}: candidate_source_layer_id is layer {}, which is not in "
                                             "kv_source_layer_ids {}: the candidate blocks cover the candidate "
                                             "source's own indexer-K cache, the one its consumers score", src, cs,
                                             c.kv_source_layer_ids));
    need_positive("candidate_topk_blocks", c.candidate_topk_blocks);
    need_positive("candidate_block_size", c.candidate_block_size);
    cl.is_candidate_source = true;
    for (LayerInfo& li : layers)
      li.is_candidate_consumer = li.is_index_source && li.index != cs && li.kv_src == cs;
  }
  c.layers = std::move(layers);
}

ModelConfig parse_model_config(std::string_view text, const std::string& src) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(ErrorCode::kFormat, fmt::format("{}: not valid JSON", src));
  if (!j.is_object())
    fail(ErrorCode::kFormat, fmt::format("{}: the document is a JSON {}, expected an object", src, j.type_name()));
  Reader r{j, src, ""};
  ModelConfig c;
  c.hidden_size = r.integer("hidden_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_nextn_predict_layers = r.integer_or("num_nextn_predict_layers", 0);
  c.num_attention_heads = r.integer_or("num_attention_heads", 0);
  c.num_key_value_heads = r.integer_or("num_key_value_heads", 0);
  c.head_dim = r.integer("head_dim");
  c.qk_rope_head_dim = r.integer("qk_rope_head_dim");
  c.q_lora_rank = r.integer_or("q_lora_rank", 0);
  c.rms_norm_eps = r.number("rms_norm_eps");
  c.rope_theta = r.number("rope_theta");
  c.max_position_embeddings = r.integer("max_position_embeddings");
  c.sliding_window = r.integer("sliding_window");
  c.compress_ratios = r.int_list("compress_ratios");
  if (r.has("kv_source_layer_ids")) c.kv_source_layer_ids = r.int_list("kv_source_layer_ids");
  if (r.has("index_source_layer_ids")) c.index_source_layer_ids = r.int_list("index_source_layer_ids");
  c.candidate_source_layer_id = static_cast<int>(r.integer_or("candidate_source_layer_id", -1));
  c.candidate_topk_blocks = r.integer_or("candidate_topk_blocks", 0);
  c.candidate_block_size = r.integer_or("candidate_block_size", 0);

  // Keys the compressed layers need are required only when there are such layers (entries of
  // compress_ratios beyond the model's layers do not count; invalid ratios are E1 later).
  const bool any_compressed = c.any_compressed();
  c.index_n_heads = r.integer_or("index_n_heads", 0);
  c.index_head_dim = any_compressed ? r.integer("index_head_dim") : r.integer_or("index_head_dim", 128);
  c.index_topk = any_compressed ? r.integer("index_topk") : r.integer_or("index_topk", 0);
  c.compress_rope_theta = any_compressed ? r.number("compress_rope_theta") : r.number_or("compress_rope_theta", 0.0);
  if (const json* rs = r.find("rope_scaling")) {
    if (!rs->is_object()) bad_key(src, "rope_scaling", *rs, "an object or null");
    Reader s{*rs, src, "rope_scaling."};
    RopeScaling& y = c.rope_scaling;
    y.present = true;
    const json* t = s.find("type");
    if (!t) t = s.find("rope_type");
    if (!t) missing_key(src, "rope_scaling.type", "\"yarn\"");
    if (!t->is_string()) bad_key(src, "rope_scaling.type", *t, "a string");
    y.type = t->get<std::string>();
    if (y.type == "yarn") {
      y.factor = s.number("factor");
      y.beta_fast = s.number("beta_fast");
      y.beta_slow = s.number("beta_slow");
      y.original_max_position_embeddings = s.integer("original_max_position_embeddings");
      // SPEC 1.4: the tables carry no magnitude scaling (mscale keys, if any, are not used).
    }
  }
  finalize_topology(c, src);
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  const auto bytes = detail::read_file_bytes(path);
  return parse_model_config(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

ModelConfig deepseek_v41_flash() {
  ModelConfig c;
  c.hidden_size = 5120;
  c.num_hidden_layers = 40;
  c.num_nextn_predict_layers = 3;
  c.num_attention_heads = 64;
  c.num_key_value_heads = 1;
  c.head_dim = 512;
  c.qk_rope_head_dim = 64;
  c.q_lora_rank = 1280;
  c.rms_norm_eps = 1e-20;
  c.sliding_window = 128;
  c.compress_ratios.assign(2, 0);
  c.compress_ratios.insert(c.compress_ratios.end(), 18, 2);
  c.compress_ratios.insert(c.compress_ratios.end(), 20, 1);
  c.compress_ratios.insert(c.compress_ratios.end(), 3, 0);
  c.kv_source_layer_ids = {2, 8, 14, 20};
  c.index_source_layer_ids = {2, 8, 14, 20, 24, 28, 32, 36};
  c.candidate_source_layer_id = 20;
  c.candidate_topk_blocks = 2048;
  c.candidate_block_size = 8;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.rope_scaling.present = true;
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 16.0;
  c.rope_scaling.beta_fast = 32.0;
  c.rope_scaling.beta_slow = 1.0;
  c.rope_scaling.original_max_position_embeddings = 65536;
  c.max_position_embeddings = 1048576;
  finalize_topology(c, "deepseek_v41_flash()");
  return c;
}

std::string describe_topology(const ModelConfig& c) {
  std::string out;
  for (const LayerInfo& li : c.layers) {
    std::string roles;
    if (li.is_kv_source) roles += " kv-source";
    if (li.is_index_source) roles += " index-source";
    if (li.is_candidate_source) roles += " candidate-source";
    if (li.is_candidate_consumer) roles += " candidate-consumer";
    if (li.is_draft) roles += " draft";
    if (li.ratio > 0)
      out += fmt::format("layer {:>3}: r={} {:<7} kv_src {:>3} idx_src {:>3}{}\n", li.index, li.ratio,
                         layer_type_name(li.type), li.kv_src, li.idx_src, roles);
    else
      out += fmt::format("layer {:>3}: r=0 {:<7}{}\n", li.index, layer_type_name(li.type), roles);
  }
  return out;
}

}  // namespace dsv41kv
