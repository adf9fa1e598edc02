// The serving step of the write path on the CPU (pipeline.hpp): the demo's workload through a
// ratio-2 and a ratio-1 layer sharing one StepMetadata, checked step by step against facts of the
// workload (pipeline_run.hpp); the read-back rule and WriteAudit failing when a record or the
// expectation is wrong; the validation of configurations, batches and runs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dsv41kv/buffer.hpp"
#include "dsv41kv/conformance.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/pipeline.hpp"
#include "pipeline/pipeline_run.hpp"
#include "support/errors.hpp"

namespace dsv41kv::test {
namespace {

#define EXPECT_ERROR(expr, code, fragment) expect_error([&] { (void)(expr); }, code, fragment)

using pipeline::KvSourceLayer;
using pipeline::ServingConfig;
using pipeline::StepBatch;
using pipeline::StepMetadata;
using pipeline::StepRequest;

const std::vector<RecordFormat> kAll(std::begin(kAllRecordFormats), std::end(kAllRecordFormats));

TEST(PipelineCpu, DemoWorkloadWritesWhatTheWorkloadSays) {
  for (uint64_t seed : {7ull, 11ull, 8ull}) {  // 8: the null-block request reaches further than any other (block-table width)
    SCOPED_TRACE("seed " + std::to_string(seed));
    PipelineRun run(Device::CPU, {2, 1}, kAll, seed);
    run.run_all();
    // the workload reaches every case the checks distinguish
    int64_t odd_starts = 0, null_tokens = 0;
    for (const auto& st : run.workload().steps)
      for (const auto& s : st) {
        odd_starts += s.req.num_computed % 2;
        null_tokens += run.workload().requests[static_cast<size_t>(s.id)].null_block ? s.req.query_len : 0;
      }
    EXPECT_GT(odd_starts, 0);
    EXPECT_GT(null_tokens, 0);
  }
}

TEST(PipelineCpu, OneLayerAloneAndOneFormat) {
  PipelineRun run(Device::CPU, {1}, {RecordFormat::NVFP4_288}, 5);
  run.run_all();
}

// Step 0 of the workload through a ratio-2 layer with a 584 and a plain bf16 cache, stopped after
// the layer ran so that a test can tamper with what it wrote before the audit reads it back.
struct TamperRun {
  PipelineRun run{Device::CPU, {2}, {RecordFormat::V4_584, RecordFormat::PLAIN_BF16}, 7};
  PipelineRun::LayerUnderTest& L = run.layers()[0];
  int64_t first_slot = -1;

