// `dsv41kv demo`: the main job. A built-in multi-step serving workload (several requests,
// chunked prefills starting at odd and even positions, decodes, a padded row, a null-block
// request) through one ratio-2 and one ratio-1 kv-source compressor layer with seeded
// weights: hidden (bf16) -> projection -> kv_score (fp32) -> metadata -> compress -> insert
// into every requested record format. Prints, per step, what was written, then cache bytes
// per token per format and the throughput on this machine. Every step also reads its records
// back (gather) and checks them against the latents it just wrote.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/metadata.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/projection.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rope.hpp"
#include "dsv41kv/rng.hpp"

#if defined(DSV41KV_WITH_CUDA)
#include <cuda_runtime.h>

#include <memory>

#include "dsv41kv/projection_cuda.hpp"
#endif

namespace dsv41kv::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct DemoOptions {
  bool json = false;
  uint64_t seed = 7;
  std::string ratio = "both";   // 1, 2 or both
  std::string format = "all";   // one record format or all
  std::string config_path;      // HF config.json (default: the published V4.1-Flash values)
  int threads = 0;
  std::string device = "cpu";   // cpu | cuda
};

#if defined(DSV41KV_WITH_CUDA)
// --device cuda: the same per-step pipeline on the GPU (cuBLAS projection, the CUDA metadata
// builders, compress, insert and the read-back gather on device views, one stream), per-step
// GPU time from CUDA events. The ring and the caches stay on the device for the whole run.
void cu(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(ErrorCode::kCuda, fmt::format("demo --device cuda: {}: {}", what, cudaGetErrorString(e)));
}
struct DevMem {
  void* p = nullptr;
  size_t n = 0;
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() {
    if (p) cudaFree(p);
  }
  void* ensure(size_t bytes) {
    if (p && bytes <= n) return p;
    if (p) cudaFree(p);
    p = nullptr;
    n = std::max<size_t>(bytes, 256);
    cu(cudaMalloc(&p, n), "cudaMalloc");
    return p;
  }
};
struct GpuLayer {
  DevMem weight, norm, rope, ring;
  std::vector<std::unique_ptr<DevMem>> caches;
  std::vector<CacheView> views;
};
struct Gpu {
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr, e2 = nullptr;
  std::unique_ptr<CublasProjection> proj;
  DevMem hidden, pos, qsl, t2r, bt, rbt, cslots, rslots, kv, latent, gslots, back;
  std::vector<std::unique_ptr<GpuLayer>> layers;
  Gpu() {
    cu(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    cu(cudaEventCreate(&e0), "cudaEventCreate");
    cu(cudaEventCreate(&e1), "cudaEventCreate");
    cu(cudaEventCreate(&e2), "cudaEventCreate");
    proj = std::make_unique<CublasProjection>();
  }
  ~Gpu() {
    cudaStreamSynchronize(s);
    proj.reset();
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
    cudaStreamDestroy(s);
  }
  void* up(DevMem& m, const void* h, size_t bytes) {
    void* d = m.ensure(bytes);
    if (bytes) cu(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync H2D");
    return d;
  }
  void down(void* h, const void* d, size_t bytes) {
    if (bytes) cu(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync D2H");
  }
  static TensorView dv(void* p, DType dt, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(p, dt, shape, Device::CUDA);
  }
};
#endif

// The hidden row of (request, position) is a pure function of the seed (splitmix64), so a
// token's kv_score is the same whichever step or batch computes it.

void fill_hidden_row(uint16_t* row, int64_t H, uint64_t seed, int64_t req, int64_t pos) {
  uint64_t s = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(req) * 0x100000001B3ull + static_cast<uint64_t>(pos)));
  for (int64_t k = 0; k < H; ++k) {
    s = splitmix64(s);
    // roughly N(0,1): sum of two uniforms, centred and scaled
    const double u = (static_cast<double>(s >> 40) + static_cast<double>((s >> 16) & 0xFFFFFF)) /
                     static_cast<double>(1 << 24);
    row[k] = num::bf16_encode(static_cast<float>((u - 1.0) * 2.45));
  }
}

// One kv-source compressor layer and its caches.
struct Layer {
  int ratio = 2;
  int64_t S = 32;                  // states per kernel page: 64 tokens / ratio (SPEC 3.6)
  int64_t pages_per_req = 0;
  int64_t num_pages = 0;
  CompressorWeights weights;
  RopeTable table;
  std::vector<float> ring;         // [num_req + 1 blocks, cap, 1024] (ratio 2)
  std::vector<std::vector<uint8_t>> caches;  // one backing per format
  std::vector<CacheView> views;
  // running totals
  int64_t latents = 0, ring_rows = 0, records = 0, check_failures = 0;
  double seconds_projection = 0, seconds_compress_insert = 0;
};

struct StepCounts {
  int64_t latents = 0, ring_rows = 0, records = 0;
};

int run_demo(const DemoOptions& o) {
  const bool on_gpu = o.device == "cuda";
  if (on_gpu && !cuda_device_available()) {
    std::fprintf(stderr, "dsv41kv: demo --device cuda: no usable GPU: %s (run without --device, or on a machine with "
                         "a CUDA device)\n", cuda_device_description().c_str());
    return 2;
  }
  const ModelConfig cfg = o.config_path.empty() ? deepseek_v41_flash() : load_model_config(o.config_path);
  std::vector<RecordFormat> formats;
  if (o.format == "all") {
    for (int i = 0; i < kNumRecordFormats; ++i) formats.push_back(static_cast<RecordFormat>(i));
  } else {
    formats.push_back(parse_record_format(o.format.c_str()));
  }
  std::vector<int> ratios;
  if (o.ratio == "both") ratios = {2, 1};
  else if (o.ratio == "2") ratios = {2};
  else if (o.ratio == "1") ratios = {1};
  else invalid_argument(fmt::format("--ratio: got '{}', expected 1, 2 or both", o.ratio));
  for (int r : ratios)
    if (!cfg.has_ratio(r))
      invalid_argument(fmt::format("--config {}: no layer has compress ratio {}", o.config_path, r));

  // The workload: 6 requests, prompts of 9..150 tokens starting at computed offsets 0..9 (odd
  // and even), a 64-token chunk budget (so prefills are chunked), 3 decode steps each, at most
  // 4 running at once. Request 1 is the null-block request; every batch has one padded row.
  pcp::WorkloadConfig wc;
  wc.seed = o.seed;
  wc.num_requests = 6;
  wc.prompt_min = 9;
  wc.prompt_max = 150;
  wc.start_min = 0;
  wc.start_max = 9;
  wc.decode_steps = 3;
  wc.chunk_budget = 64;
  wc.max_num_seqs = 4;
  wc.null_block_fraction = 0.0;
  pcp::Workload w = pcp::generate_workload(wc);
  w.requests[1].null_block = true;
  w.requests[1].ring_block = 0;
  const int64_t num_req = static_cast<int64_t>(w.requests.size());
  constexpr int64_t kPadRows = 1;
  const int64_t H = cfg.hidden_size;
  const int64_t cap = ring_capacity(0);
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  const ExecContext ctx{nullptr, o.threads};

  std::vector<Layer> layers;
  for (int r : ratios) {
    Layer L;
    L.ratio = r;
    L.S = 64 / r;
    const int64_t states = (w.max_position + 1) / r + 1;
    L.pages_per_req = (states + L.S - 1) / L.S;
    L.num_pages = 1 + num_req * L.pages_per_req;  // page 0 is the null page
    L.weights = CompressorWeights::from_seed(r, static_cast<int>(H), o.seed * 31 + static_cast<uint64_t>(r));
    L.table = rope_table_for_ratio(cfg, r, w.max_position + 1);
    if (r == 2) L.ring.assign(static_cast<size_t>((num_req + 1) * cap * kRingRowFloats), 0.0f);
    for (RecordFormat f : formats) {
      CacheView v = CacheView::with_default_strides(nullptr, f, L.num_pages, L.S);
      v.fp8_scale = 0.5f;
      L.caches.emplace_back(v.backing_bytes(), uint8_t{0});
      v.base = L.caches.back().data();
      L.views.push_back(v);
    }
    layers.push_back(std::move(L));
  }

#if defined(DSV41KV_WITH_CUDA)
  std::unique_ptr<Gpu> gpu;
  if (on_gpu) {
    gpu = std::make_unique<Gpu>();
    for (const Layer& L : layers) {
      auto GL = std::make_unique<GpuLayer>();
      const TensorView wv = L.weights.weight_view(), nv = L.weights.norm_view();
      if (!wv.is_contiguous() || !nv.is_contiguous()) invalid_argument("demo --device cuda: non-contiguous weights");
      gpu->up(GL->weight, wv.data, static_cast<size_t>(wv.numel()) * dtype_size(wv.dtype));
      gpu->up(GL->norm, nv.data, static_cast<size_t>(nv.numel()) * dtype_size(nv.dtype));
      gpu->up(GL->rope, L.table.data.data(), L.table.data.size() * sizeof(float));
      if (L.ratio == 2) gpu->up(GL->ring, L.ring.data(), L.ring.size() * sizeof(float));
      for (size_t fi = 0; fi < L.views.size(); ++fi) {
        auto m = std::make_unique<DevMem>();
        gpu->up(*m, L.caches[fi].data(), L.caches[fi].size());
        CacheView v = L.views[fi];
        v.base = m->p;
        v.device = Device::CUDA;
        GL->views.push_back(v);
        GL->caches.push_back(std::move(m));
      }
      gpu->layers.push_back(std::move(GL));
    }
    cu(cudaStreamSynchronize(gpu->s), "cudaStreamSynchronize");
  }
#endif

  nlohmann::json js;
  js["seed"] = o.seed;
  if (on_gpu) js["device"] = o.device;
  js["hidden_size"] = H;
  js["rms_norm_eps"] = cfg.rms_norm_eps;
  js["steps"] = nlohmann::json::array();
  if (!o.json) {
    fmt::print("dsv41kv demo: {} requests over {} steps (request 1 has the null block; one padded "
               "row per step), hidden {}, eps {:g}, formats:", num_req, w.steps.size(), H, cfg.rms_norm_eps);
    for (RecordFormat f : formats) fmt::print(" {}", record_info(f).name);
    fmt::print("\n{:>4} {:>4} {:>6} {:>7}", "step", "reqs", "tokens", "decodes");
    for (const Layer& L : layers)
      fmt::print("  | r{} latents ring_rows records{}", L.ratio, formats.size() > 1 ? "/format" : "");
    fmt::print("  | ms{}\n", on_gpu ? "  gpu ms" : "");
  }

  int64_t total_tokens = 0;
  for (size_t si = 0; si < w.steps.size(); ++si) {
    const auto& step = w.steps[si];
    const int64_t R = static_cast<int64_t>(step.size());
    std::vector<int32_t> qsl(static_cast<size_t>(R + 1), 0);
    for (int64_t j = 0; j < R; ++j) qsl[static_cast<size_t>(j + 1)] = qsl[static_cast<size_t>(j)] + static_cast<int32_t>(step[static_cast<size_t>(j)].req.query_len);
    const int64_t A = qsl.back();
    const int64_t N = A + kPadRows;
    total_tokens += A;
    std::vector<int64_t> positions(static_cast<size_t>(N), 0);
    std::vector<uint16_t> hidden(static_cast<size_t>(N * H), 0);
    int64_t decodes = 0;
    for (int64_t j = 0; j < R; ++j) {
      const auto& s = step[static_cast<size_t>(j)];
      if (!s.req.is_prefilling) ++decodes;
      for (int64_t i = 0; i < s.req.query_len; ++i) {
        const int64_t t = qsl[static_cast<size_t>(j)] + i;
        positions[static_cast<size_t>(t)] = s.req.num_computed + i;
        fill_hidden_row(&hidden[static_cast<size_t>(t * H)], H, o.seed, s.id, s.req.num_computed + i);
      }
    }
    for (int64_t t = A; t < N; ++t) fill_hidden_row(&hidden[static_cast<size_t>(t * H)], H, o.seed, -1, t);
    std::vector<int32_t> token_to_req(static_cast<size_t>(N), 0);
    build_token_to_req({TensorView::contiguous(qsl.data(), DType::I32, {R + 1}),
                        TensorView::contiguous(token_to_req.data(), DType::I32, {N})}, ctx);

    nlohmann::json jstep;
    jstep["step"] = si;
    jstep["requests"] = R;
    jstep["tokens"] = A;
    jstep["padded_rows"] = kPadRows;
    jstep["decodes"] = decodes;
    const auto t_step = Clock::now();
    double step_gpu_ms = 0;
    std::vector<StepCounts> counts;
    for (size_t li = 0; li < layers.size(); ++li) {
      Layer& L = layers[li];
      StepCounts c;
      const int r = L.ratio;
      // metadata: block tables (null-block request: ring block 0 and null pages)
      std::vector<int32_t> ring_bt(static_cast<size_t>(R), 0);
      std::vector<int32_t> bt(static_cast<size_t>(R * L.pages_per_req), 0);
      for (int64_t j = 0; j < R; ++j) {
        const int32_t id = step[static_cast<size_t>(j)].id;
        const auto& rq = w.requests[static_cast<size_t>(id)];
        ring_bt[static_cast<size_t>(j)] = rq.ring_block;
        if (!rq.null_block)
          for (int64_t p = 0; p < L.pages_per_req; ++p)
            bt[static_cast<size_t>(j * L.pages_per_req + p)] = static_cast<int32_t>(1 + id * L.pages_per_req + p);
      }
      std::vector<int64_t> cslots(static_cast<size_t>(N), -1), rslots(static_cast<size_t>(N), -1);
      std::vector<uint16_t> latent(static_cast<size_t>(N * kLatentDim), 0x7FC0);  // NaN: unwritten
#if defined(DSV41KV_WITH_CUDA)
      if (gpu) {
        Gpu& g = *gpu;
        GpuLayer& GL = *g.layers[li];
        const ExecContext dctx{g.s, 0};
        cu(cudaEventRecord(g.e0, g.s), "cudaEventRecord");
        void* dh = g.up(g.hidden, hidden.data(), hidden.size() * 2);
        void* dkv = g.kv.ensure(static_cast<size_t>(N * 512 * r) * sizeof(float));
        g.proj->project(Gpu::dv(dh, DType::BF16, {N, H}), Gpu::dv(GL.weight.p, DType::BF16, {512 * r, H}),
                        Gpu::dv(dkv, DType::F32, {N, 512 * r}), dctx);
        cu(cudaEventRecord(g.e1, g.s), "cudaEventRecord");
        void* dq = g.up(g.qsl, qsl.data(), qsl.size() * sizeof(int32_t));
        void* dpos = g.up(g.pos, positions.data(), positions.size() * sizeof(int64_t));
        void* dt2r = g.t2r.ensure(static_cast<size_t>(N) * sizeof(int32_t));
        build_token_to_req({Gpu::dv(dq, DType::I32, {R + 1}), Gpu::dv(dt2r, DType::I32, {N})}, dctx);
        const TensorView t2r_d = Gpu::dv(dt2r, DType::I32, {N}), pos_d = Gpu::dv(dpos, DType::I64, {N});
        void* dcs = g.up(g.cslots, cslots.data(), cslots.size() * sizeof(int64_t));
        void* drs = g.up(g.rslots, rslots.data(), rslots.size() * sizeof(int64_t));
        CompressedSlotArgs ca;
        ca.ratio = r;
        ca.token_to_req = t2r_d;
        ca.positions = pos_d;
        ca.block_table = Gpu::dv(g.up(g.bt, bt.data(), bt.size() * sizeof(int32_t)), DType::I32, {R, L.pages_per_req});
        ca.num_actual_tokens = A;
        ca.states_per_page = L.S;
        ca.slots = Gpu::dv(dcs, DType::I64, {N});
        ca.num_pages = L.num_pages;
        build_compressed_slots(ca, dctx);
        CompressArgs cargs;
        cargs.ratio = r;
        cargs.kv_score = Gpu::dv(dkv, DType::F32, {N, 512 * r});
        cargs.positions = pos_d;
        cargs.norm_weight = Gpu::dv(GL.norm.p, DType::BF16, {kLatentDim});
        cargs.eps = eps;
        void* dlat = g.up(g.latent, latent.data(), latent.size() * 2);
        cargs.latent_out = Gpu::dv(dlat, DType::BF16, {N, kLatentDim});
        if (r == 2) {
          RingSlotArgs ra;
          ra.token_to_req = t2r_d;
          ra.positions = pos_d;
          ra.ring_block_table = Gpu::dv(g.up(g.rbt, ring_bt.data(), ring_bt.size() * sizeof(int32_t)), DType::I32, {R, 1});
          ra.num_actual_tokens = A;
          ra.cap = cap;
          ra.ring_slots = Gpu::dv(drs, DType::I64, {N});
          ra.num_ring_blocks = num_req + 1;
          build_ring_slots(ra, dctx);
          cargs.slot_mapping = Gpu::dv(drs, DType::I64, {N});
          cargs.ring = Gpu::dv(GL.ring.p, DType::F32, {num_req + 1, cap, kRingRowFloats});
          cargs.qsl = Gpu::dv(dq, DType::I32, {R + 1});
          cargs.token_to_req = t2r_d;
        } else {
          cargs.slot_mapping = Gpu::dv(dcs, DType::I64, {N});
        }
        compress(cargs, dctx);
        for (size_t fi = 0; fi < GL.views.size(); ++fi) {
          InsertArgs ia;
          ia.ratio = r;
          ia.latent = cargs.latent_out;
          ia.positions = pos_d;
          ia.rope_table = Gpu::dv(GL.rope.p, DType::F32, {L.table.rows, kRopeTableWidth});
          ia.slots = Gpu::dv(dcs, DType::I64, {N});
          ia.cache = GL.views[fi];
          insert(ia, dctx);
        }
        cu(cudaEventRecord(g.e2, g.s), "cudaEventRecord");
        g.down(latent.data(), dlat, latent.size() * 2);
        g.down(cslots.data(), dcs, cslots.size() * sizeof(int64_t));
        g.down(rslots.data(), drs, rslots.size() * sizeof(int64_t));
        cu(cudaStreamSynchronize(g.s), "cudaStreamSynchronize");
        float ms_p = 0, ms_ci = 0;
        cu(cudaEventElapsedTime(&ms_p, g.e0, g.e1), "cudaEventElapsedTime");
        cu(cudaEventElapsedTime(&ms_ci, g.e1, g.e2), "cudaEventElapsedTime");
        L.seconds_projection += ms_p / 1000.0;
        L.seconds_compress_insert += ms_ci / 1000.0;
        step_gpu_ms += static_cast<double>(ms_p) + static_cast<double>(ms_ci);
      } else
#endif
      {
      // projection
      std::vector<float> kv(static_cast<size_t>(N * 512 * r));
      const auto t0 = Clock::now();
      project_kv_score(TensorView::contiguous(hidden.data(), DType::BF16, {N, H}), L.weights.weight_view(),
                       TensorView::contiguous(kv.data(), DType::F32, {N, 512 * r}), ctx);
      const auto t1 = Clock::now();
      auto t2r = TensorView::contiguous(token_to_req.data(), DType::I32, {N});
      auto posv = TensorView::contiguous(positions.data(), DType::I64, {N});
      CompressedSlotArgs ca;
      ca.ratio = r;
      ca.token_to_req = t2r;
      ca.positions = posv;
      ca.block_table = TensorView::contiguous(bt.data(), DType::I32, {R, L.pages_per_req});
      ca.num_actual_tokens = A;
      ca.states_per_page = L.S;
      ca.slots = TensorView::contiguous(cslots.data(), DType::I64, {N});
      ca.num_pages = L.num_pages;
      build_compressed_slots(ca, ctx);
      CompressArgs cargs;
      cargs.ratio = r;
      cargs.kv_score = TensorView::contiguous(kv.data(), DType::F32, {N, 512 * r});
      cargs.positions = posv;
      cargs.norm_weight = L.weights.norm_view();
      cargs.eps = eps;
      cargs.latent_out = TensorView::contiguous(latent.data(), DType::BF16, {N, kLatentDim});
      if (r == 2) {
        RingSlotArgs ra;
        ra.token_to_req = t2r;
        ra.positions = posv;
        ra.ring_block_table = TensorView::contiguous(ring_bt.data(), DType::I32, {R, 1});
        ra.num_actual_tokens = A;
        ra.cap = cap;
        ra.ring_slots = TensorView::contiguous(rslots.data(), DType::I64, {N});
        ra.num_ring_blocks = num_req + 1;
        build_ring_slots(ra, ctx);
        cargs.slot_mapping = TensorView::contiguous(rslots.data(), DType::I64, {N});
        cargs.ring = TensorView::contiguous(L.ring.data(), DType::F32, {num_req + 1, cap, kRingRowFloats});
        cargs.qsl = TensorView::contiguous(qsl.data(), DType::I32, {R + 1});
        cargs.token_to_req = t2r;
      } else {
        cargs.slot_mapping = TensorView::contiguous(cslots.data(), DType::I64, {N});
      }
      compress(cargs, ctx);
      for (size_t fi = 0; fi < L.views.size(); ++fi) {
        InsertArgs ia;
        ia.ratio = r;
        ia.latent = cargs.latent_out;
        ia.positions = posv;
        ia.rope_table = TensorView::contiguous(L.table.data.data(), DType::F32, {L.table.rows, kRopeTableWidth});
        ia.slots = TensorView::contiguous(cslots.data(), DType::I64, {N});
        ia.cache = L.views[fi];
        insert(ia, ctx);
      }
      const auto t3 = Clock::now();
      L.seconds_projection += std::chrono::duration<double>(t1 - t0).count();
      L.seconds_compress_insert += std::chrono::duration<double>(t3 - t1).count();
      }

      // What was written: latents (non-NaN rows), ring rows changed, records per format.
      for (int64_t t = 0; t < N; ++t)
        if (latent[static_cast<size_t>(t * kLatentDim)] != 0x7FC0 || latent[static_cast<size_t>(t * kLatentDim + 1)] != 0x7FC0) ++c.latents;
      if (r == 2) {
        // The tail store (SPEC 4.5): the last min(len, cap) rows of each chunk whose first
        // token has a ring slot, each row with slot >= 0.
        for (int64_t j = 0; j < R; ++j) {
          const int64_t s0 = qsl[static_cast<size_t>(j)], e = qsl[static_cast<size_t>(j + 1)];
          if (s0 >= e || rslots[static_cast<size_t>(s0)] < 0) continue;
          for (int64_t t = e - std::min(e - s0, cap); t < e; ++t) c.ring_rows += rslots[static_cast<size_t>(t)] >= 0;
        }
      }
      std::vector<int64_t> written;
      for (int64_t t = 0; t < N; ++t)
        if (cslots[static_cast<size_t>(t)] >= 0) written.push_back(t);
      c.records = static_cast<int64_t>(written.size());
      // Read every record back and compare with the latent (RoPE dims excepted, rotated):
      // NoPE dims must be within one quantization step of the format (relative 2^-3 for e4m3,
      // one scale step for NVFP4; plain bf16 exact).
      if (!written.empty()) {
        std::vector<int64_t> gslots;
        for (int64_t t : written) gslots.push_back(cslots[static_cast<size_t>(t)]);
        const int64_t M = static_cast<int64_t>(gslots.size());
        for (size_t fi = 0; fi < L.views.size(); ++fi) {
          std::vector<uint16_t> back(static_cast<size_t>(M * kLatentDim), 0);
#if defined(DSV41KV_WITH_CUDA)
          if (gpu) {
            Gpu& g = *gpu;
            void* dsl = g.up(g.gslots, gslots.data(), gslots.size() * sizeof(int64_t));
            void* dback = g.back.ensure(back.size() * 2);
            gather({g.layers[li]->views[fi], Gpu::dv(dsl, DType::I64, {M}), Gpu::dv(dback, DType::BF16, {M, kLatentDim})},
                   ExecContext{g.s, 0});
            g.down(back.data(), dback, back.size() * 2);
            cu(cudaStreamSynchronize(g.s), "cudaStreamSynchronize");
          } else
#endif
          gather({L.views[fi], TensorView::contiguous(gslots.data(), DType::I64, {M}),
                  TensorView::contiguous(back.data(), DType::BF16, {M, kLatentDim})}, ctx);
          const RecordFormat f = L.views[fi].format;
          for (int64_t m = 0; m < M; ++m) {
            const uint16_t* lat = &latent[static_cast<size_t>(written[static_cast<size_t>(m)] * kLatentDim)];
            float amax = 0;
            for (int d = 0; d < kNopeDim; ++d) amax = std::max(amax, std::fabs(num::bf16_decode(lat[d])));
            for (int d = 0; d < kNopeDim; ++d) {
              const float x = num::bf16_decode(lat[d]);
              const float y = num::bf16_decode(back[static_cast<size_t>(m * kLatentDim + d)]);
              float tol = 0;
              switch (f) {
                case RecordFormat::PLAIN_BF16: tol = 0; break;
                case RecordFormat::PLAIN_FP8: tol = std::fabs(x) * 0.0625f + 0.5f * 0.002f + 1e-6f; break;
                case RecordFormat::NVFP4_288: tol = amax / 6.0f * 2.5f + 1e-6f; break;
                default: tol = std::fabs(x) * 0.0625f + amax * 0.004f + 1e-6f; break;
              }
              if (!(std::fabs(x - y) <= tol)) {
                ++L.check_failures;
                break;
              }
            }
          }
        }
      }
      L.latents += c.latents;
      L.ring_rows += c.ring_rows;
      L.records += c.records * static_cast<int64_t>(L.views.size());
      nlohmann::json jl;
      jl["ratio"] = r;
      jl["latents"] = c.latents;
      jl["ring_rows_written"] = c.ring_rows;
      jl["records_per_format"] = c.records;
      jstep["layers"].push_back(jl);
      counts.push_back(c);
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t_step).count();
    jstep["ms"] = ms;
    if (on_gpu) jstep["gpu_ms"] = step_gpu_ms;
    js["steps"].push_back(jstep);
    if (!o.json) {
      fmt::print("{:>4} {:>4} {:>3}+{:<2} {:>7}", si, R, A, kPadRows, decodes);
      for (size_t li = 0; li < layers.size(); ++li)
        fmt::print("  | r{} {:>7} {:>9} {:>7}{}", layers[li].ratio, counts[li].latents, counts[li].ring_rows,
                   counts[li].records, formats.size() > 1 ? "        " : "");
      fmt::print("  | {:.1f}{}\n", ms, on_gpu ? fmt::format("  {:>6.3f}", step_gpu_ms) : "");
    }
  }

  // Cache bytes per token per format (the record alone, and with page padding).
  nlohmann::json jsum = nlohmann::json::array();
  if (!o.json) fmt::print("\ncache bytes per token (record / with page padding at the default page stride):\n");
  for (const Layer& L : layers) {
    if (!o.json) fmt::print("  ratio {} ({} states per page):", L.ratio, L.S);
    for (const CacheView& v : L.views) {
      const RecordInfo& ri = record_info(v.format);
      const double rec = static_cast<double>(ri.record_bytes) / L.ratio;
      const double paged = static_cast<double>(v.page_stride * static_cast<int64_t>(dtype_size(ri.element))) /
                           static_cast<double>(L.S * L.ratio);
      if (!o.json) fmt::print("  {} {:g}/{:.1f}", ri.name, rec, paged);
      jsum.push_back({{"ratio", L.ratio}, {"format", ri.name}, {"bytes_per_token", rec},
                      {"bytes_per_token_paged", paged}});
    }
    if (!o.json) fmt::print("\n");
  }
  nlohmann::json jlayers = nlohmann::json::array();
  int64_t failures = 0;
  for (const Layer& L : layers) {
    failures += L.check_failures;
    const double tps_proj = static_cast<double>(total_tokens) / L.seconds_projection;
    const double tps_ci = static_cast<double>(total_tokens) / L.seconds_compress_insert;
    if (!o.json)
      fmt::print("ratio {}: {} latents, {} ring rows, {} records written; projection {:.0f} tokens/s, "
                 "compress+insert ({} formats) {:.0f} tokens/s; read-back check: {} bad records\n",
                 L.ratio, L.latents, L.ring_rows, L.records, tps_proj, L.views.size(), tps_ci, L.check_failures);
    jlayers.push_back({{"ratio", L.ratio}, {"latents", L.latents}, {"ring_rows_written", L.ring_rows},
                       {"records", L.records}, {"projection_tokens_per_s", tps_proj},
                       {"compress_insert_tokens_per_s", tps_ci}, {"readback_bad_records", L.check_failures}});
  }
  js["bytes_per_token"] = jsum;
  js["layers"] = jlayers;
  js["tokens"] = total_tokens;
  if (o.json) fmt::print("{}\n", js.dump(2));
  return failures == 0 ? 0 : 1;
}

}  // namespace

void add_demo(CLI::App& app, int& exit_code) {
  static DemoOptions o;
  auto* cmd = app.add_subcommand("demo", "built-in multi-step workload through a ratio-2 and a ratio-1 compressor layer");
  cmd->add_flag("--json", o.json, "machine-readable output");
  cmd->add_option("--seed", o.seed, "seed of the workload, hidden states and weights")->check(unsigned64());
  cmd->add_option("--ratio", o.ratio, "1, 2 or both")->check(CLI::IsMember({"1", "2", "both"}));
  cmd->add_option("--format", o.format, "v4_584, mxfp8_528, nvfp4_288, bf16, fp8 or all");
  cmd->add_option("--config", o.config_path, "Hugging Face config.json (default: DeepSeek-V4.1-Flash)");
  cmd->add_option("--threads", o.threads, "CPU threads (0: all)")->check(CLI::Range(0, 4096));
  cmd->add_option("--device", o.device, "cpu | cuda: where the pipeline runs (cuda: cuBLAS projection, CUDA kernels, "
                                        "per-step GPU time; exit 2 without a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([&exit_code] { exit_code = run_demo(o); });
}

}  // namespace dsv41kv::cli
