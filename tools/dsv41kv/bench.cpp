// `dsv41kv bench --device cuda [--json] [--iters N] [--baseline FILE]`: the CUDA write path on
// the workloads of ../shared/baselines (vLLM's Triton kernels on an H200):
//   decode256   256 requests x 1 token at odd positions (timed as CUDA-graph replays, per layer)
//   prefill32k  8 x 4096 tokens;  prefill256k 16 x 16384 tokens
// start positions random below 4096, ring capacity 8, 64 states per cache page; ratio 1 and 2;
// records v4_584, mxfp8_528, nvfp4_288; for each: the fused launch (compress_insert, no
// latent_out) and the separate kernels (compress with latent_out, then insert).
//
// Timing: CUDA events after warm-up, median over --iters repetitions, by default the way the
// baseline was measured (triton.testing.do_bench: repetitions enqueued back to back, each between
// its own events, prefill repetitions each after an L2 flush outside the events; see Timing).
// Decode: a CUDA graph of kDecodeLayers launches (one per layer, each layer with its own buffers),
// replayed; time per layer = replay time / layers. Bytes that must move are counted as the
// baseline README does (compress: kv_score read + latent write + ring tail writes; insert:
// latent read + record write; fused: kv_score read + ring tail writes + record write), GB/s =
// bytes / time, and the ratio to a 2 GiB device-to-device copy measured in the same run (bytes
// read + written).
// "wrong" counts the cache bytes where the fused launch and the separate kernels disagree
// (they must not: both are bit-identical to the CPU reference).
//
// Exit codes: 0 done, 1 wrong elements found, 2 bad flags / no CUDA.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rope.hpp"
#include "dsv41kv/tuning.hpp"

#if defined(DSV41KV_WITH_CUDA)
#include <cuda_runtime.h>

#include "bench/cuda/timing.hpp"
#endif

