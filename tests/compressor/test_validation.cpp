// Every host validation of the compressor path (SPEC 0.4 item 3, 4.2, 5.1, 7.5): the error code,
// a message fragment naming the argument/value, and that every output buffer (canary-filled)
// is untouched.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "support/batch.hpp"
#include "dsv41kv/device.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace dsv41kv::test {
namespace {

struct Case {
  const char* name;
  std::function<void(Batch&, CompressArgs&)> mutate;
  ErrorCode code;
  const char* fragment;
};

constexpr ErrorCode E3 = ErrorCode::kCompressorRatio, E8 = ErrorCode::kInvalidArgument;

TEST(Validation, Compress) {
  const std::vector<Case> cases = {
      {"ratio 3", [](Batch&, CompressArgs& a) { a.ratio = 3; }, E3, "ratio = 3"},
      {"ratio 0", [](Batch&, CompressArgs& a) { a.ratio = 0; }, E3, "ratio = 0"},
      {"kv dtype", [](Batch&, CompressArgs& a) { a.kv_score.dtype = DType::BF16; }, E8, "kv_score: dtype bf16"},
      {"kv width", [](Batch&, CompressArgs& a) { a.kv_score.shape[1] = 512; }, E8, "kv_score: shape[1] = 512"},
      {"kv rows", [](Batch& b, CompressArgs& a) { a.kv_score.shape[0] = b.N - 1; }, E8, "kv_score: 20 rows, expected at least 21"},
      {"kv inner stride", [](Batch&, CompressArgs& a) { a.kv_score.stride[1] = 2; }, E8, "kv_score: inner stride 2"},
      {"kv row stride %16", [](Batch&, CompressArgs& a) { a.kv_score.stride[0] = 1032; }, E8, "multiple of 16"},
      {"kv row overlap", [](Batch&, CompressArgs& a) { a.kv_score.stride[0] = 512; }, E8, "rows must not overlap"},
      {"kv stride overflow", [](Batch&, CompressArgs& a) { a.kv_score.stride[0] = int64_t{1} << 60; }, E8, "kv_score: spans more than 2^62 bytes"},
      {"ring stride overflow", [](Batch&, CompressArgs& a) { a.ring.stride[0] = int64_t{1} << 61; }, E8, "ring: spans more than 2^62 bytes"},
      {"kv absent", [](Batch&, CompressArgs& a) { a.kv_score = TensorView{}; }, E8, "kv_score: absent"},
      {"kv null", [](Batch&, CompressArgs& a) { a.kv_score.data = nullptr; }, E8, "kv_score: data pointer is null"},
      {"positions dtype", [](Batch&, CompressArgs& a) { a.positions.dtype = DType::I32; }, E8, "positions: dtype i32"},
      {"positions short", [](Batch& b, CompressArgs& a) { a.positions.shape[0] = b.N - 1; }, E8, "positions: 20 entries"},
      {"positions strided", [](Batch&, CompressArgs& a) { a.positions.stride[0] = 2; }, E8, "positions: stride 2, expected contiguous"},
      {"slot_mapping 2-D", [](Batch& b, CompressArgs& a) { a.slot_mapping = TensorView::contiguous(b.ring_slots.data(), DType::I64, {b.N, 1}); }, E8, "slot_mapping: 2 dimensions"},
      {"slot_mapping dtype", [](Batch&, CompressArgs& a) { a.slot_mapping.dtype = DType::I32; }, E8, "slot_mapping: dtype i32"},
      {"norm size", [](Batch&, CompressArgs& a) { a.norm_weight.shape[0] = 448; }, E8, "norm_weight: 448 entries"},
      {"norm dtype", [](Batch&, CompressArgs& a) { a.norm_weight.dtype = DType::F32; }, E8, "norm_weight: dtype f32"},
      {"eps NaN", [](Batch&, CompressArgs& a) { a.eps = std::numeric_limits<float>::quiet_NaN(); }, E8, "eps: nan"},
      {"eps negative", [](Batch&, CompressArgs& a) { a.eps = -1.0f; }, E8, "eps: -1"},
      {"latent absent", [](Batch&, CompressArgs& a) { a.latent_out = TensorView{}; }, E8, "latent_out: absent"},
      {"latent dtype", [](Batch&, CompressArgs& a) { a.latent_out.dtype = DType::F32; }, E8, "latent_out: dtype f32"},
      {"latent rows", [](Batch& b, CompressArgs& a) { a.latent_out.shape[0] = b.N - 2; }, E8, "latent_out: 19 rows"},
      {"latent strided", [](Batch& b, CompressArgs& a) { a.latent_out = TensorView::strided(b.latent.data(), DType::BF16, {b.N, 512}, {520, 1}); }, E8, "latent_out: not contiguous"},
      {"policy", [](Batch&, CompressArgs& a) { a.policy = static_cast<RingPolicy>(7); }, E8, "policy: value 7"},
      {"ring absent", [](Batch&, CompressArgs& a) { a.ring = TensorView{}; }, E8, "ring: absent"},
      {"ring dtype", [](Batch&, CompressArgs& a) { a.ring.dtype = DType::BF16; }, E8, "ring: dtype bf16"},
      {"ring width", [](Batch&, CompressArgs& a) { a.ring.shape[2] = 512; }, E8, "ring: shape[2] = 512"},
      {"ring row stride", [](Batch&, CompressArgs& a) { a.ring.stride[1] = 1000; }, E8, "ring: row stride 1000"},
      {"ring row stride %16", [](Batch&, CompressArgs& a) { a.ring.stride[1] = 1032; a.ring.stride[0] = 8 * 1032 + 8; }, E8, "ring: row stride 1032"},
      {"ring block stride", [](Batch&, CompressArgs& a) { a.ring.stride[0] = 8000; }, E8, "ring: block stride 8000 floats, expected >= cap * row_stride = 8192"},
      {"ring inner stride", [](Batch&, CompressArgs& a) { a.ring.stride[2] = 2; }, E8, "ring: inner stride 2"},
      {"qsl absent", [](Batch&, CompressArgs& a) { a.qsl = TensorView{}; }, E8, "qsl: absent"},
      {"qsl dtype", [](Batch&, CompressArgs& a) { a.qsl.dtype = DType::I64; }, E8, "qsl: dtype i64"},
      {"t2r length", [](Batch&, CompressArgs& a) { a.token_to_req.shape[0] -= 1; }, E8, "token_to_req: 20 entries, expected N = 21"},
      {"device mismatch", [](Batch&, CompressArgs& a) { a.positions.device = Device::CUDA; }, E8, "positions: on cuda, expected cpu"},
      {"ring device", [](Batch&, CompressArgs& a) { a.ring.device = Device::CUDA; }, E8, "ring: on cuda"},
      // values (host views)
      {"qsl[0]", [](Batch& b, CompressArgs&) { b.qsl[0] = 1; }, E8, "qsl[0] = 1, expected 0"},
      {"qsl monotone", [](Batch& b, CompressArgs&) { b.qsl[2] = 0; }, E8, "expected non-decreasing"},
      {"qsl beyond N", [](Batch& b, CompressArgs&) { b.qsl[3] = 22; }, E8, "qsl[num_reqs = 3] = 22, expected <= N = 21"},
      {"ring slot range", [](Batch& b, CompressArgs&) { b.ring_slots[4] = 48; }, E8, "slot_mapping[4] = 48, expected < ring blocks * cap"},
      {"negative position", [](Batch& b, CompressArgs&) { b.positions[20] = -1; }, E8, "positions[20] = -1"},
      {"t2r owner", [](Batch& b, CompressArgs&) { b.t2r[3] = 2; }, E8, "token_to_req[3] = 2, expected 1"},
      {"t2r padding", [](Batch& b, CompressArgs&) { b.ring_slots[19] = 3; b.t2r[19] = 3; }, E8, "token_to_req[19] = 3"},
      {"positions gap", [](Batch& b, CompressArgs&) { b.positions[3] += 1; }, E8, "expected consecutive positions"},
      {"shared ring block", [](Batch& b, CompressArgs&) {
         b.ring_slots[0] = (b.ring_slots[1] / 8) * 8 + 7; }, E8, "expected distinct ring blocks"},
      // PCP arguments
      {"prev_rows with kTail", [](Batch& b, CompressArgs& a) { a.prev_rows = TensorView::contiguous(b.kv.data(), DType::F32, {2, 1024}); }, E8, "prev_rows: given with ring policy kTail"},
      {"prev_rows alone", [](Batch& b, CompressArgs& a) { a.policy = RingPolicy::kOpenRow; a.prev_rows = TensorView::contiguous(b.kv.data(), DType::F32, {2, 1024}); }, E8, "prev_row_indices: absent"},
      {"prev_rows width", [](Batch& b, CompressArgs& a) {
         a.policy = RingPolicy::kOpenRow;
         a.prev_rows = TensorView::contiguous(b.kv.data(), DType::F32, {2, 512});
         a.prev_row_indices = TensorView::contiguous(b.ring_slots.data(), DType::I64, {2}); }, E8, "prev_rows: shape[1] = 512"},
      {"prev_row_indices too long", [](Batch& b, CompressArgs& a) {
         a.policy = RingPolicy::kOpenRow;
         a.prev_rows = TensorView::contiguous(b.kv.data(), DType::F32, {2, 1024});
         a.prev_row_indices = TensorView::contiguous(b.ring_slots.data(), DType::I64, {4}); }, E8, "prev_row_indices: 4 entries, expected at most num_reqs = 3"},
      {"built without CUDA", [](Batch&, CompressArgs& a) {
         for (TensorView* v : {&a.kv_score, &a.positions, &a.slot_mapping, &a.norm_weight, &a.latent_out, &a.ring, &a.qsl, &a.token_to_req}) v->device = Device::CUDA; }, E8, "built without CUDA"},
  };
  const Batch base = base_batch();
  for (const Case& c : cases) {
    if (std::string(c.name) == "built without CUDA" && built_with_cuda()) continue;
    SCOPED_TRACE(c.name);
    Batch b = base;
    CompressArgs a = b.compress_args();
    c.mutate(b, a);
    expect_error([&] { compress(a); }, c.code, c.fragment);
    expect_untouched(b);
    // the fused op rejects the same input before writing anything
    Batch b2 = base;
    CompressInsertArgs ci = b2.compress_insert_args(true);
    c.mutate(b2, ci.compress);
    if (std::string(c.name) == "latent absent") continue;  // optional for compress_insert
    if (std::string(c.name) == "built without CUDA") continue;  // insert half is on cpu
    // ... with the same message, naming the fused op
    expect_error([&] { compress_insert(ci); }, c.code, c.fragment);
    expect_error([&] { compress_insert(ci); }, c.code, "compress_insert: ");
    expect_untouched(b2);
  }
}

TEST(Validation, CompressRatio1IgnoresRingArguments) {
  Batch b = base_batch(1);
  CompressArgs a = b.compress_args();
  a.ring = TensorView{};
  a.qsl = TensorView{};
  a.token_to_req = TensorView{};
  EXPECT_NO_THROW(compress(a));
}

TEST(Validation, ExecContext) {
  Batch b = base_batch();
  expect_error([&] { compress(b.compress_args(), ExecContext{nullptr, -1}); }, E8, "ctx.num_threads = -1");
  expect_untouched(b);
}


// compress_insert: errors of the insert half are detected before the compress half writes.
TEST(Validation, CompressInsert) {
  const Batch base = base_batch();
  {
    Batch b = base;
    CompressInsertArgs a = b.compress_insert_args(true);
    a.rope_table.shape[0] = 16;  // position 25 needs row 24
    expect_error([&] { compress_insert(a); }, E8, "a position beyond the RoPE table of 16 rows");
    expect_untouched(b);
  }
  {
    Batch b = base;
    CompressInsertArgs a = b.compress_insert_args(false);
    a.insert_slots.shape[0] -= 1;
    expect_error([&] { compress_insert(a); }, E8, "insert_slots: 20 entries, expected N = 21");
    expect_untouched(b);
  }
  {
    Batch b = base;
    CompressInsertArgs a = b.compress_insert_args(false);
    b.cache_slots[0] = 1000;
    expect_error([&] { compress_insert(a); }, E8, "slots[0] = 1000");
    expect_untouched(b);
  }
  {
    Batch b = base;
    CompressInsertArgs a = b.compress_insert_args(false);
    a.cache.format = RecordFormat::PLAIN_BF16;  // stride still fits; element count check
    a.cache.page_stride = 10;
    expect_error([&] { compress_insert(a); }, E8, "compress_insert: cache: page_stride = 10");
    expect_untouched(b);
  }
}

}  // namespace
}  // namespace dsv41kv::test
