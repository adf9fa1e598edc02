// The demo's workload (pcp::demo_workload) through the pipeline on one device, with canary-filled
// state (SPEC 10.2) and the test's own page layout (shuffled distinct pages per request), and
// after every step the checks of what was written against expectations built from the workload,
// the seeded weights and the hidden rows alone, never from the pipeline's metadata:
//   - kv_score: the CPU projection of the step's hidden rows, bit for bit on both devices (the
//     weights and hidden values make every accumulation order exact); these rows are the truth
//     downstream;
//   - ring (ratio 2): the canary everywhere but the last min(len, cap) rows of each chunk of a
//     request with a ring block, each holding its token's kv_score row;
//   - latents: each closing token of a request with a ring block and pages holds compress_row of
//     its predecessor position's kv_score row (the ring's canary row before the request's first
//     position) and its own; every other row keeps the audit's mark;
//   - caches: the canary everywhere but the record of each such token at the slot of its state,
//     and each record read back by gather holds the latent (dims 0..447) and its RoPE rotation
//     (448..511) by pipeline::reads_back;
//   - WriteAudit's counts equal workload_facts, with no bad record.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "formats/compress_math.hpp"
#include "dsv41kv/buffer.hpp"
#include "dsv41kv/cache.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/pipeline.hpp"
#include "dsv41kv/projection.hpp"
#include "dsv41kv/rope.hpp"
#include "support/workload_facts.hpp"
#include "support/batch.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {

inline constexpr float kRingCanary = 3.0f;

class PipelineRun {
 public:
  struct LayerUnderTest {
    int ratio = 2;
    int64_t S = 0;
    CompressorWeights weights;
    RopeTable table;
    std::unique_ptr<pipeline::KvSourceLayer> layer;
    std::unique_ptr<pipeline::WriteAudit> audit;
    std::vector<std::vector<int32_t>> pages;  // per workload request: its block-table row
    std::map<std::pair<int32_t, int64_t>, std::vector<float>> kv;  // (request, position) -> kv_score row
    std::vector<float> ring;                    // expected ring backing
    std::vector<std::vector<uint8_t>> caches;   // expected cache backings
    std::vector<pipeline::StepWrites> writes;   // the audit's report of every step
  };

  static constexpr int64_t kPadRows = 2;
  static constexpr int64_t kHidden = 256;
  static constexpr float kEps = 1e-6f;