namespace dsv41kv::cli {
namespace {

// vLLM baseline times (ms) of ../shared/baselines/vllm_triton_h200.json, embedded so that the
// bench runs without the file; --baseline FILE replaces them.
struct BaselineRow {
  int ratio;
  std::string workload;
  double fused_ms;
  std::map<std::string, double> insert_ms;
};
struct Baseline {
  double copy_GBps = 4267.722093781908;
  std::vector<BaselineRow> rows = {
      {1, "decode256", 0.0016672110416480071,
       {{"v4_584", 0.001791965792836215}, {"mxfp8_528", 0.0017753133422658083}, {"nvfp4_288", 0.0018214436014927875}}},
      {1, "prefill32k", 0.036928001791238785,
       {{"v4_584", 0.03657599911093712}, {"mxfp8_528", 0.04016000032424927}, {"nvfp4_288", 0.04307200014591217}}},
      {1, "prefill256k", 0.23401600122451782,
       {{"v4_584", 0.24835200607776642}, {"mxfp8_528", 0.27590399980545044}, {"nvfp4_288", 0.3044799864292145}}},
      {2, "decode256", 0.002465546715111611,
       {{"v4_584", 0.0019628671883830558}, {"mxfp8_528", 0.0019513497914549485}, {"nvfp4_288", 0.0018576906807773713}}},
      {2, "prefill32k", 0.047520000487565994,
       {{"v4_584", 0.028063999488949776}, {"mxfp8_528", 0.027936000376939774}, {"nvfp4_288", 0.029279999434947968}}},
      {2, "prefill256k", 0.29289600253105164,
       {{"v4_584", 0.17759999632835388}, {"mxfp8_528", 0.18272000551223755}, {"nvfp4_288", 0.18889600038528442}}},
  };
  const BaselineRow* find(int ratio, const std::string& w) const {
    for (const auto& r : rows)
      if (r.ratio == ratio && r.workload == w) return &r;
    return nullptr;
  }
};

[[maybe_unused]] Baseline load_baseline(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail(ErrorCode::kIo, fmt::format("bench: --baseline {}: cannot open", path));
  nlohmann::json j;
  try {
    f >> j;
    Baseline b;
    b.copy_GBps = j.at("copy_GBps").get<double>();
    b.rows.clear();
    for (const auto& r : j.at("rows")) {
      BaselineRow row{r.at("ratio").get<int>(), r.at("workload").get<std::string>(),
                      r.at("fused_ms").get<double>(), {}};
      for (const char* rec : {"v4_584", "mxfp8_528", "nvfp4_288"}) {
        const std::string k = std::string("insert_") + rec + "_ms";
        if (r.contains(k)) row.insert_ms[rec] = r.at(k).get<double>();
      }
      b.rows.push_back(row);
    }
    return b;
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kFormat, fmt::format("bench: --baseline {}: {}", path, e.what()));
  }
}

struct Workload {
  std::string name;
  int num_reqs;
  int len;
  bool decode;
};
const Workload kWorkloads[] = {{"decode256", 256, 1, true},
                               {"prefill32k", 8, 4096, false},
                               {"prefill256k", 16, 16384, false}};
const RecordFormat kBenchFormats[] = {RecordFormat::V4_584, RecordFormat::MXFP8_528,
                                      RecordFormat::NVFP4_288};

// The bench's flags (see add_bench).
struct BenchOptions {
  bool json = false;
  int iters = 50;
  std::string baseline;             // vLLM baseline JSON ("" = embedded)
  std::string only;                 // one workload ("" = all)
  int only_ratio = 0;               // one ratio (0 = both)
  std::string only_record;          // one record format ("" = all)
  CompressTuning tuning;            // --program-warps, --stream-chunk, --stream-rows, the taper
  std::string stream_head;          // "W,C[;W,C]" (CompressTuning::taper)
  std::string stream_tail;          // "W,C[;W,C[;W,C]]", "0": no tail
  std::string timing = "do_bench";  // do_bench | sync (Timing)
  std::string decode_buffers = "per-layer";
  bool pdl = ExecContext{}.programmatic_launch;  // the library's default launch
  bool pdl_early_metadata = ExecContext{}.pdl_early_metadata;
};

#if defined(DSV41KV_WITH_CUDA)

constexpr int kDecodeLayers = 16;  // graph nodes per replay (decode), one per layer
constexpr int64_t kCap = 8;
constexpr int64_t kStatesPerPage = 64;

// Host inputs of one workload and ratio (shared by every layer replica and format).
struct Inputs {
  int ratio = 1;
  int64_t T = 0, R = 0, closing = 0, tail_rows = 0, table_rows = 0, capacity = 0;
  std::vector<float> kv, table, ring;
  std::vector<int64_t> pos, ring_slots, cache_slots;
  std::vector<int32_t> qsl, t2r;
  std::vector<uint16_t> norm_w;
};

uint16_t bf16_of(float f) { return num::bf16_encode(f); }

Inputs make_inputs(const Workload& w, int ratio, std::mt19937_64& rng) {
  Inputs in;
  in.ratio = ratio;
  in.R = w.num_reqs;
  in.T = static_cast<int64_t>(w.num_reqs) * w.len;
  std::uniform_int_distribution<int64_t> start_d(0, 4095);
  in.qsl.push_back(0);
  int64_t max_pos = 0;
  for (int64_t j = 0; j < in.R; ++j) {
    int64_t s = start_d(rng);
    if (w.decode) s |= 1;  // odd positions: ratio 2 closes a pair from the ring
    for (int64_t i = 0; i < w.len; ++i) {
      const int64_t p = s + i;
      in.pos.push_back(p);
      in.t2r.push_back(static_cast<int32_t>(j));
      in.ring_slots.push_back((j + 1) * kCap + p % kCap);
      max_pos = std::max(max_pos, p);
    }
    in.tail_rows += std::min<int64_t>(w.len, kCap);
    in.qsl.push_back(static_cast<int32_t>(in.pos.size()));
  }
  in.cache_slots.assign(static_cast<size_t>(in.T), -1);
  for (int64_t t = 0; t < in.T; ++t)
    if ((in.pos[static_cast<size_t>(t)] + 1) % ratio == 0) in.cache_slots[static_cast<size_t>(t)] = in.closing++;
  in.capacity = (in.closing + kStatesPerPage - 1) / kStatesPerPage * kStatesPerPage;
  const int64_t width = int64_t{512} * ratio;
  in.kv.resize(static_cast<size_t>(in.T * width));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // a cheap generator for the big arrays (not a statistics test)
  uint64_t x = rng() | 1;
  for (auto& v : in.kv) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u = static_cast<float>((x >> 40) & 0xFFFFFF) * (1.0f / 16777216.0f);
    v = (u - 0.5f) * 4.0f;
  }
  in.table_rows = max_pos + 2;
  in.table = build_rope_table(RopeParams{}, in.table_rows).data;  // plain RoPE, theta 10000
  in.ring.resize(static_cast<size_t>((in.R + 1) * kCap * 1024));
  for (auto& v : in.ring) v = nd(rng);
  in.norm_w.resize(512);
  for (auto& v : in.norm_w) v = bf16_of(1.0f + 0.1f * nd(rng));
  return in;
}

