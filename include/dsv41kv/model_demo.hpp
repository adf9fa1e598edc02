// dsv41kv: the main job's workload through a whole V4.1 topology on the write and the read path
// (`dsv41kv demo`), and its verification (`dsv41kv demo --verify`).
//
// The built-in workload: four requests over six steps with num_speculative_tokens = 1 (decodes
// of 1 or 2 query tokens): a 1100-token prompt in three chunks (starts 0, 400, 800: the indexer
// scores once n_c > 512 at both ratios), a 301-token prompt in two chunks (starts 0 and 151, odd),
// a 64-token prompt, a null-block request (no pages: nothing written, outputs 0), decodes with
// s_q 1 and 2, one padding row on some steps. Activations: oracles::SeededActivations; weights:
// LayerWeights::from_seed.
//
// The default topology is the V4.1-Flash configuration's roles in eight layers (ratios
// 0 2 2 1 1 1 1 0: a c2a kv + index source and its consumer, the c1a kv + index + candidate
// source, a c1a consumer, a candidate consumer that is an index source and its consumer); any
// config.json topology can be given instead (the published one has 43 layers).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dsv41kv/attention_layer.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/model_runner.hpp"
#include "dsv41kv/read_path_check.hpp"

namespace dsv41kv::oracles {

// The V4.1-Flash configuration (SPEC 1.1) with the eight-layer topology above.
ModelConfig v41_demo_topology();

struct DemoRequest {
  int64_t id = 0;
  int64_t length = 0;       // tokens over the whole workload
  bool null_blocks = false;
};
struct DemoWorkload {
  std::vector<DemoRequest> requests;
  std::vector<pipeline::EngineStep> steps;
  int64_t num_speculative_tokens = 1;
  int64_t max_step_rows() const;  // the largest step, padding rows included
};
// The built-in workload above; `scale` < 1 shortens every prompt (tests under sanitizers), keeping
// the chunk starts' parity and the decode pattern.
DemoWorkload demo_read_workload(double scale = 1.0);

struct ModelDemoConfig {
  ModelConfig model = v41_demo_topology();
  DemoWorkload workload = demo_read_workload();
  uint64_t seed = 7;
  int threads = 0;  // 0: hardware concurrency
  int num_heads = 64;
  RecordFormat swa_format = RecordFormat::V4_584;
  RecordFormat compressed_format = RecordFormat::V4_584;
  // Non-empty: every layer's weights from this safetensors file (LayerWeights::from_safetensors
  // names), else LayerWeights::from_seed(layer, num_heads, seed).
  std::string weights_path;
  // Where the layers run: the CPU, or CUDA on `stream` (the layers' stats then read their results
  // back after each layer, ReadPathConfig::device_stats).
  Device device = Device::CPU;
  void* stream = nullptr;
};

// The serving and read-path configurations the demo runs with: pools sized by the workload (every
// request's pages live at once, SWA pages for its longest step), max_tokens its largest step.
pipeline::ServingConfig demo_serving_config(const ModelDemoConfig& c);
pipeline::ReadPathConfig demo_read_config(const ModelDemoConfig& c);

struct DemoStepReport {
  size_t step = 0;
  int64_t requests = 0, tokens = 0, padding_rows = 0, decode_tokens = 0, prefill_tokens = 0;
  int64_t max_seq_len = 0;
  std::vector<pipeline::LayerStepStats> layers;  // one per model layer
  double ms = 0;
};

struct ModelDemoReport {
  std::vector<DemoStepReport> steps;
  int64_t tokens = 0;
  double ms_per_type[3] = {0, 0, 0};  // total layer time by layer type (swaonly, c1a, c2a)
  int layers_per_type[3] = {0, 0, 0};
  uint64_t checksum = 0;              // of every layer's outputs over the workload
};

// Runs the workload; `after_layer` sees every layer right after it ran (checks), `on_step` each
// step's report as it completes.
ModelDemoReport run_model_demo(const ModelDemoConfig& c, const std::function<void(const DemoStepReport&)>& on_step = {},
                               const std::function<void(const pipeline::ModelRunner&, const pipeline::AttentionLayer&)>&
                                   after_layer = {});

// --verify: (1) every sequence of the workload attended once as one prefill and once token by
// token through decode, every layer's outputs of every token compared with the 9.7 rule; (2) the
// dense binary64 check of SPEC 9.2 on both runs (every `dense_stride`-th token of each) and on the
// workload itself for every record format pair (SWA, compressed): (584, 584), (528, 528),
// (528, 288), (bf16, bf16), (fp8, fp8).
struct VerifyLine {
  std::string what;   // e.g. "prefill vs decode, request 0, layer 3"
  bool pass = false;
  std::string detail;
};
struct VerifyReport {
  std::vector<VerifyLine> lines;
  int64_t failed() const;
};
// On CUDA every check runs on the GPU's results (read back), and (3) the workload runs on the GPU
// and the CPU in lockstep: after every step every layer's outputs within SPEC 9.7 of the CPU's
// and lse identical where non-finite and within 9.7 elsewhere, and every cache (SWA, compressed,
// index-K, ring) bit for bit.
VerifyReport verify_model_demo(const ModelDemoConfig& c, int64_t dense_stride,
                               const std::function<void(const VerifyLine&)>& on_line = {});

}  // namespace dsv41kv::oracles
