// dsv41kv: the multi-step PCP serving simulation (SPEC 10.6) behind `dsv41kv run` and `demo`.
//
// A seeded workload (requests with prompt lengths and start offsets, a chunked-prefill
// scheduler with a token budget, decode steps, null-block requests, graph padding) is generated
// once, independently of P. A Simulation then replays it step by step with P ranks as threads
// (ThreadGroup), each rank owning its ring and its replicated compressed caches, and optionally
// with the two single-rank references of SPEC 7.8 (the non-PCP tail-policy run on the unsplit
// batch and the open-row run). check_step() asserts SPEC 7.8 and audits the link against an
// oracle derived from the plan alone (DECISION 13 tie-break).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dsv41kv/pcp.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::pcp {

// ---------------------------------------------------------------- workload

struct WorkloadConfig {
  uint64_t seed = 1;
  int64_t num_requests = 10;
  int64_t prompt_min = 9, prompt_max = 160;  // prompt tokens still to compute, inclusive range
  int64_t start_min = 0, start_max = 9;      // num_computed at admission (continued prefill)
  int64_t decode_steps = 3;                  // decode tokens per request after its prompt
  int64_t chunk_budget = 96;                 // tokens per step (decodes first, then prefills)
  bool jitter_budget = false;                // per-step budget uniform in [1, chunk_budget]
  int64_t max_num_seqs = 4;                  // running requests at once (and link num_rows)
  double null_block_fraction = 0.125;        // requests with ring block 0 and null pages
  int64_t graph_pad_multiple = 0;            // 0: padded = largest rank; else round up to it
  int64_t max_steps = 0;                     // 0: until every request has finished
};
// Checks ranges (E8 naming the field).
void validate(const WorkloadConfig& c);

struct ScheduledRequest {
  int32_t id = 0;  // workload request id
  GlobalRequest req;
};

struct Workload {
  WorkloadConfig config;
  struct Request {
    int64_t start = 0;       // num_computed at admission
    int64_t prompt_len = 0;  // tokens to prefill
    int64_t decode_steps = 0;
    bool null_block = false;
    int32_t ring_block = 0;  // 0 for null-block requests, distinct otherwise
  };
  std::vector<Request> requests;
  std::vector<std::vector<ScheduledRequest>> steps;  // decodes first, then prefills
  int64_t max_position = 0;                          // largest position of any token
};
Workload generate_workload(const WorkloadConfig& c);

// The built-in workload of `dsv41kv demo` (and of the tests that check what it writes): 6
// requests, prompts of 9..150 tokens starting at computed offsets 0..9 (odd and even), a 64-token
// chunk budget (so prefills are chunked), 3 decode steps each, at most 4 running at once; request
// 1 is the null-block request (ring block 0, no pages), every other one has a ring block.
inline Workload demo_workload(uint64_t seed) {
  Workload w = generate_workload(
      {.seed = seed, .num_requests = 6, .prompt_max = 150, .chunk_budget = 64, .null_block_fraction = 0.0});
  w.requests[1].null_block = true;
  w.requests[1].ring_block = 0;
  return w;
}

// ---------------------------------------------------------------- simulation