// Device buffers of one layer replica.
struct Layer {
  Dev<float> kv, table, ring;
  Dev<int64_t> pos, ring_slots, cache_slots;
  Dev<int32_t> qsl, t2r;
  Dev<uint16_t> norm_w, latent;
  Dev<uint8_t> cache;

  Layer(const Inputs& in, RecordFormat f)
      : kv(in.kv.size()), table(in.table.size()), ring(in.ring.size()), pos(in.pos.size()),
        ring_slots(in.ring_slots.size()), cache_slots(in.cache_slots.size()), qsl(in.qsl.size()),
        t2r(in.t2r.size()), norm_w(512), latent(static_cast<size_t>(in.T) * 512) {
    kv.upload(in.kv);
    table.upload(in.table);
    ring.upload(in.ring);
    pos.upload(in.pos);
    ring_slots.upload(in.ring_slots);
    cache_slots.upload(in.cache_slots);
    qsl.upload(in.qsl);
    t2r.upload(in.t2r);
    norm_w.upload(in.norm_w);
    const CacheView c = CacheView::with_default_strides(nullptr, f, in.capacity / kStatesPerPage, kStatesPerPage);
    cache = Dev<uint8_t>(static_cast<size_t>(c.backing_bytes()));
    cache.fill(0xA5);
    latent.fill(0xFF);
  }
  void reset(const Inputs& in) {
    ring.upload(in.ring);
    cache.fill(0xA5);
  }

  CompressArgs compress_args(const Inputs& in, bool with_latent) const {
    CompressArgs a;
    a.ratio = in.ratio;
    const int64_t width = int64_t{512} * in.ratio;
    a.kv_score = TensorView::contiguous(kv.p, DType::F32, {in.T, width}, Device::CUDA);
    a.positions = TensorView::contiguous(pos.p, DType::I64, {in.T}, Device::CUDA);
    a.slot_mapping = TensorView::contiguous(in.ratio == 2 ? ring_slots.p : cache_slots.p, DType::I64,
                                            {in.T}, Device::CUDA);
    a.norm_weight = TensorView::contiguous(norm_w.p, DType::BF16, {512}, Device::CUDA);
    a.eps = 1e-6f;
    if (with_latent) a.latent_out = TensorView::contiguous(latent.p, DType::BF16, {in.T, 512}, Device::CUDA);
    if (in.ratio == 2) {
      a.ring = TensorView::contiguous(ring.p, DType::F32, {in.R + 1, kCap, 1024}, Device::CUDA);
      a.qsl = TensorView::contiguous(qsl.p, DType::I32, {in.R + 1}, Device::CUDA);
      a.token_to_req = TensorView::contiguous(t2r.p, DType::I32, {in.T}, Device::CUDA);
    }
    return a;
  }
  CacheView cache_view(const Inputs& in, RecordFormat f) const {
    CacheView c = CacheView::with_default_strides(cache.p, f, in.capacity / kStatesPerPage, kStatesPerPage,
                                                  Device::CUDA);
    return c;
  }
  CompressInsertArgs fused_args(const Inputs& in, RecordFormat f) const {
    CompressInsertArgs a;
    a.compress = compress_args(in, false);
    a.rope_table = TensorView::contiguous(table.p, DType::F32, {in.table_rows, 64}, Device::CUDA);
    a.insert_slots = TensorView::contiguous(cache_slots.p, DType::I64, {in.T}, Device::CUDA);
    a.cache = cache_view(in, f);
    return a;
  }
  InsertArgs insert_args(const Inputs& in, RecordFormat f) const {
    InsertArgs a;
    a.ratio = in.ratio;
    a.latent = TensorView::contiguous(latent.p, DType::BF16, {in.T, 512}, Device::CUDA);
    a.positions = TensorView::contiguous(pos.p, DType::I64, {in.T}, Device::CUDA);
    a.rope_table = TensorView::contiguous(table.p, DType::F32, {in.table_rows, 64}, Device::CUDA);
    a.slots = TensorView::contiguous(cache_slots.p, DType::I64, {in.T}, Device::CUDA);
    a.cache = cache_view(in, f);
    return a;
  }
};

