// `dsv41kv demo` (the default job): the built-in workload through the demo's V4.1 topology on the
// write and the read path. What each layer wrote and read is held against facts counted here from
// the workload alone (positions, the null-block request, the ratios), the outputs are deterministic
// and independent of the thread count, `--verify` passes, and bad flags exit 2.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dsv41kv/device.hpp"
#include "dsv41kv/model_demo.hpp"
#include "dsv41kv/safetensors.hpp"
#include "support/cli.hpp"

using dsv41kv::test::run_cli;
using dsv41kv::test::TempDir;

namespace {

constexpr const char* kSmall = "demo --json --heads 8 --workload-scale 0.1";

}  // namespace

TEST(ModelDemo, EveryLayerWritesAndReadsWhatTheWorkloadSays) {
  TempDir tmp;
  const auto r = run_cli(std::string(kSmall) + " --threads 2", tmp);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto js = nlohmann::json::parse(r.out);
  const dsv41kv::oracles::DemoWorkload w = dsv41kv::oracles::demo_read_workload(0.1);
  const dsv41kv::ModelConfig m = dsv41kv::oracles::v41_demo_topology();
  ASSERT_EQ(js["steps"].size(), w.steps.size());
  std::map<int64_t, int64_t> computed;
  for (size_t s = 0; s < w.steps.size(); ++s) {
    const auto& st = js["steps"][s];
    int64_t tokens = 0, valid = 0, closing[3] = {0, 0, 0};
    for (const auto& rq : w.steps[s].requests) {
      const int64_t nc = computed[rq.id];
      tokens += rq.query_len;
      if (rq.id != 3) {  // the null-block request writes nothing
        valid += rq.query_len;
        for (int64_t p = nc; p < nc + rq.query_len; ++p) {
          closing[1] += 1;
          closing[2] += (p + 1) % 2 == 0;
        }
      }
      computed[rq.id] = nc + rq.query_len;
    }
    EXPECT_EQ(st["tokens"], tokens) << s;
    EXPECT_EQ(st["padding_rows"], w.steps[s].padding_rows) << s;
    ASSERT_EQ(st["layers"].size(), static_cast<size_t>(m.num_layers()));
    for (int L = 0; L < m.num_layers(); ++L) {
      const auto& l = st["layers"][static_cast<size_t>(L)];
      const dsv41kv::LayerInfo& li = m.layer(L);
      EXPECT_EQ(l["swa_records"], valid) << "step " << s << " layer " << L;
      EXPECT_EQ(l["compressed_records"], li.is_kv_source ? closing[li.ratio] : 0) << "step " << s << " layer " << L;
      EXPECT_EQ(l["index_keys"], li.is_kv_source ? closing[li.ratio] : 0) << "step " << s << " layer " << L;
      if (li.ratio == 0) EXPECT_EQ(l["topk_entries"], 0);
      else EXPECT_GT(l["topk_entries"].get<int64_t>(), 0) << "step " << s << " layer " << L;
    }
  }
  // deterministic, and the same bits on one thread
  const auto again = run_cli(std::string(kSmall) + " --threads 1", tmp);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out)["checksum"], js["checksum"]);
  const auto other = run_cli(std::string(kSmall) + " --seed 8", tmp);
  ASSERT_EQ(other.code, 0) << other.err;
  EXPECT_NE(nlohmann::json::parse(other.out)["checksum"], js["checksum"]);
}

TEST(ModelDemo, VerifyPasses) {
  TempDir tmp;
  const auto r = run_cli("demo --heads 8 --workload-scale 0.1 --verify --dense-stride 3", tmp);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.last_line(), "17 passed, 0 failed") << r.out;
  EXPECT_NE(r.out.find("prefill vs decode"), std::string::npos);
  EXPECT_NE(r.out.find("SWA fp8 + compressed fp8: vs dense binary64"), std::string::npos);
}

TEST(ModelDemo, BadFlagsExitTwoWithTheArgumentNamed) {
  TempDir tmp;
  for (const auto& [flags, needle] : std::map<std::string, std::string>{
           {"demo --ratio 2", "--ratio: an option of the write-path demo"},
           {"demo --swa-format nvfp4_288", "swa_format: nvfp4_288"},
           {"demo --heads 12", "--heads"},
           {"demo --format fp16", "fp16"},
           {"demo --workload-scale 0", "--workload-scale"}}) {
    const auto r = run_cli(flags, tmp);
    EXPECT_EQ(r.code, 2) << flags;
    EXPECT_NE(r.err.find(needle), std::string::npos) << flags << ": " << r.err;
  }
  if (!dsv41kv::cuda_device_available()) {  // with a GPU the read path runs there (tests/tools/test_demo_gpu.cpp)
    const auto r = run_cli("demo --device cuda", tmp);
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("demo --device cuda: no usable GPU"), std::string::npos) << r.err;
  }
}

// --weights: the layers' small weights from a safetensors file under the documented names give the
// same run as the seed they were drawn from; a file without a tensor is a malformed file (exit 2).
TEST(ModelDemo, WeightsFromSafetensorsUnderTheDocumentedNames) {
  TempDir tmp;
  const dsv41kv::ModelConfig m = dsv41kv::oracles::v41_demo_topology();
  dsv41kv::st::SafetensorsWriter w, partial;
  for (const dsv41kv::LayerInfo& li : m.layers) {
    const auto lw = dsv41kv::pipeline::LayerWeights::from_seed(li, 8, 7);
    const std::string p = "layers." + std::to_string(li.index) + ".attn.";
    w.add<float>(p + "attn_sink", {8}, lw.attn_sink);
    auto bf16 = [&](const std::string& name, std::vector<int64_t> shape, const std::vector<uint16_t>& v) {
      w.add(name, dsv41kv::st::StDType::BF16, std::move(shape),
            {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(uint16_t)});
    };
    if (li.is_kv_source) {
      bf16(p + "compressor.norm.weight", {512}, lw.compressor_norm);
      bf16(p + "indexer.wk.weight", {128, 512}, lw.wk);
      bf16(p + "indexer.k_norm.weight", {128}, lw.k_norm);
    }
    if (li.index != 3) {
      partial.add<float>(p + "attn_sink", {8}, lw.attn_sink);
    }
  }
  w.write(tmp / "w.safetensors");
  partial.write(tmp / "partial.safetensors");
  const auto seeded = run_cli(std::string(kSmall) + " --seed 7", tmp);
  const auto loaded = run_cli(std::string(kSmall) + " --seed 7 --weights '" + (tmp / "w.safetensors") + "'", tmp);
  ASSERT_EQ(seeded.code, 0) << seeded.err;
  ASSERT_EQ(loaded.code, 0) << loaded.err;
  EXPECT_EQ(nlohmann::json::parse(loaded.out)["checksum"], nlohmann::json::parse(seeded.out)["checksum"]);
  const auto bad = run_cli(std::string(kSmall) + " --weights '" + (tmp / "partial.safetensors") + "'", tmp);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("layers.1.attn.compressor.norm.weight"), std::string::npos) << bad.err;
}
