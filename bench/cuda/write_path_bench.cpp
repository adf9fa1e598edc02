// `dsv41kv bench --device cuda` (write_path_bench.hpp): inputs, layer buffers, timing, report.
#include "bench/cuda/write_path_bench.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda/timing.hpp"
#include "bench/traffic_model.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rope.hpp"

namespace dsv41kv::bench {
namespace {

constexpr int kDecodeLayers = 16;  // graph nodes per replay (decode), one per layer

// Host inputs of one workload and ratio (shared by every layer replica and format).
struct Inputs {
  int ratio = 1;
  int64_t T = 0, R = 0, closing = 0, table_rows = 0, capacity = 0;
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
      in.ring_slots.push_back((j + 1) * kRingCapacity + p % kRingCapacity);
      max_pos = std::max(max_pos, p);
    }
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
  in.ring.resize(static_cast<size_t>((in.R + 1) * kRingCapacity * 1024));
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
      a.ring = TensorView::contiguous(ring.p, DType::F32, {in.R + 1, kRingCapacity, 1024}, Device::CUDA);
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
  std::optional<double> vllm_ms;  // vLLM fused_ms + insert_ms (two launches); none: no baseline figure
  std::optional<double> speedup;  // vllm_ms / ms
  int64_t wrong;
};

}  // namespace

int run_write_path_bench(const WritePathBenchOptions& o) {
  const bool shared_decode_buffers = o.decode_buffers == "shared";
  const Timing timing = o.timing == "sync" ? Timing::kSync : Timing::kDoBench;
  if (!cuda_device_available()) {
    std::fprintf(stderr, "dsv41kv bench: %s\n", cuda_device_description().c_str());
    return 2;
  }
  const Baseline* base = o.baseline.baseline ? &*o.baseline.baseline : nullptr;
  if (!base)
    fmt::print(stderr, "dsv41kv bench: no baseline at {}: the vLLM columns are left out\n",
               fmt::join(o.baseline.tried, " or "));
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
      const BaselineRow* br = base ? base->find(ratio, w.name) : nullptr;
      const TrafficShape shape = traffic_shape(w, ratio);
      for (RecordFormat f : kWritePathFormats) {
        const RecordInfo& ri = record_info(f);
        if (!o.only_record.empty() && o.only_record != ri.name) continue;
        const int layers = w.decode ? kDecodeLayers : 1;
        // buffer sets: one per layer, or one shared by every node (how triton's do_bench replays
        // the baseline kernels: the same inputs each time, warm in L2)
        const int sets = w.decode && !shared_decode_buffers ? layers : 1;
        std::vector<Layer> L;
        L.reserve(static_cast<size_t>(sets));
        for (int l = 0; l < sets; ++l) L.emplace_back(in, f);
        const double bytes_fused = static_cast<double>(fused_bytes(shape, ri.record_bytes));
        const double bytes_separate = static_cast<double>(compress_bytes(shape) + insert_bytes(shape, ri.record_bytes));
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
        std::optional<double> vllm;
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
          r.bytes = v == 0 ? bytes_fused : bytes_separate;
          r.GBps = r.bytes / (r.ms * 1e-3) / 1e9;
          r.copy_fraction = r.GBps / copy_GBps;
          r.vllm_ms = vllm;
          if (vllm) r.speedup = *vllm / r.ms;
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
    j["baseline_path"] = base ? nlohmann::json(base->path) : nlohmann::json(nullptr);
    j["baseline_copy_GBps"] = base ? nlohmann::json(base->copy_GBps) : nlohmann::json(nullptr);
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
    auto or_null = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    for (const Row& r : rows)
      j["rows"].push_back({{"workload", r.workload}, {"ratio", r.ratio}, {"record", r.record},
                           {"variant", r.variant}, {"tokens", r.tokens}, {"ms", r.ms},
                           {"us", r.ms * 1e3}, {"bytes", r.bytes}, {"GBps", r.GBps},
                           {"copy_fraction", r.copy_fraction}, {"vllm_ms", or_null(r.vllm_ms)},
                           {"speedup_vs_vllm", or_null(r.speedup)}, {"wrong", r.wrong}});
    j["total_wrong"] = total_wrong;
    std::printf("%s\n", j.dump(1).c_str());
  } else {
    fmt::print("device: {}\ncopy (D2D 2 GiB, read+write): {:.0f} GB/s{}\n", cuda_device_description(), copy_GBps,
               base ? fmt::format(" (baseline run: {:.0f} GB/s)", base->copy_GBps) : "");
    // the vLLM columns only with a baseline; "-" where it has no figure for the row
    auto vllm_cells = [&](const Row& r) {
      if (!base) return std::string();
      if (!r.vllm_ms) return fmt::format(" {:>10} {:>8}", "-", "-");
      return fmt::format(" {:>10.2f} {:>7.2f}x", *r.vllm_ms * 1e3, *r.speedup);
    };
    fmt::print("{:<12} {:>2} {:<10} {:<9} {:>7} {:>10} {:>12} {:>8} {:>6}{} {:>6}\n", "workload", "r", "record",
               "variant", "tokens", "time_us", "bytes", "GB/s", "copy%",
               base ? fmt::format(" {:>10} {:>8}", "vllm_us", "speedup") : "", "wrong");
    for (const Row& r : rows)
      fmt::print("{:<12} {:>2} {:<10} {:<9} {:>7} {:>10.2f} {:>12.0f} {:>8.0f} {:>5.1f}%{} {:>6}\n", r.workload,
                 r.ratio, r.record, r.variant, r.tokens, r.ms * 1e3, r.bytes, r.GBps, 100.0 * r.copy_fraction,
                 vllm_cells(r), r.wrong);
    fmt::print("decode rows: per layer, {} layers per CUDA graph replay ({}){}\n", kDecodeLayers,
               shared_decode_buffers ? "one buffer set shared by every layer" : "each layer its own buffers",
               base ? "; vllm = fused_ms + insert_ms of " + base->path : "");
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

}  // namespace dsv41kv::bench
