// A model's attention layers on the GPU, and optionally the same layers on the CPU, run by hand
// step by step (the test drives what a ModelRunner drives: the allocator, the step's metadata,
// each layer's activations), so that a test can compare the two backends layer by layer, capture a
// step's launches in a CUDA graph, or write a long prefix without attending it. The activations of
// each layer live in device buffers of exactly N rows (compute-sanitizer's memcheck then sees any
// read past the batch's rows).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsv41kv/allocator.hpp"
#include "dsv41kv/attention_layer.hpp"
#include "dsv41kv/model_runner.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/read_path_check.hpp"
#include "dsv41kv/rng.hpp"
#include "dsv41kv/rope.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {

// One device allocation of exactly `bytes` (nullptr for 0), freed on destruction.
class DevMem {
 public:
  DevMem() = default;
  explicit DevMem(size_t bytes) : n_(bytes) {
    if (bytes && cudaMalloc(&p_, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  DevMem(DevMem&& o) noexcept { *this = std::move(o); }
  DevMem& operator=(DevMem&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DevMem() {
    if (p_) cudaFree(p_);
  }
  void* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// The bytes of a contiguous view (host or device) on the host; waits for the stream.
inline std::vector<uint8_t> bytes_of(const TensorView& v, cudaStream_t s) {
  std::vector<uint8_t> b(static_cast<size_t>(v.numel()) * dtype_size(v.dtype));
  if (cudaStreamSynchronize(s) != cudaSuccess) throw std::runtime_error("cudaStreamSynchronize");
  download_view(v, b.data(), ExecContext{s});
  return b;
}
inline std::vector<uint8_t> bytes_of(const void* base, size_t n, Device d, cudaStream_t s) {
  return bytes_of(TensorView::contiguous(const_cast<void*>(base), DType::U8, {static_cast<int64_t>(n)}, d), s);
}

// The layers of one device with their shared buffers and the step's metadata.
struct StackSide {
  pipeline::ServingConfig sc;
  std::unique_ptr<pipeline::LayerShared> shared;
  std::vector<std::unique_ptr<pipeline::AttentionLayer>> layers;
  std::unique_ptr<pipeline::StepMetadata> meta;

  StackSide(const pipeline::ServingConfig& s, const pipeline::ReadPathConfig& rc, const ModelConfig& m,
            const RopeTable& plain, const RopeTable& yarn, uint64_t weight_seed)
      : sc(s) {
    shared = std::make_unique<pipeline::LayerShared>(sc, rc, m);
    for (int L = 0; L < m.num_layers(); ++L)
      layers.push_back(std::make_unique<pipeline::AttentionLayer>(
          sc, rc, m, L, pipeline::LayerWeights::from_seed(m.layer(L), rc.num_heads, weight_seed),
          m.layer(L).ratio > 0 ? yarn : plain, *shared));
    meta = std::make_unique<pipeline::StepMetadata>(sc);
  }
};

// Per layer: the host rows the activation source fills and their exact-size device copies.
struct LayerActs {
  std::vector<uint16_t> q, kv, iq, wr;
  std::vector<float> ks;
  DevMem dq, dkv, dks, diq, dwr;
  pipeline::LayerInputs host, dev;
};

class ReadStack {
 public:
  // `sc` is the CPU configuration; the GPU side gets the same on CUDA with `stream`.
  ReadStack(const ModelConfig& m, const pipeline::ServingConfig& sc, const pipeline::ReadPathConfig& rc,
            cudaStream_t stream, bool with_cpu, int64_t rope_rows, uint64_t act_seed = 11)
      : model_(m), rc_(rc), stream_(stream), alloc_(pipeline::allocator_config(sc)), act_(act_seed) {
    const RopeTable plain = rope_table_for_ratio(m, 0, rope_rows);
    RopeTable yarn;
    if (m.any_compressed()) yarn = rope_table_for_ratio(m, 1, rope_rows);
    pipeline::ServingConfig g = sc;
    g.device = Device::CUDA;
    g.exec.stream = stream;
    gpu_ = std::make_unique<StackSide>(g, rc, m, plain, yarn, 3);
    if (with_cpu) cpu_ = std::make_unique<StackSide>(sc, rc, m, plain, yarn, 3);
    acts_.resize(static_cast<size_t>(m.num_layers()));
  }

  StackSide& gpu() { return *gpu_; }
  StackSide* cpu() { return cpu_.get(); }
  const ModelConfig& model() const { return model_; }
  const std::vector<pipeline::TokenId>& tokens() const { return tokens_; }
  int64_t num_computed(int64_t id) { return computed_[id]; }

  // A new request; `null_blocks`: no pages and no ring block (as ModelRunner::add_request).
  void add(int64_t id, bool null_blocks = false) {
    if (!null_blocks) alloc_.add(id);
    computed_[id] = 0;
    null_[id] = null_blocks;
  }

  // The step's batch (pages taken for its positions), its metadata on both sides, and every
  // layer's activations (filled by the seeded source, or `fixed` rows when given: then row t of
  // every input is row t % fixed_rows of a fixed pool, for long prefixes that only need writes).
  void prepare(const pipeline::EngineStep& st) {
    pipeline::StepBatch b;
    b.padding_rows = st.padding_rows;
    tokens_.clear();
    for (const pipeline::RequestStep& r : st.requests) {
      const int64_t nc = computed_[r.id];
      pipeline::StepRequest q;
      if (null_[r.id]) {
        q.query_len = r.query_len;
        q.num_computed = nc;
      } else {
        q = alloc_.prepare(r.id, nc, r.query_len);
      }
      b.requests.push_back(std::move(q));
      for (int64_t i = 0; i < r.query_len; ++i) tokens_.push_back({r.id, nc + i});
    }
    gpu_->meta->build(b);
    if (cpu_) cpu_->meta->build(b);
    N_ = b.num_rows();
    for (int L = 0; L < model_.num_layers(); ++L) fill(L);
    for (const pipeline::RequestStep& r : st.requests) computed_[r.id] += r.query_len;
  }
  int64_t rows() const { return N_; }

  void run_gpu(int L, bool writes_only = false) {
    auto& l = *gpu_->layers[static_cast<size_t>(L)];
    if (writes_only) l.run_writes(*gpu_->meta, acts_[static_cast<size_t>(L)].dev);
    else l.run(*gpu_->meta, acts_[static_cast<size_t>(L)].dev);
  }
  void run_cpu(int L) { cpu_->layers[static_cast<size_t>(L)]->run(*cpu_->meta, acts_[static_cast<size_t>(L)].host); }

  // Fill the activations from a fixed random pool instead of the seeded source (set before prepare()).
  void use_fixed_pool(uint64_t seed) { fixed_ = true, fixed_seed_ = seed; }

 private:
  template <class T>
  static void upload_exact(const std::vector<T>& h, DevMem& d, cudaStream_t s) {
    d = DevMem(h.size() * sizeof(T));
    if (!h.empty() &&
        cudaMemcpyAsync(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s) != cudaSuccess)
      throw std::runtime_error("cudaMemcpyAsync");
    if (cudaStreamSynchronize(s) != cudaSuccess) throw std::runtime_error("cudaStreamSynchronize");
  }

  void fill(int L) {
    const LayerInfo& li = model_.layer(L);
    LayerActs& a = acts_[static_cast<size_t>(L)];
    const int64_t N = N_, H = rc_.num_heads;
    a.q.assign(static_cast<size_t>(N * H * kLatentDim), 0);
    a.kv.assign(static_cast<size_t>(N * kLatentDim), 0);
    a.ks.assign(li.is_kv_source ? static_cast<size_t>(N * 512 * li.ratio) : 0, 0.0f);
    a.iq.assign(li.is_index_source ? static_cast<size_t>(N * kIndexHeads * kIndexHeadDim) : 0, 0);
    a.wr.assign(li.is_index_source ? static_cast<size_t>(N * kIndexHeads) : 0, 0);
    pipeline::LayerInputs& h = a.host;
    h = {};
    h.q = TensorView::contiguous(a.q.data(), DType::BF16, {N, H, kLatentDim});
    h.kv = TensorView::contiguous(a.kv.data(), DType::BF16, {N, kLatentDim});
    if (li.is_kv_source) h.kv_score = TensorView::contiguous(a.ks.data(), DType::F32, {N, int64_t{512} * li.ratio});
    if (li.is_index_source) {
      h.index_q = TensorView::contiguous(a.iq.data(), DType::BF16, {N, kIndexHeads, kIndexHeadDim});
      h.w_raw = TensorView::contiguous(a.wr.data(), DType::BF16, {N, kIndexHeads});
    }
    if (fixed_) {
      fill_fixed(L, a);
    } else {
      act_.fill(li, tokens_, N, h);
    }
    upload_exact(a.q, a.dq, stream_);
    upload_exact(a.kv, a.dkv, stream_);
    upload_exact(a.ks, a.dks, stream_);
    upload_exact(a.iq, a.diq, stream_);
    upload_exact(a.wr, a.dwr, stream_);
    pipeline::LayerInputs& d = a.dev;
    d = {};
    d.q = TensorView::contiguous(a.dq.get(), DType::BF16, {N, H, kLatentDim}, Device::CUDA);
    d.kv = TensorView::contiguous(a.dkv.get(), DType::BF16, {N, kLatentDim}, Device::CUDA);
    if (li.is_kv_source)
      d.kv_score = TensorView::contiguous(a.dks.get(), DType::F32, {N, int64_t{512} * li.ratio}, Device::CUDA);
    if (li.is_index_source) {
      d.index_q = TensorView::contiguous(a.diq.get(), DType::BF16, {N, kIndexHeads, kIndexHeadDim}, Device::CUDA);
      d.w_raw = TensorView::contiguous(a.dwr.get(), DType::BF16, {N, kIndexHeads}, Device::CUDA);
    }
  }

  // Values from a fixed random pool (the prefix's content does not matter, only its writes): cheap
  // for hundreds of thousands of rows.
  void fill_fixed(int L, LayerActs& a) {
    Rng r(fixed_seed_ ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(L + 1)));
    std::vector<uint16_t> pool(size_t{1} << 20);
    for (auto& x : pool) x = num::bf16_encode(static_cast<float>(r.uniform(-1.0, 1.0)));
    std::vector<float> fpool(size_t{1} << 20);
    for (auto& x : fpool) x = static_cast<float>(r.uniform(-2.0, 2.0));
    const auto spread = [](auto& v, const auto& p, size_t salt) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = p[(i + salt) % p.size()];
    };
    spread(a.q, pool, 0);
    spread(a.kv, pool, 12345);
    spread(a.iq, pool, 777);
    spread(a.wr, pool, 4242);
    spread(a.ks, fpool, 0);
    const int64_t N = N_;  // padding rows zero, as the seeded source leaves them
    const int64_t A = static_cast<int64_t>(tokens_.size());
    const auto zero_pad = [&](auto& v) {
      const size_t w = v.size() / static_cast<size_t>(std::max<int64_t>(N, 1));
      std::fill(v.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(A) * w), v.end(), 0);
    };
    zero_pad(a.q);
    zero_pad(a.kv);
    zero_pad(a.iq);
    zero_pad(a.wr);
    zero_pad(a.ks);
  }

  ModelConfig model_;
  pipeline::ReadPathConfig rc_;
  cudaStream_t stream_;
  pipeline::CacheAllocator alloc_;
  oracles::SeededActivations act_;
  std::unique_ptr<StackSide> gpu_, cpu_;
  std::vector<LayerActs> acts_;
  std::map<int64_t, int64_t> computed_;
  std::map<int64_t, bool> null_;
  std::vector<pipeline::TokenId> tokens_;
  int64_t N_ = 0;
  bool fixed_ = false;
  uint64_t fixed_seed_ = 0;
};

}  // namespace dsv41kv::test
