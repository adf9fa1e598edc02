// dsv41kv: the serving step of the write path. One engine step (its requests, their block tables
// and ring blocks, padding rows) becomes the per-step metadata of SPEC 6 once, and then every
// kv-source layer runs its compressor branch of SPEC 9.8 on it:
//   hidden (bf16) -> kv_score (projection, SPEC 4.1) -> compress with latent_out (SPEC 4)
//                 -> RoPE + quantized insert into every configured cache format (SPEC 5).
// Everything goes through the public API on views of Buffers on one device, ServingConfig::device:
// the device of the buffers picks the backend of every op (the CPU backend, or the CUDA kernels on
// ServingConfig::exec.stream), so that CPU and CUDA share this one code path; the projection is the
// one op with two entry points (project_kv_score on the CPU, CublasProjection on CUDA).
//
// The pieces are meant to grow into a whole V4.1 attention layer and a model driver over a
// config.json topology: StepMetadata is the step's metadata shared by every layer (SWA slots and
// window rows join it), KvSourceLayer is one layer's state (the SWA cache, the indexer and the
// attention join it), StepBatch is what the engine hands over.
//
// Allocation: every buffer (device memory and host staging) is allocated when its object is
// constructed, sized by the configuration (max_tokens, max_requests, pages, ring blocks): the
// metadata's staging and mappings at max_tokens rows and max_requests requests, a layer's
// weights, RoPE table, ring, caches and its kv_score and latent rows at max_tokens, the cuBLAS
// handle and workspace (CUDA). Building a step's metadata and running a layer allocate no memory
// (the CPU backend's worker threads are the ops' own) and do not synchronise: the step's host
// data goes up from pageable staging, which the CUDA driver stages before the call returns.
// Reading back (timings, WriteAudit, the Buffers' download) synchronises and is for callers that
// check or report, not for the serving path.
//
// Every function validates its arguments before touching any output and throws dsv41kv::Error
// naming the argument, the value and what was expected: E2 for a compressed-cache ratio outside
// {1, 2}, E3 for a compressor ratio outside {1, 2}, E8 otherwise.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "dsv41kv/buffer.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/metadata.hpp"
#include "dsv41kv/projection.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rope.hpp"

namespace dsv41kv::pipeline {

// ---------------------------------------------------------------- configuration

// The compressed caches of one layer type (c1a: ratio 1, c2a: ratio 2; SPEC 3.3, 3.6, 6.7): every
// kv-source layer of the type has caches of this geometry, addressed through the type's block
// table.
struct CompressedCacheGeometry {
  int64_t states_per_page = 0;    // S_r; 0: 64 / r (SPEC 3.6)
  int64_t num_pages = 0;          // physical pages of each cache, page 0 the null page; 0: type not served
  int64_t block_table_width = 0;  // logical pages per request (block-table columns), >= 1 when served
};

// The SWA cache of every layer (SPEC 3.4): pages of page_tokens tokens, one block table per
// request that every layer's SWA cache shares (each layer has its own cache tensor of num_pages
// pages). num_pages 0: no SWA cache (a write-path-only configuration).
struct SwaCacheGeometry {
  int64_t page_tokens = 32;       // P (SPEC 3.4, 6.4)
  int64_t num_pages = 0;          // physical pages of each layer's SWA cache, page 0 the null page
  int64_t block_table_width = 0;  // logical pages per request, >= 1 when served
};

struct ServingConfig {
  Device device = Device::CPU;  // where every buffer lives and every op runs
  ExecContext exec;             // CUDA stream and CPU threads of every op
  int64_t max_tokens = 0;       // rows of a step, padding rows included (>= 1)
  int64_t max_requests = 0;     // requests of a step (>= 1)
  int64_t num_speculative_tokens = 0;  // sets the ring capacity (SPEC 3.2)
  int64_t ring_blocks = 0;      // blocks of every ratio-2 ring, block 0 the null block (>= 1 with c2a)
  CompressedCacheGeometry c1a, c2a;
  SwaCacheGeometry swa;
  // The compressed-cache formats every kv-source layer writes (at least one, no repeats).
  std::vector<RecordFormat> formats{std::begin(kAllRecordFormats), std::end(kAllRecordFormats)};
  float fp8_scale = 1.0f;       // plain fp8 rows: the per-tensor scale sigma (finite, > 0)