struct Row {
  std::string workload;
  int ratio;
  std::string record;
  std::string variant;  // fused | separate
  int64_t tokens;
  double ms;
  double bytes;
  double GBps;
  double copy_fraction;
  double vllm_ms;   // vLLM fused_ms + insert_ms (two launches)
  double speedup;   // vllm_ms / ms
  int64_t wrong;
};

int run_bench(const BenchOptions& o) {
  const bool shared_decode_buffers = o.decode_buffers == "shared";
  const Timing timing = o.timing == "sync" ? Timing::kSync : Timing::kDoBench;
  if (!cuda_device_available()) {
    std::fprintf(stderr, "dsv41kv bench: %s\n", cuda_device_description().c_str());
    return 2;
  }
  const Baseline base = o.baseline.empty() ? Baseline{} : load_baseline(o.baseline);
  cudaStream_t st;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  ExecContext ctx;
  ctx.stream = st;
  ctx.programmatic_launch = o.pdl;
  ctx.pdl_early_metadata = o.pdl_early_metadata;  // every layer's metadata is uploaded before timing
  ctx.compress_tuning = &o.tuning;
  Timer timer(st, o.iters, timing);
  const double copy_GBps = copy_bandwidth(st, timer);
  std::mt19937_64 rng(20261129);
  std::vector<Row> rows;
  int64_t total_wrong = 0;
  for (const Workload& w : kWorkloads) {
    if (!o.only.empty() && o.only != w.name) continue;
    for (int ratio : {1, 2}) {
      if (o.only_ratio != 0 && o.only_ratio != ratio) continue;
      const Inputs in = make_inputs(w, ratio, rng);
      const BaselineRow* br = base.find(ratio, w.name);
      for (RecordFormat f : kBenchFormats) {
        const RecordInfo& ri = record_info(f);
        if (!o.only_record.empty() && o.only_record != ri.name) continue;
        const int layers = w.decode ? kDecodeLayers : 1;
        // buffer sets: one per layer, or one shared by every node (how triton's do_bench replays
        // the baseline kernels: the same inputs each time, warm in L2)
        const int sets = w.decode && !shared_decode_buffers ? layers : 1;
        std::vector<Layer> L;
        L.reserve(static_cast<size_t>(sets));
        for (int l = 0; l < sets; ++l) L.emplace_back(in, f);
        const double T = static_cast<double>(in.T), closing = T / ratio;
        const double compress_bytes = ratio == 1 ? T * 2048 + T * 1024
                                                 : T * 4096 + closing * 1024 + in.tail_rows * 4096.0;
        const double insert_bytes = closing * (1024.0 + ri.record_bytes);
        const double fused_bytes = (ratio == 1 ? T * 2048 : T * 4096 + in.tail_rows * 4096.0) +
                                   closing * ri.record_bytes;
        auto fused = [&](int l) { compress_insert(L[static_cast<size_t>(l % sets)].fused_args(in, f), ctx); };
        auto separate = [&](int l) {
          compress(L[static_cast<size_t>(l % sets)].compress_args(in, true), ctx);
          insert(L[static_cast<size_t>(l % sets)].insert_args(in, f), ctx);
        };
        // correctness: fused vs separate from identical states, whole cache backings
        int64_t wrong = 0;
        {
          L[0].reset(in);
          fused(0);
          ck(cudaStreamSynchronize(st), "sync");
          const std::vector<uint8_t> a = L[0].cache.download();
          L[0].reset(in);
          separate(0);
          ck(cudaStreamSynchronize(st), "sync");
          const std::vector<uint8_t> b = L[0].cache.download();
          for (size_t i = 0; i < a.size(); ++i) wrong += a[i] != b[i];
        }
        total_wrong += wrong;
        double t_fused, t_sep;
        if (w.decode) {
          t_fused = timer.graph(layers, fused);
          t_sep = timer.graph(layers, separate);
        } else {
          t_fused = timer.eager([&] { fused(0); }, true);
          t_sep = timer.eager([&] { separate(0); }, true);
        }
        double vllm = 0.0;
        if (br) {
          const auto it = br->insert_ms.find(ri.name);
          if (it != br->insert_ms.end()) vllm = br->fused_ms + it->second;
        }
        for (int v = 0; v < 2; ++v) {
          Row r;
          r.workload = w.name;
          r.ratio = ratio;
          r.record = ri.name;
          r.variant = v == 0 ? "fused" : "separate";
          r.tokens = in.T;
          r.ms = v == 0 ? t_fused : t_sep;
          r.bytes = v == 0 ? fused_bytes : compress_bytes + insert_bytes;
          r.GBps = r.bytes / (r.ms * 1e-3) / 1e9;
          r.copy_fraction = r.GBps / copy_GBps;
          r.vllm_ms = vllm;
          r.speedup = vllm > 0 ? vllm / r.ms : 0.0;
          r.wrong = wrong;
          rows.push_back(r);
        }
      }
    }
  }
  cudaStreamDestroy(st);

  if (o.json) {
    nlohmann::json j;
    j["device"] = cuda_device_description();
    j["copy_GBps"] = copy_GBps;
    j["baseline_copy_GBps"] = base.copy_GBps;
    j["iters"] = o.iters;
    j["decode_layers_per_graph"] = kDecodeLayers;
    j["decode_buffers"] = shared_decode_buffers ? "shared" : "per-layer";
    j["programmatic_launch"] = o.pdl;
    j["pdl_early_metadata"] = o.pdl && o.pdl_early_metadata;
    j["program_warps"] = o.tuning.program_warps;
    j["stream_chunk"] = o.tuning.stream_chunk;
    j["stream_rows"] = o.tuning.stream_rows;
    j["stream_head"] = o.stream_head;
    j["stream_tail"] = o.stream_tail;
    j["timing"] = o.timing;
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows)
      j["rows"].push_back({{"workload", r.workload}, {"ratio", r.ratio}, {"record", r.record},
                           {"variant", r.variant}, {"tokens", r.tokens}, {"ms", r.ms},
                           {"us", r.ms * 1e3}, {"bytes", r.bytes}, {"GBps", r.GBps},
                           {"copy_fraction", r.copy_fraction}, {"vllm_ms", r.vllm_ms},
                           {"speedup_vs_vllm", r.speedup}, {"wrong", r.wrong}});
    j["total_wrong"] = total_wrong;
    std::printf("%s\n", j.dump(1).c_str());
  } else {
    fmt::print("device: {}\ncopy (D2D 2 GiB, read+write): {:.0f} GB/s (baseline run: {:.0f} GB/s)\n",
               cuda_device_description(), copy_GBps, base.copy_GBps);
    fmt::print("{:<12} {:>2} {:<10} {:<9} {:>7} {:>10} {:>12} {:>8} {:>6} {:>10} {:>8} {:>6}\n",
               "workload", "r", "record", "variant", "tokens", "time_us", "bytes", "GB/s",
               "copy%", "vllm_us", "speedup", "wrong");
    for (const Row& r : rows)
      fmt::print("{:<12} {:>2} {:<10} {:<9} {:>7} {:>10.2f} {:>12.0f} {:>8.0f} {:>5.1f}% {:>10.2f} {:>7.2f}x {:>6}\n",
                 r.workload, r.ratio, r.record, r.variant, r.tokens, r.ms * 1e3, r.bytes, r.GBps,
                 100.0 * r.copy_fraction, r.vllm_ms * 1e3, r.speedup, r.wrong);
    fmt::print("decode rows: per layer, {} layers per CUDA graph replay ({}); vllm = fused_ms + insert_ms of the baseline\n",
               kDecodeLayers, shared_decode_buffers ? "one buffer set shared by every layer" : "each layer its own buffers");
    fmt::print("timing: {}\n", timing == Timing::kSync
                                   ? "sync (each repetition alone, launch latency included, no L2 flush)"
                                   : "do_bench (repetitions back to back; prefill: L2 flush before each, outside the events)");
    if (o.pdl)
      fmt::print("compress launches with programmatic dependent launch (the default){}\n",
                 o.pdl_early_metadata ? ", metadata read before the grid dependency (--pdl-early-metadata)" : "");
    else
      fmt::print("compress launches without programmatic dependent launch (--no-pdl)\n");
  }
  return total_wrong == 0 ? 0 : 1;
}