  PipelineRun(Device device, const std::vector<int>& ratios, const std::vector<RecordFormat>& formats, uint64_t seed)
      : device_(device), seed_(seed), w_(pcp::demo_workload(seed)) {
    int64_t max_step = 0;
    for (const auto& st : w_.steps) {
      int64_t n = 0;
      for (const auto& s : st) n += s.req.query_len;
      max_step = std::max(max_step, n);
    }
    sc_.device = device;
    sc_.exec.num_threads = 2;
    sc_.max_tokens = max_step + kPadRows;
    sc_.max_requests = w_.config.max_num_seqs;
    sc_.ring_blocks = static_cast<int64_t>(w_.requests.size()) + 1;
    sc_.formats = formats;
    sc_.fp8_scale = 0.5f;
    for (int r : ratios) {
      LayerUnderTest L;
      L.ratio = r;
      L.S = 64 / r;
      // the test's page layout: every page once, shuffled, none for the null-block request
      Rng rng(seed ^ (0x9A6E5ull * static_cast<uint64_t>(r)));
      std::vector<int64_t> need;
      int64_t total = 0, width = 1;
      for (const auto& q : w_.requests) {
        // a null-block request gets no pages, but its block-table row (all null) must still be
        // as wide as its positions reach (a logical page beyond the row is an E8)
        const int64_t last = q.start + q.prompt_len + q.decode_steps - 1;
        const int64_t pages = group_state(last, r) / L.S + 1;
        need.push_back(q.null_block ? 0 : pages);
        total += need.back();
        width = std::max(width, pages);
      }
      std::vector<int32_t> ids(static_cast<size_t>(total));
      for (int64_t i = 0; i < total; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i + 1);
      rng.shuffle(ids);
      auto next = ids.begin();
      for (int64_t n : need) {
        L.pages.emplace_back(next, next + n);
        next += n;
      }
      (r == 1 ? sc_.c1a : sc_.c2a) = {L.S, total + 1, width};
      // Weights k/64 (|k| <= 32) and hidden values in -3..3 (batch()): every product and partial
      // sum of the projection is a multiple of 2^-6 below 2^10, exact in fp32 whatever the
      // accumulation order, so the cuBLAS projection equals the CPU's bit for bit and so does
      // everything after it.
      L.weights = CompressorWeights::from_seed(r, static_cast<int>(kHidden), seed + static_cast<uint64_t>(r));
      for (uint16_t& v : L.weights.fused_wkv_wgate)
        v = num::bf16_encode(static_cast<float>(rng.integer(-32, 32)) / 64.0f);
      L.table = rope_table_for_ratio(deepseek_v41_flash(), r, w_.max_position + 1);
      layers_.push_back(std::move(L));
    }
    for (LayerUnderTest& L : layers_) {
      L.layer = std::make_unique<pipeline::KvSourceLayer>(sc_, L.weights, L.table, kEps);
      if (L.ratio == 2) {
        L.layer->ring().fill_with(kRingCanary, sc_.exec);
        L.ring.assign(L.layer->ring().size() / sizeof(float), kRingCanary);
      }
      for (size_t i = 0; i < L.layer->num_caches(); ++i) {
        Buffer& b = L.layer->cache_buffer(i);
        std::vector<uint8_t> expected(b.size(), kByteCanary);
        if (L.layer->cache(i).format == RecordFormat::PLAIN_BF16) {
          b.fill_with(kBf16Canary, sc_.exec);
          for (size_t o = 0; o + 1 < expected.size(); o += 2) std::memcpy(&expected[o], &kBf16Canary, 2);
        } else {
          b.fill(kByteCanary, 0, SIZE_MAX, sc_.exec);
        }
        L.caches.push_back(std::move(expected));
      }
      L.audit = std::make_unique<pipeline::WriteAudit>(*L.layer);
    }
    meta_ = std::make_unique<pipeline::StepMetadata>(sc_);
    hidden_ = Buffer(device, static_cast<size_t>(sc_.max_tokens * kHidden) * sizeof(uint16_t));
  }

  const pcp::Workload& workload() const { return w_; }
  const pipeline::ServingConfig& config() const { return sc_; }
  std::vector<LayerUnderTest>& layers() { return layers_; }
  pipeline::StepMetadata& metadata() { return *meta_; }

  // The engine's side of step `si`: the batch in the test's page layout and its hidden rows.
  pipeline::StepBatch batch(size_t si) {
    pipeline::StepBatch b;
    b.padding_rows = kPadRows;
    tokens_.clear();
    ids_.clear();
    for (const pcp::ScheduledRequest& s : w_.steps.at(si)) {
      pipeline::StepRequest q;
      q.query_len = s.req.query_len;
      q.num_computed = s.req.num_computed;
      q.ring_block = w_.requests[static_cast<size_t>(s.id)].ring_block;
      for (const LayerUnderTest& L : layers_)
        (L.ratio == 1 ? q.c1a_pages : q.c2a_pages) = L.pages[static_cast<size_t>(s.id)];
      b.requests.push_back(std::move(q));
      ids_.push_back(s.id);
      for (int64_t p = s.req.num_computed; p < s.req.num_computed + s.req.query_len; ++p) tokens_.push_back({s.id, p});
    }
    const int64_t N = b.num_rows();
    hidden_host_.assign(static_cast<size_t>(N * kHidden), 0);
    for (int64_t t = 0; t < N; ++t) {
      const bool real = t < static_cast<int64_t>(tokens_.size());
      Rng rng(splitmix64(seed_ ^ splitmix64(real ? static_cast<uint64_t>(tokens_[static_cast<size_t>(t)].first) : ~0ull) ^
                         static_cast<uint64_t>(real ? tokens_[static_cast<size_t>(t)].second : t)));
      for (int64_t k = 0; k < kHidden; ++k)
        hidden_host_[static_cast<size_t>(t * kHidden + k)] = num::bf16_encode(static_cast<float>(rng.integer(-3, 3)));
    }
    hidden_.upload(hidden_host_, 0, sc_.exec);
    return b;
  }

  // Runs step `si` through the pipeline, every layer on one StepMetadata, each audit marking its
  // layer's latent rows first.
  pipeline::StepBatch run_step(size_t si) {
    pipeline::StepBatch b = batch(si);
    for (LayerUnderTest& L : layers_) L.audit->before_step();
    meta_->build(b);
    for (LayerUnderTest& L : layers_) L.layer->run(*meta_, hidden_.view(DType::BF16, {b.num_rows(), kHidden}));
    return b;
  }