struct SimConfig {
  int ratio = 2;                       // 1 or 2
  std::vector<RecordFormat> formats = {RecordFormat::V4_584, RecordFormat::MXFP8_528,
                                       RecordFormat::NVFP4_288, RecordFormat::PLAIN_BF16,
                                       RecordFormat::PLAIN_FP8};
  int64_t states_per_page = 0;         // 0: 64 / ratio (SPEC 3.6)
  DecodePlacement placement = DecodePlacement::kReplicated;
#if defined(DSV41KV_TEST_SEAMS)
  seam::PcpFault fault = seam::PcpFault::kNone;  // test seam: each rank's layer step breaks so
#endif                                                  // (dsv41kv/test_seam.hpp)
  int64_t num_speculative_tokens = 0;  // E6 with P > 1
  float eps = 1e-6f;
  // Where the ranks' steps run. CUDA: every rank's ring, compressed caches and latents live on
  // GPU `cuda_device` (pcp_step_cuda.hpp: DeviceRank, pcp_layer_step_cuda; in-process ranks
  // gather through ThreadGroup(P, Device::CUDA)); the references stay on the CPU and the
  // host-side checks see the GPU's bytes, copied back after every step.
  Device device = Device::CPU;
  int cuda_device = 0;
  // The read path of the layer (SPEC 7.6 steps 2-4; the CPU only): on every rank the SWA insert
  // of the step's gathered kv rows and the index-K store of its gathered latents, then for the
  // rank's own query rows, with local positions and per-request lengths, the query RoPE, the
  // indexer's top-k (scored, or the shortcut of SPEC 8.6 decided by the global step's longest
  // sequence), the sparse attention (decode rows, prefill chunks through the workspace) and the
  // output inverse RoPE: pipeline::AttentionLayer::run_queries, one layer object per rank. With
  // references the same layer runs whole on the unsplit batch (AttentionLayer::run), and
  // check_step() also compares every token's top-k row, attention output and lse with the rank
  // that holds it (every rank's copy of a replicated decode), and the read path's SWA, compressed
  // (formats[0]) and index-K caches of every rank, bit for bit. Activations: SeededActivations
  // (read_path_check.hpp). E8 with device CUDA: the read path's layer (AttentionLayer) runs on
  // the CPU only.
  bool read_path = false;
  int num_heads = 8;         // H of the layer's queries: 8, 16, 32, 64 or 128
  bool scored_topk = false;  // never the shortcut (as under CUDA-graph capture, SPEC 8.6)
  // Host memory the simulation may allocate (0: no limit). The constructor estimates its caches,
  // rings, references and the ranks' largest step buffers before allocating anything and rejects
  // a workload that needs more (E8), naming what drives the size; the CLI passes the machine's
  // physical memory.
  int64_t max_host_bytes = 0;
};

struct Mismatch {
  int64_t step = 0;
  int rank = -1;           // -1: a reference
  std::string tensor;      // "latent", "cache[v4_584]", "ring", "link.ring_write_slots", ...
  int64_t index = 0;       // element index within the tensor (bytes for caches)
  std::string detail;
  std::string to_string() const;
};

// What the read path did (SimConfig::read_path): query rows attended through the decode path and
// in prefill chunks, the chunks, the window keys and top-k entries attended, the longest top-k
// prefix, and the steps whose top-k came from the shortcut (every rank and the single-rank run
// take the same branch). += sums, keeping the largest topk_max.
struct ReadPathCounts {
  int64_t decode_rows = 0, prefill_rows = 0, prefill_chunks = 0, swa_keys = 0, topk_entries = 0, topk_max = 0;
  int64_t shortcut_steps = 0;
  ReadPathCounts& operator+=(const ReadPathCounts& o);
};

struct StepReport {
  int64_t step = 0;
  int64_t num_reqs = 0, num_tokens = 0, num_decodes = 0;
  int64_t padded = 0, num_rows = 0;
  std::vector<int64_t> tokens_per_rank;
  std::vector<CommVolume> volume;          // per rank: keys, positions, rows, latents, replaced
  std::vector<uint64_t> measured_received; // per rank: the communicator's counter delta
  std::vector<uint64_t> measured_sent;
  std::vector<double> device_ms;           // per rank (device CUDA): the layer step on the GPU
  // Coverage of the step (summed over ranks): chunks whose odd first position found its
  // predecessor among the gathered last rows / had to read the ring; ring rows written by
  // save_ring_rows on rank 0; tokens of null-block requests; masked replica rows.
  int64_t prev_from_gathered = 0, prev_from_ring = 0, ring_writes = 0;
  int64_t null_block_tokens = 0, masked_replica_rows = 0;
  ReadPathCounts read;  // SimConfig::read_path, summed over the ranks
};

struct CheckStats {
  uint64_t latent_elements = 0, latent_mismatched = 0;
  uint64_t cache_bytes = 0, cache_mismatched = 0;
  uint64_t ring_floats = 0, ring_mismatched = 0;
  uint64_t link_entries = 0, link_mismatched = 0;
  // The read path: the bytes of its SWA, compressed and index-K caches; per token row of every
  // rank (decode copies included) its top-k row, attention output (bf16, after the inverse RoPE)
  // and lse.
  uint64_t read_cache_bytes = 0, read_cache_mismatched = 0;
  uint64_t attention_rows = 0;
  uint64_t topk_entries = 0, topk_mismatched = 0;
  uint64_t output_elements = 0, output_mismatched = 0;
  uint64_t lse_elements = 0, lse_mismatched = 0;
  CheckStats& operator+=(const CheckStats& o);
};