#endif  // DSV41KV_WITH_CUDA

}  // namespace

void add_bench(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("bench", "time the CUDA write path on the baseline workloads");
  static std::string device = "cuda";
  static BenchOptions o;
  cmd->add_option("--device", device, "cuda (the CPU path is benchmarked by bench/)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_flag("--json", o.json, "print JSON instead of a table");
  cmd->add_option("--iters", o.iters, "timed repetitions per measurement (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--baseline", o.baseline, "vLLM baseline JSON (default: the embedded H200 figures)");
  cmd->add_option("--workload", o.only, "run one workload only")
      ->check(CLI::IsMember({"decode256", "prefill32k", "prefill256k"}));
  cmd->add_option("--ratio", o.only_ratio, "run one compress ratio only (1 or 2; default both)")
      ->check(CLI::IsMember({1, 2}));
  std::vector<std::string> record_names;
  for (RecordFormat f : kBenchFormats) record_names.emplace_back(record_info(f).name);
  cmd->add_option("--record", o.only_record, "run one record format only (default all)")
      ->check(CLI::IsMember(record_names));
  cmd->add_option("--program-warps", o.tuning.program_warps,
                  "compress kernel geometry: 0 = by size (default), 1 = one warp per token, 4 = four")
      ->check(CLI::IsMember({0, 1, 4}));
  cmd->add_option("--stream-chunk", o.tuning.stream_chunk,
                  "programs per chunk of the streaming compress kernel: 0 = by grid size (default), 8 or 16 "
                  "(16: kv rows read with the L2 evict-first policy)")
      ->check(CLI::IsMember({0, 8, 16}));
  cmd->add_option("--stream-rows", o.tuning.stream_rows,
                  "ratio-1 NVFP4 chunk-16 kernel's rows: 0 = the library's choice (default), 1 = cp.async, "
                  "2 = TMA at any grid size")
      ->check(CLI::IsMember({0, 1, 2}));
  cmd->add_option("--stream-head", o.stream_head,
                  "shape of the ratio-1 streaming grid, first tokens: W,C[;W,C] = parts of W x (resident warps) "
                  "warps of at most C tokens each (with --stream-head or --stream-tail the library's own shape is "
                  "replaced: an absent one means no parts)");
  cmd->add_option("--stream-tail", o.stream_tail,
                  "shape of the ratio-1 streaming grid, last tokens: W,C[;W,C[;W,C]] (the last part takes the "
                  "last tokens), or 0 for none");
  cmd->add_option("--timing", o.timing,
                  "do_bench (default: the baseline's method, triton.testing.do_bench: repetitions back to "
                  "back, an L2 flush before each prefill repetition) or sync (each repetition alone)")
      ->check(CLI::IsMember({"do_bench", "sync"}))
      ->capture_default_str();
  cmd->add_option("--decode-buffers", o.decode_buffers,
                  "decode graph: per-layer (each of the 16 nodes its own buffers, default) or shared "
                  "(every node the same buffers, as the baseline's do_bench replays one kernel)")
      ->check(CLI::IsMember({"per-layer", "shared"}))
      ->capture_default_str();
  cmd->add_flag("--pdl,!--no-pdl", o.pdl,
                "launch the compress kernels with programmatic dependent launch "
                "(ExecContext::programmatic_launch, the default) or without (--no-pdl)");
  cmd->add_flag("--pdl-early-metadata", o.pdl_early_metadata,
                "ExecContext::pdl_early_metadata (the bench uploads all metadata before timing; not with --no-pdl)");
  cmd->callback([&exit_code] {
    if (device != "cuda") {
      std::fprintf(stderr, "dsv41kv bench: --device %s: only cuda is benchmarked here (CPU benchmarks: build/dsv41kv_bench_cpu)\n",
                   device.c_str());
      exit_code = 2;
      return;
    }
    if (o.pdl_early_metadata && !o.pdl) {
      std::fprintf(stderr, "dsv41kv bench: --pdl-early-metadata needs programmatic launches: not with --no-pdl\n");
      exit_code = 2;
      return;
    }
#if defined(DSV41KV_WITH_CUDA)
    if (!o.stream_head.empty() || !o.stream_tail.empty()) {
      StreamTaper& tp = o.tuning.taper;
      tp.set = true;
      // "W,C[;W,C...]" (at most `max` parts) into waves/chunks; "0" or "": none. The values are
      // checked by validate_compress_tuning.
      auto parse = [](const std::string& text, int max, double* waves, int* chunks, int& n) {
        n = 0;
        if (text.empty() || text == "0") return true;
        for (size_t at = 0; at <= text.size(); ++n) {
          const size_t end = std::min(text.find(';', at), text.size());
          char extra = 0;
          if (n >= max || std::sscanf(text.substr(at, end - at).c_str(), "%lf,%d%c", &waves[n], &chunks[n], &extra) != 2)
            return false;
          at = end + 1;
        }
        return true;
      };
      const bool head_ok = parse(o.stream_head, kStreamHeadMax, tp.head_waves, tp.head_chunk, tp.nhead);
      const bool tail_ok = parse(o.stream_tail, kStreamTailMax, tp.tail_waves, tp.tail_chunk, tp.ntail);
      if (!head_ok || !tail_ok) {
        std::fprintf(stderr, "dsv41kv bench: %s %s: expected 0 or up to %d parts WAVES,CHUNK separated by ';'\n",
                     head_ok ? "--stream-tail" : "--stream-head", (head_ok ? o.stream_tail : o.stream_head).c_str(),
                     head_ok ? kStreamTailMax : kStreamHeadMax);
        exit_code = 2;
        return;
      }
    }
    try {
      validate_compress_tuning(o.tuning);
    } catch (const Error& e) {
      std::fprintf(stderr, "dsv41kv bench: --stream-head '%s' --stream-tail '%s': %s\n", o.stream_head.c_str(),
                   o.stream_tail.c_str(), e.what());
      exit_code = 2;
      return;
    }
    exit_code = run_bench(o);
#else
    std::fprintf(stderr, "dsv41kv bench: --device cuda: %s\n", cuda_device_description().c_str());
    exit_code = 2;
#endif
  });
}

}  // namespace dsv41kv::cli