  // The geometry of ratio r's type (E2 for r outside {1, 2}) and its S_r.
  const CompressedCacheGeometry& compressed(int ratio) const;
  int64_t states_per_page(int ratio) const;
  bool serves(int ratio) const { return compressed(ratio).num_pages > 0; }
  bool serves_swa() const { return swa.num_pages > 0; }
  int64_t ring_capacity() const;  // cap of SPEC 3.2
};
// E8 naming the field (E2 from compressed() for a bad ratio).
void validate(const ServingConfig& cfg);

// ---------------------------------------------------------------- one step

// One request of the step (SPEC 6.1): positions num_computed .. num_computed + query_len - 1.
struct StepRequest {
  int64_t query_len = 0;     // >= 0
  int64_t num_computed = 0;  // >= 0
  int32_t ring_block = 0;    // its block of every ratio-2 ring; <= 0: the null block (nothing stored)
  // Block-table rows: the physical page of each logical page of the type's caches (at most
  // block_table_width entries; missing trailing entries are 0). Pages <= 0 are the null page:
  // nothing is written there (SPEC 6.4 DECISION).
  std::vector<int32_t> c1a_pages;
  std::vector<int32_t> c2a_pages;
  // The SWA cache's row (SPEC 3.4: pages of swa_page_tokens tokens; the same page ids for every
  // layer's SWA cache), as the CacheAllocator hands it out.
  std::vector<int32_t> swa_pages;
  const std::vector<int32_t>& pages(int ratio) const { return ratio == 1 ? c1a_pages : c2a_pages; }
};

struct StepBatch {
  std::vector<StepRequest> requests;  // decodes first (SPEC 6.1)
  int64_t padding_rows = 0;           // rows after the real tokens (graph padding): position 0, every slot -1
  int64_t num_tokens() const;         // real tokens: the sum of query_len
  int64_t num_rows() const { return num_tokens() + padding_rows; }  // N
};

// The metadata of one step for every layer (SPEC 6), built once per step before the first layer:
// qsl, positions and token_to_req, and for each served type its block table and compressed slot
// mapping (SPEC 6.4, 6.5), with c2a also the ring block table and ring slots (SPEC 6.3). The
// builders run on the configured device: the CUDA builders on exec.stream, fed by uploads of the
// batch's host data.
class StepMetadata {
 public:
  // Allocates every buffer for max_tokens rows and max_requests requests.
  explicit StepMetadata(const ServingConfig& cfg);
  ~StepMetadata();
  StepMetadata(const StepMetadata&) = delete;
  StepMetadata& operator=(const StepMetadata&) = delete;

  // Validates the batch against the configuration before anything is written (E8 naming the
  // request and field: more rows or requests than configured, negative lengths, a ring block or
  // page beyond the configured ones, a block-table row longer than the width, a closing token
  // whose logical page lies beyond it), so that both devices accept and reject the same batches;
  // then uploads it and runs the builders.
  void build(const StepBatch& batch);
  // The stream and CPU threads of the following builds (cfg.exec until then), for callers whose
  // stream changes between steps (a framework's current stream, a CUDA-graph capture stream). The
  // device stays the configured one; E8 for negative num_threads.
  void set_exec(const ExecContext& exec);