class Simulation {
 public:
  // E6 for P > 1 with speculative tokens; E8 for bad configs.
  //
  // With `external` (a communicator of size P, e.g. NcclCommunicator in one process per GPU),
  // this process runs only rank external->rank() over it (every rank still plans every rank on
  // the CPU); with_reference must then be false (check_step needs every rank: compare the rank
  // with compare_rank against an all-rank simulation of the same workload instead).
  Simulation(const SimConfig& cfg, const Workload& w, int P, bool with_reference,
             Communicator* external = nullptr);
  ~Simulation();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  int P() const;
  int64_t num_steps() const;
  // Runs step i (steps must run in order 0, 1, ...) on all ranks and, with_reference, on both
  // references.
  StepReport run_step(int64_t i);
  // SPEC 7.8 after the last run step (needs with_reference): returns the first difference
  // (order: link, latents, caches, rings; with the read path then its caches, top-k rows,
  // outputs and lse) and accumulates element statistics into `stats`.
  std::optional<Mismatch> check_step(CheckStats* stats = nullptr) const;
  // The rank this process runs (external communicator), or -1 when it runs all P ranks.
  int local_rank() const;
  // After the same step of both: this simulation's rank(s) (local_rank(), or all) against the
  // same rank of `other` (same workload, config and P; e.g. a CPU all-rank run), byte for byte:
  // link (ring write slots, predecessor lookups), latents of closing tokens with a valid slot,
  // every compressed-cache byte, the whole ring; with the read path (in both) its caches and every
  // local token's top-k row, output and lse. Returns the first difference.
  std::optional<Mismatch> compare_rank(const Simulation& other, CheckStats* stats = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Convenience: run all steps, checking each (when verify); stops at the first mismatch unless
// keep_going (then the statistics cover the whole run).
struct RunResult {
  int P = 1;
  std::vector<StepReport> steps;
  std::optional<Mismatch> first_mismatch;
  CheckStats stats;
};
RunResult run_simulation(const SimConfig& cfg, const Workload& w, int P, bool verify,
                         bool keep_going = false);

// ---------------------------------------------------------------- one rank in its own process

// One rank of a multi-process run (one process per GPU, `dsv41kv run --launch local`): this
// rank's Simulation over `comm` and, with verify, a CPU run of every rank of the same workload
// in this process, itself checked against the single-rank references of SPEC 7.8 at every step.

// What one step of the rank did.
struct WorkerStep {
  int rank = 0;
  StepReport report;
  uint64_t sent = 0, received = 0;  // bytes the communicator moved in the step (its counters)
  CommVolume expected;              // SPEC 7.7 for this rank
  double device_ms = 0;             // the rank's layer step on the device (0 on the CPU)
};

struct WorkerOptions {
  bool verify = false;
  // Called at the start of every step, once the ranks have met (a failure injection may end the
  // process there, while the peers are inside the step).
  std::function<void(int64_t step)> at_step_start;
  // Called after every step, before its checks.
  std::function<void(const WorkerStep&)> on_step;
};

struct WorkerResult {
  int rank = 0, P = 1;
  int64_t steps_run = 0;
  double device_ms = 0;                 // summed over the steps run
  uint64_t sent = 0, received = 0;      // the communicator's bytes over the steps run
  CommVolume expected;                  // SPEC 7.7 summed over the steps run
  CheckStats rank_vs_cpu;               // verify: this rank against the same rank of the CPU run
  CheckStats cpu_vs_references;         // verify: the CPU run against SPEC 7.8's references
  // The first difference: the communicator's bytes against SPEC 7.7, then (verify) SPEC 7.8 on
  // the CPU run, then this rank's link, latents, caches and ring against the CPU run's. The
  // run stops after the step that found it.
  std::optional<Mismatch> first_mismatch;
};

// Runs every step of `w` on rank comm.rank() of P = comm.size() with the state on cfg.device,
// the ranks meeting (comm.barrier()) before each step so that a step's device time is its own and
// not a wait for a peer still checking the previous step. E6/E8 as Simulation.
WorkerResult run_worker_rank(const SimConfig& cfg, const Workload& w, Communicator& comm,
                             const WorkerOptions& options = {});

}  // namespace dsv41kv::pcp