  void run_and_check(size_t si) {
    const pipeline::StepBatch b = run_step(si);
    for (LayerUnderTest& L : layers_) check(L, b, si);
  }

  void run_all() {
    for (size_t si = 0; si < w_.steps.size(); ++si) {
      SCOPED_TRACE("step " + std::to_string(si));
      run_and_check(si);
      if (::testing::Test::HasFailure()) return;
    }
  }

 private:
  bool null_block(int32_t id) const { return w_.requests[static_cast<size_t>(id)].null_block; }

  void check(LayerUnderTest& L, const pipeline::StepBatch& b, size_t si) {
    SCOPED_TRACE("ratio " + std::to_string(L.ratio));
    const int r = L.ratio;
    const int64_t N = b.num_rows(), width = int64_t{512} * r, cap = sc_.ring_capacity();
    const ExecContext& ctx = sc_.exec;

    // kv_score
    std::vector<float> kv, cpu(static_cast<size_t>(N * width));
    L.layer->kv_score().download(kv, static_cast<size_t>(N * width), ctx);
    project_kv_score(TensorView::contiguous(hidden_host_.data(), DType::BF16, {N, kHidden}), L.weights.weight_view(),
                     TensorView::contiguous(cpu.data(), DType::F32, {N, width}));
    EXPECT_TRUE(bits_equal(cpu, kv, "kv_score"));
    for (size_t t = 0; t < tokens_.size(); ++t)
      L.kv[tokens_[t]].assign(kv.begin() + static_cast<std::ptrdiff_t>(t * width),
                              kv.begin() + static_cast<std::ptrdiff_t>((t + 1) * width));

    // ring: the tail of every chunk with a ring block
    if (r == 2) {
      for (size_t j = 0; j < b.requests.size(); ++j) {
        const pipeline::StepRequest& q = b.requests[j];
        if (q.ring_block <= 0) continue;
        const int64_t end = q.num_computed + q.query_len;
        for (int64_t p = end - std::min(q.query_len, cap); p < end; ++p) {
          const std::vector<float>& row = L.kv.at({ids_[j], p});
          std::copy(row.begin(), row.begin() + kRingRowFloats,
                    L.ring.begin() + static_cast<std::ptrdiff_t>((q.ring_block * cap + p % cap) * kRingRowFloats));
        }
      }
      std::vector<float> ring;
      L.layer->ring().download(ring, L.ring.size(), ctx);
      EXPECT_TRUE(bits_equal(L.ring, ring, "ring"));
    }

    // latents and records
    std::vector<uint16_t> latent;
    L.layer->latent().download(latent, static_cast<size_t>(N * kLatentDim), ctx);
    const std::vector<float> canary_row(kRingRowFloats, kRingCanary);
    std::vector<float> scratch(kLatentDim);
    std::vector<uint16_t> want(kLatentDim);
    std::vector<int64_t> slots(static_cast<size_t>(N), -1);
    std::vector<std::vector<uint16_t>> expected_latent(static_cast<size_t>(N));
    int64_t bad_rows = 0;
    std::string first_bad;
    for (int64_t t = 0; t < N; ++t) {
      const uint16_t* got = latent.data() + t * kLatentDim;
      const bool real = t < static_cast<int64_t>(tokens_.size());
      const auto [id, p] = real ? tokens_[static_cast<size_t>(t)] : std::pair<int32_t, int64_t>{-1, 0};
      if (!real || null_block(id) || !closes_group(p, r)) {
        const bool marked = std::all_of(got, got + kLatentDim, [](uint16_t v) { return v == 0xFFFF; });
        if (!marked && first_bad.empty()) first_bad = fmt::format("row {} written (position {})", t, p);
        bad_rows += marked ? 0 : 1;
        continue;
      }
      const float* pred = nullptr;
      if (r == 2) pred = L.kv.count({id, p - 1}) ? L.kv.at({id, p - 1}).data() : canary_row.data();
      cmath::compress_row(pred, L.kv.at({id, p}).data(), L.weights.norm_weight.data(), kEps, scratch.data(),
                          want.data());
      if (!std::equal(want.begin(), want.end(), got)) {
        if (first_bad.empty()) first_bad = fmt::format("row {} (request {} position {}) differs", t, id, p);
        ++bad_rows;
      }
      const int64_t s = group_state(p, r);
      slots[static_cast<size_t>(t)] = L.pages[static_cast<size_t>(id)].at(static_cast<size_t>(s / L.S)) * L.S + s % L.S;
      expected_latent[static_cast<size_t>(t)] = want;
      for (size_t i = 0; i < L.caches.size(); ++i) {
        const CacheView& cv = L.layer->cache(i);
        write_expected(L.caches[i].data(), cv.format, cv.states_per_page, cv.page_stride, cv.row_stride, cv.fp8_scale,
                       slots[static_cast<size_t>(t)], want.data(), L.table.data.data(), rope_row(p, r));
      }
    }
    EXPECT_EQ(bad_rows, 0) << "latent rows: first " << first_bad;
    check_records(L, slots, expected_latent, si);

    // the audit's counts against the workload's
    const pipeline::StepWrites writes = L.audit->after_step(*meta_);
    const WorkloadFacts facts = workload_facts(w_, si, r, cap);
    EXPECT_EQ(writes.latents, facts.latents);
    EXPECT_EQ(writes.ring_rows, facts.ring_rows);
    EXPECT_EQ(writes.records, facts.records);
    EXPECT_EQ(writes.bad_records(), 0);
    L.writes.push_back(writes);
  }