  const ServingConfig& config() const;
  int64_t num_requests() const;
  int64_t num_tokens() const;    // real tokens
  int64_t num_rows() const;      // N
  int64_t max_position() const;  // largest position of a real token (-1 without any)
  // Views of the last build on the configured device, N = num_rows():
  TensorView qsl() const;                  // i32 [num_reqs + 1]
  TensorView positions() const;            // i64 [N]
  TensorView token_to_req() const;         // i32 [N]
  TensorView compressed_slots(int ratio) const;  // i64 [N] (a served type; E8 otherwise)
  TensorView ring_slots() const;           // i64 [N] (c2a served)
  TensorView ring_block_table() const;     // i32 [num_reqs, 1]
  TensorView block_table(int ratio) const; // i32 [num_reqs, block_table_width]

  // The read path's metadata (SPEC 6.2, 6.4, 6.6), when the SWA cache is served (E8 otherwise):
  TensorView swa_block_table() const;      // i32 [num_reqs, swa.block_table_width]
  TensorView swa_slots() const;            // i64 [N]: slot_swa (SPEC 6.4); is_valid_token = slot >= 0
  TensorView token_valid() const;          // i32 [N]: 1 where slot_swa >= 0 (SPEC 6.1), else 0
  TensorView seq_lens() const;             // i64 [num_reqs]: num_computed + query_len
  int64_t max_seq_len() const;             // the largest seq_len of the step (0 without requests)
  // The split is the host's (from the batch); the window rows are built on the configured device
  // with it (the CUDA builders of metadata.hpp), the gather lengths on the host and copied there.
  DecodeSplit split() const;               // SPEC 6.2 with cfg.num_speculative_tokens
  // The decode query rows' query tokens per request: the decodes' common query_len, 1 when they
  // differ (each decode token is its own query row, SPEC 6.2) or without decodes.
  int decode_s_q() const;
  TensorView swa_window() const;           // i32 [max_tokens, 128]: the decode window rows (SPEC 6.6)
  TensorView swa_window_lens() const;      // i32 [max_tokens]: their lengths (0 beyond the decodes)
  TensorView gather_lens() const;          // i64 [num_prefills]: G_b of the i-th prefill (SPEC 6.6)
  TensorView gather_starts() const;        // i64 [num_prefills]: gather_start_b
  // Host copies of the last build's batch data (on either device), for what is planned on the host
  // (the prefill chunks, SPEC 9.5): the same values as the views above.
  TensorView host_qsl() const;             // i32 [num_reqs + 1]
  TensorView host_seq_lens() const;        // i64 [num_reqs]
  TensorView host_gather_lens() const;     // i64 [num_prefills]
  TensorView host_gather_starts() const;   // i64 [num_prefills]
  TensorView host_swa_block_table() const; // i32 [num_reqs, swa.block_table_width]
  TensorView host_block_table(int ratio) const;  // i32 [num_reqs, block_table_width] (a served type)
  // Counts the builds of this object: a layer's results name the build they belong to, so that a
  // consumer layer can tell that its source ran on this very step.
  uint64_t generation() const;
  // Milliseconds of the last build on the device (CUDA events around uploads and builders: waits
  // for them), or of the host calls on the CPU.
  double last_ms() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------- one kv-source layer

struct LayerTimings {
  double projection_ms = 0;       // the kv_score projection
  double compress_insert_ms = 0;  // compress and the inserts into every cache
};

// The state of one kv-source layer of ratio 1 or 2 on the configured device: its weights and
// RoPE table, its ring (ratio 2), one compressed cache per configured format (default page
// strides, SPEC 3.6), and the kv_score and latent rows of max_tokens rows.
class KvSourceLayer {
 public:
  // The ratio is the weights' (E3 outside {1, 2}); its type must be served (E8). `table` needs
  // a row for every position the steps will hold (run() checks). Ring and caches start zeroed:
  // refill them through ring() / cache_buffer() to start from other contents (canaries).
  KvSourceLayer(const ServingConfig& cfg, const CompressorWeights& weights, const RopeTable& table, float eps);
  ~KvSourceLayer();
  KvSourceLayer(const KvSourceLayer&) = delete;
  KvSourceLayer& operator=(const KvSourceLayer&) = delete;