  TamperRun() {
    const StepBatch b = run.run_step(0);
    std::vector<int64_t> slots(static_cast<size_t>(b.num_rows()));
    download_view(run.metadata().compressed_slots(2), slots.data());
    for (int64_t s : slots)
      if (s >= 0 && first_slot < 0) first_slot = s;
  }
  // Flips bits of element `d` of the first written record's NoPE value in cache i.
  void flip(size_t i, int d, uint8_t bits) {
    const CacheView& cv = L.layer->cache(i);
    Buffer& b = L.layer->cache_buffer(i);
    std::vector<uint8_t> bytes;
    b.download(bytes, b.size());
    const int64_t page = first_slot / cv.states_per_page, r = first_slot % cv.states_per_page;
    const size_t o = cv.format == RecordFormat::PLAIN_BF16
                         ? static_cast<size_t>((page * cv.page_stride + r * cv.row_stride + d) * 2)
                         : static_cast<size_t>(page * cv.page_stride + r * V4Layout::kValueBytes + d);
    bytes[o] ^= bits;
    b.upload(bytes);
  }
};

TEST(PipelineCpu, ReadBackCheckFailsOnAWrongRecord) {
  TamperRun t;
  ASSERT_GE(t.first_slot, 0);
  t.flip(0, 3, 0x7F);  // 584: an e4m3 value far from the latent's
  t.flip(1, 5, 0x01);  // plain bf16: one ulp off, which a bf16 row must not be
  const pipeline::StepWrites w = t.L.audit->after_step(t.run.metadata());
  ASSERT_EQ(w.formats.size(), 2u);
  EXPECT_EQ(w.formats[0].bad_records, 1) << w.formats[0].first_bad;
  EXPECT_EQ(w.formats[1].bad_records, 1) << w.formats[1].first_bad;
  EXPECT_NE(w.formats[0].first_bad.find("dim 3"), std::string::npos) << w.formats[0].first_bad;
  EXPECT_NE(w.formats[1].first_bad.find("dim 5"), std::string::npos) << w.formats[1].first_bad;
}

TEST(PipelineCpu, ReadBackCheckFailsOnAWrongExpectation) {
  TamperRun t;
  t.L.audit->seam_negate_expected = true;
  const pipeline::StepWrites w = t.L.audit->after_step(t.run.metadata());
  ASSERT_GT(w.records, 0);
  for (const auto& f : w.formats) EXPECT_EQ(f.bad_records, w.records) << record_info(f.format).name;
}

// The rule itself on records written by the library's writers: every dimension reads back, one
// quantization step is the bound of a quantized dimension, and bf16-stored dimensions are exact.
TEST(PipelineCpu, ReadsBackRule) {
  Rng rng(3);
  const std::vector<uint16_t> lat = random_bf16(kLatentDim, rng);
  const std::vector<float> table = random_rope_table(1, rng);
  float x[kLatentDim], y[kLatentDim];
  rope_xy(lat.data(), table.data(), 0, x, y);
  for (RecordFormat f : kAllRecordFormats) {
    SCOPED_TRACE(record_info(f).name);
    CacheView cv = CacheView::with_default_strides(nullptr, f, 1, 4);
    cv.fp8_scale = 0.5f;
    std::vector<uint8_t> page(cv.backing_bytes(), 0);
    cv.base = page.data();
    write_expected(page.data(), f, 4, cv.page_stride, cv.row_stride, cv.fp8_scale, 1, lat.data(), table.data(), 0);
    const int64_t S = 4, r = 1;
    std::vector<uint16_t> back(kLatentDim);
    std::vector<int64_t> slot{1};
    gather({cv, view_of(slot), TensorView::contiguous(back.data(), DType::BF16, {1, kLatentDim})});
    const uint8_t* base = record_info(f).packed ? page.data() : page.data() + cv.row_stride * dtype_size(record_info(f).element);
    for (int d = 0; d < kLatentDim; ++d) {
      const float want = d < kNopeDim ? x[d] : y[d];
      ASSERT_TRUE(pipeline::reads_back(f, base, S, r, d, cv.fp8_scale, back[static_cast<size_t>(d)], want)) << "dim " << d;
      const rec::DecodedValue v = rec::decode_with_step(f, base, S, r, d, cv.fp8_scale);
      const bool bf16_stored = f == RecordFormat::PLAIN_BF16 || (f == RecordFormat::V4_584 && d >= kNopeDim);
      // the next bf16 value away from the read one: beyond an exact bf16 store, inside a
      // quantized one's step only when that step is wider than a bf16 ulp
      const uint16_t b = back[static_cast<size_t>(d)];
      const float off = num::bf16_decode(static_cast<uint16_t>(b + 1));
      if (bf16_stored) {
        EXPECT_FALSE(pipeline::reads_back(f, base, S, r, d, cv.fp8_scale, b, off)) << "dim " << d;
      }
      EXPECT_FALSE(pipeline::reads_back(f, base, S, r, d, cv.fp8_scale, b,
                                        static_cast<float>(num::bf16_decode(b) + 2.5 * v.step + 1e-3)))
          << "dim " << d;
    }
  }
  EXPECT_ERROR(pipeline::reads_back(RecordFormat::V4_584, nullptr, 4, 0, 0, 1.0f, 0, 0.0f), ErrorCode::kInvalidArgument,
               "page");
  std::vector<uint8_t> p(4096);
  EXPECT_ERROR(pipeline::reads_back(RecordFormat::V4_584, p.data(), 4, 4, 0, 1.0f, 0, 0.0f), ErrorCode::kInvalidArgument,
               "r: state 4");
  EXPECT_ERROR(pipeline::reads_back(RecordFormat::V4_584, p.data(), 4, 0, 512, 1.0f, 0, 0.0f),
               ErrorCode::kInvalidArgument, "d: 512");
}

// ---------------------------------------------------------------- validation

ServingConfig small_config() {
  ServingConfig c;
  c.max_tokens = 16;
  c.max_requests = 2;
  c.ring_blocks = 3;
  c.c2a = {4, 5, 2};  // 4 states per page, 5 pages, 2 logical pages per request
  c.formats = {RecordFormat::V4_584};
  return c;
}

TEST(PipelineValidation, ServingConfig) {
  const ServingConfig ok = small_config();
  EXPECT_NO_THROW(pipeline::validate(ok));
  auto bad = [&](auto edit, const char* what) {
    ServingConfig c = ok;
    edit(c);
    EXPECT_ERROR(pipeline::validate(c), ErrorCode::kInvalidArgument, what);
  };
  bad([](ServingConfig& c) { c.max_tokens = 0; }, "max_tokens: 0");
  bad([](ServingConfig& c) { c.max_requests = -1; }, "max_requests: -1");
  bad([](ServingConfig& c) { c.ring_blocks = 0; }, "ring_blocks: 0");
  bad([](ServingConfig& c) { c.c2a.block_table_width = 0; }, "c2a.block_table_width: 0");
  bad([](ServingConfig& c) { c.c2a.num_pages = 0; }, "neither served");
  bad([](ServingConfig& c) { c.formats = {}; }, "formats: empty");
  bad([](ServingConfig& c) { c.formats = {RecordFormat::PLAIN_FP8, RecordFormat::PLAIN_FP8}; }, "fp8 twice");
  bad([](ServingConfig& c) { c.fp8_scale = 0.0f; }, "fp8_scale: 0");
  bad([](ServingConfig& c) { c.exec.num_threads = -2; }, "num_threads = -2");
  EXPECT_ERROR(ok.compressed(4), ErrorCode::kMetadataRatio, "ratio");
  EXPECT_EQ(ok.states_per_page(1), 64);
  EXPECT_EQ(ok.states_per_page(2), 4);
}

TEST(PipelineValidation, BatchesAreCheckedBeforeAnythingIsBuilt) {
  const ServingConfig c = small_config();
  StepMetadata meta(c);
  StepBatch good;
  good.requests = {{5, 3, 1, {}, {2, 4}, {}}, {2, 0, 0, {}, {}, {}}};
  good.padding_rows = 1;
  meta.build(good);
  EXPECT_EQ(meta.num_rows(), 8);
  EXPECT_EQ(meta.max_position(), 7);
  std::vector<int64_t> cs(8), rs(8);
  download_view(meta.compressed_slots(2), cs.data());
  download_view(meta.ring_slots(), rs.data());
  // positions 3..7 of request 0 (ring block 1, pages 2, 4), two tokens of the null-block request,
  // one padding row: states 1, 2, 3 at page 2 (slots 9..11); ring slots block 1 * 8 + p % 8
  EXPECT_EQ(cs, (std::vector<int64_t>{9, -1, 10, -1, 11, -1, -1, -1}));
  EXPECT_EQ(rs, (std::vector<int64_t>{11, 12, 13, 14, 15, -1, -1, -1}));

  auto bad = [&](auto edit, const char* what) {
    StepBatch b = good;
    edit(b);
    EXPECT_ERROR(meta.build(b), ErrorCode::kInvalidArgument, what);
    EXPECT_EQ(meta.num_rows(), 8) << "a rejected batch changed the metadata";
  };
  bad([](StepBatch& b) { b.requests.push_back({}); }, "3 requests, expected at most max_requests = 2");
  bad([](StepBatch& b) { b.padding_rows = 10; }, "7 tokens and 10 padding rows, expected at most max_tokens = 16");
  bad([](StepBatch& b) { b.padding_rows = -1; }, "padding_rows: -1");
  bad([](StepBatch& b) { b.requests[1].query_len = -1; }, "requests[1].query_len: -1");
  bad([](StepBatch& b) { b.requests[0].num_computed = -4; }, "requests[0].num_computed: -4");
  bad([](StepBatch& b) { b.requests[0].ring_block = 3; }, "requests[0].ring_block: 3, expected < ring_blocks = 3");
  bad([](StepBatch& b) { b.requests[0].c2a_pages = {2, 5}; }, "page 5 at logical page 1");
  bad([](StepBatch& b) { b.requests[0].c2a_pages = {2, 3, 4}; }, "c2a_pages: 3 entries");
  // position 15 closes state 7 on logical page 1 (fits); position 17 closes state 8 on page 2
  bad([](StepBatch& b) { b.requests[0].num_computed = 13; }, "position 17 closes state 8 on logical page 2");
}

TEST(PipelineValidation, LayersAndRuns) {
  const ServingConfig c = small_config();
  const RopeTable table = build_rope_table(RopeParams{}, 16);
  const CompressorWeights w2 = CompressorWeights::from_seed(2, 64, 1);
  EXPECT_ERROR(KvSourceLayer(c, CompressorWeights::from_seed(1, 64, 1), table, 1e-6f), ErrorCode::kInvalidArgument,
               "c1a not served");
  CompressorWeights w3 = w2;
  w3.ratio = 3;
  EXPECT_ERROR(KvSourceLayer(c, w3, table, 1e-6f), ErrorCode::kCompressorRatio, "weights.ratio");
  CompressorWeights short_w = w2;
  short_w.fused_wkv_wgate.pop_back();
  EXPECT_ERROR(KvSourceLayer(c, short_w, table, 1e-6f), ErrorCode::kInvalidArgument, "fused_wkv_wgate");
  EXPECT_ERROR(KvSourceLayer(c, w2, table, NAN), ErrorCode::kInvalidArgument, "eps");

  KvSourceLayer layer(c, w2, table, 1e-6f);
  EXPECT_EQ(layer.ring().size(), size_t{3} * 8 * 1024 * 4);
  EXPECT_EQ(layer.num_caches(), 1u);
  EXPECT_ERROR(layer.cache(1), ErrorCode::kInvalidArgument, "1, expected < num_caches() = 1");
  StepMetadata meta(c);
  StepBatch b;
  b.requests = {{4, 0, 1, {}, {1}, {}}};
  meta.build(b);
  Buffer hidden(Device::CPU, 8 * 64 * 2);
  hidden.fill(0);
  EXPECT_ERROR(layer.run(meta, hidden.view(DType::BF16, {4, 32})), ErrorCode::kInvalidArgument, "hidden");
  EXPECT_ERROR(layer.run(meta, hidden.view(DType::BF16, {3, 64})), ErrorCode::kInvalidArgument, "hidden");
  EXPECT_ERROR(layer.run(meta, hidden.view(DType::F32, {4, 64})), ErrorCode::kInvalidArgument, "hidden");
  EXPECT_NO_THROW(layer.run(meta, hidden.view(DType::BF16, {4, 64})));
  ServingConfig other = c;
  other.c2a.num_pages = 6;
  StepMetadata meta6(other);
  meta6.build(b);
  EXPECT_ERROR(layer.run(meta6, hidden.view(DType::BF16, {4, 64})), ErrorCode::kInvalidArgument, "meta");
  b.requests[0].num_computed = 12;  // positions 12..15: the table's last row is 15
  meta.build(b);
  EXPECT_NO_THROW(layer.run(meta, hidden.view(DType::BF16, {4, 64})));
  b.requests[0].query_len = 5;
  meta.build(b);
  EXPECT_ERROR(layer.run(meta, hidden.view(DType::BF16, {5, 64})), ErrorCode::kInvalidArgument,
               "position 16 has no row in the layer's RoPE table of 16 rows");
}

// ---------------------------------------------------------------- Buffer

TEST(PipelineBuffer, HostBuffers) {
  Buffer b(Device::CPU, 64);
  EXPECT_EQ(b.size(), 64u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 256, 0u);
  b.fill_with(3.0f);
  std::vector<float> f;
  b.download(f, 16);
  EXPECT_EQ(f, std::vector<float>(16, 3.0f));
  b.fill(0xA5, 8, 4);
  std::vector<uint8_t> bytes;
  b.download(bytes, 64);
  EXPECT_EQ(bytes[7], 0x40);
  EXPECT_EQ(bytes[8], 0xA5);
  EXPECT_EQ(bytes[11], 0xA5);
  EXPECT_EQ(bytes[12], 0x00);
  const std::vector<int32_t> v{1, 2, 3};
  b.upload(v, 4);
  EXPECT_EQ(b.as<int32_t>()[3], 3);
  const TensorView tv = b.view(DType::I32, {2, 3}, 1);
  EXPECT_EQ(tv.ptr<int32_t>()[0], 1);
  EXPECT_EQ(b.view(DType::F32, {4}, {4}, 0).stride[0], 4);
  EXPECT_ERROR(b.view(DType::I32, {17}), ErrorCode::kInvalidArgument, "addresses 68 bytes");
  EXPECT_ERROR(b.view(DType::I32, {4, 4}, 1), ErrorCode::kInvalidArgument, "Buffer::view");
  EXPECT_ERROR(b.view(DType::F32, {2}, {-1}, 4), ErrorCode::kInvalidArgument, "Buffer::view");
  EXPECT_ERROR(b.upload(v, 56), ErrorCode::kInvalidArgument, "56 + 12 bytes");
  EXPECT_ERROR(b.fill(0, 65, 0), ErrorCode::kInvalidArgument, "Buffer::fill");
  EXPECT_ERROR(b.fill_pattern(bytes.data(), 3), ErrorCode::kInvalidArgument, "pattern_bytes: 3");
  Buffer moved = std::move(b);
  EXPECT_EQ(moved.size(), 64u);
  EXPECT_EQ(b.size(), 0u);  // NOLINT(bugprone-use-after-move): the moved-from buffer is empty
  EXPECT_EQ(Buffer(Device::CPU, 0).data(), nullptr);
  if (!built_with_cuda()) {
    EXPECT_ERROR(Buffer(Device::CUDA, 16), ErrorCode::kInvalidArgument, "built without CUDA");
  }
}

}  // namespace
}  // namespace dsv41kv::test