  // Every cache byte against the expected backing; every written record read back through gather.
  void check_records(LayerUnderTest& L, const std::vector<int64_t>& slots,
                     const std::vector<std::vector<uint16_t>>& latent, size_t si) {
    const ExecContext& ctx = sc_.exec;
    const int64_t N = static_cast<int64_t>(slots.size());
    Buffer slot_buf(device_, slots.size() * sizeof(int64_t)), out(device_, slots.size() * kLatentDim * sizeof(uint16_t));
    slot_buf.upload(slots, 0, ctx);
    for (size_t i = 0; i < L.caches.size(); ++i) {
      const CacheView& cv = L.layer->cache(i);
      const RecordInfo& ri = record_info(cv.format);
      std::vector<uint8_t> got;
      L.layer->cache_buffer(i).download(got, L.caches[i].size(), ctx);
      EXPECT_TRUE(bytes_equal(L.caches[i].data(), got.data(), got.size(), std::string("cache ") + ri.name));
      gather({cv, slot_buf.view(DType::I64, {N}), out.view(DType::BF16, {N, kLatentDim})}, ctx);
      std::vector<uint16_t> back;
      out.download(back, static_cast<size_t>(N * kLatentDim), ctx);
      int64_t bad = 0;
      for (int64_t t = 0; t < N; ++t) {
        const int64_t slot = slots[static_cast<size_t>(t)];
        if (slot < 0) continue;
        float x[kLatentDim], y[kLatentDim];
        rope_xy(latent[static_cast<size_t>(t)].data(), L.table.data.data(),
                rope_row(tokens_[static_cast<size_t>(t)].second, L.ratio), x, y);
        const int64_t page = slot / cv.states_per_page, r = slot % cv.states_per_page;
        const uint8_t* base =
            got.data() + static_cast<size_t>(page * cv.page_stride + (ri.packed ? 0 : r * cv.row_stride)) *
                             dtype_size(ri.element);
        for (int d = 0; d < kLatentDim; ++d)
          if (!pipeline::reads_back(cv.format, base, cv.states_per_page, r, d, cv.fp8_scale,
                                    back[static_cast<size_t>(t * kLatentDim + d)], d < kNopeDim ? x[d] : y[d])) {
            ++bad;
            break;
          }
      }
      EXPECT_EQ(bad, 0) << ri.name << ": records that do not read back, step " << si;
    }
  }

  Device device_;
  uint64_t seed_;
  pcp::Workload w_;
  pipeline::ServingConfig sc_;
  std::vector<LayerUnderTest> layers_;
  std::unique_ptr<pipeline::StepMetadata> meta_;
  Buffer hidden_;
  std::vector<uint16_t> hidden_host_;
  std::vector<std::pair<int32_t, int64_t>> tokens_;  // (request, position) of the step's real tokens
  std::vector<int32_t> ids_;                         // workload request of each request of the step
};

}  // namespace dsv41kv::test