  // One step on metadata built from the same configuration: kv_score = hidden . W^T for the
  // step's N rows, compress (ring policy tail, latent_out = latent()), insert into every cache.
  // hidden: bf16 [>= N, hidden_size] on the configured device, inner stride 1. E8 when the
  // metadata is of another device or geometry, or a position has no RoPE table row.
  void run(const StepMetadata& meta, const TensorView& hidden);
  // The last run's times (CUDA: events; waits for them).
  LayerTimings last_timings() const;

  int ratio() const;
  int64_t hidden_size() const;
  const ServingConfig& config() const;
  // State and the last step's rows, for callers that read back what was written or refill a
  // buffer's contents (its allocation is the layer's: replacing the Buffer object is not allowed).
  Buffer& ring();  // f32 [ring_blocks, cap, 1024] contiguous (ratio 2; empty for ratio 1)
  const Buffer& ring() const;
  TensorView ring_view() const;
  size_t num_caches() const;  // one per configured format, in ServingConfig::formats order
  const CacheView& cache(size_t i) const;
  Buffer& cache_buffer(size_t i);
  const Buffer& cache_buffer(size_t i) const;
  Buffer& kv_score();         // f32 [max_tokens, 512 * ratio]: the last step's rows 0..N-1
  const Buffer& kv_score() const;
  Buffer& latent();           // bf16 [max_tokens, 512]: written rows of the last step (SPEC 4.7)
  const Buffer& latent() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------- reading back what was written

// The read-back rule of a record (SPEC 5.2, 5.3): `read`, dimension d of the state read back by
// gather (bf16 bits), holds `expected`, the fp32 value the record's writer was given (the latent
// on dims 0..447, its RoPE rotation on 448..511): exactly bf16(expected) where the format stores
// bf16 (plain bf16 rows, the 584 record's RoPE dims), otherwise within one quantization step of
// the stored value (rec::decode_with_step). `page` as for decode_with_step: the page base
// of a packed format, the row of a plain one.
bool reads_back(RecordFormat f, const uint8_t* page, int64_t S, int64_t r, int d, float fp8_scale, uint16_t read,
                float expected);

struct FormatReadback {
  RecordFormat format = RecordFormat::V4_584;
  int64_t records = 0;      // records the step wrote (tokens with a compressed slot)
  int64_t bad_records = 0;  // of those, records whose latent dims do not read back (reads_back)
  std::string first_bad;    // the first such record and dimension, empty when none
};

struct StepWrites {
  int64_t latents = 0;    // latent rows the step wrote (rows that no longer hold the audit's mark)
  int64_t ring_rows = 0;  // ring rows whose bytes the step changed
  int64_t records = 0;    // records written into each cache
  std::vector<FormatReadback> formats;  // one per cache of the layer
  int64_t bad_records() const;          // over every format
};

// What each step of one layer wrote, read back from the layer's buffers for tools and tests: it
// synchronises and keeps host copies (the ring, and per step the latents, slots and caches).
class WriteAudit {
 public:
  // Copies the ring as it is now; allocates the gather output of max_tokens rows on the device.
  explicit WriteAudit(KvSourceLayer& layer);
  ~WriteAudit();
  WriteAudit(const WriteAudit&) = delete;
  WriteAudit& operator=(const WriteAudit&) = delete;

  // Before the layer's step: marks its latent rows unwritten (bf16 NaN 0xFFFF in every element).
  void before_step();
  // After it: the latent rows no longer marked, the ring rows changed since the last call (or
  // the construction), and every record of the step (compressed slot >= 0) gathered back and
  // held against the latent row of its token on dims 0..447 with reads_back.
  StepWrites after_step(const StepMetadata& meta);

#if defined(DSV41KV_TEST_SEAMS)
  // Test seam: hold the records against the negated latents (a wrong expectation), to show that
  // the read-back check fails when it must.
  bool seam_negate_expected = false;
#endif

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41kv::pipeline
