// Reading the vLLM baseline (baseline.hpp).
#include "bench/baseline.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/traffic_model.hpp"
#include "dsv41kv/common.hpp"

namespace dsv41kv::bench {

const BaselineRow* Baseline::find(int ratio, const std::string& workload) const {
  for (const auto& r : rows)
    if (r.ratio == ratio && r.workload == workload) return &r;
  return nullptr;
}

Baseline load_baseline(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail(ErrorCode::kIo, fmt::format("{}: cannot open", path));
  try {
    nlohmann::json j;
    f >> j;
    Baseline b;
    b.path = path;
    b.copy_GBps = j.at("copy_GBps").get<double>();
    for (const auto& r : j.at("rows")) {
      BaselineRow row;
      row.ratio = r.at("ratio").get<int>();
      row.workload = r.at("workload").get<std::string>();
      row.fused_ms = r.at("fused_ms").get<double>();
      if (r.contains("tokens")) row.tokens = r.at("tokens").get<int64_t>();
      if (r.contains("fused_bytes")) row.fused_bytes = r.at("fused_bytes").get<int64_t>();
      for (RecordFormat rf : kWritePathFormats) {
        const std::string rec = record_info(rf).name;
        if (r.contains("insert_" + rec + "_ms")) row.insert_ms[rec] = r.at("insert_" + rec + "_ms").get<double>();
        if (r.contains("insert_" + rec + "_bytes"))
          row.insert_bytes[rec] = r.at("insert_" + rec + "_bytes").get<int64_t>();
      }
      b.rows.push_back(row);
    }
    return b;
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kFormat, fmt::format("{}: {}", path, e.what()));
  }
}

std::vector<std::string> default_baseline_paths() {
  return {DSV41KV_DEFAULT_BASELINE, "../shared/baselines/vllm_triton_h200.json"};
}

BaselineLookup lookup_baseline(const std::string& path) {
  BaselineLookup l;
  if (!path.empty()) {
    l.tried = {path};
    l.baseline = load_baseline(path);
    return l;
  }
  for (const std::string& p : default_baseline_paths()) {
    l.tried.push_back(p);
    if (std::filesystem::exists(p)) {
      l.baseline = load_baseline(p);
      break;
    }
  }
  return l;
}

}  // namespace dsv41kv::bench
