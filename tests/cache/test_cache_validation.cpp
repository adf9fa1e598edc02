// Bad arguments of the cache ops (insert, gather, save_ring_rows): every case throws the right
// error naming the argument before anything is written (canary-filled outputs stay untouched).
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "dsv41kv/cache.hpp"
#include "dsv41kv/device.hpp"
#include "support/batch.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace dsv41kv::test {
namespace {

struct InsertCaseV {
  const char* name;
  std::function<void(Batch&, InsertArgs&)> mutate;
  ErrorCode code;
  const char* fragment;
};

constexpr ErrorCode E3 = ErrorCode::kCompressorRatio, E8 = ErrorCode::kInvalidArgument;

TEST(Validation, Insert) {
  const std::vector<InsertCaseV> cases = {
      {"ratio", [](Batch&, InsertArgs& a) { a.ratio = 4; }, E3, "insert: ratio = 4"},
      {"latent dtype", [](Batch&, InsertArgs& a) { a.latent.dtype = DType::F32; }, E8, "latent: dtype f32"},
      {"latent width", [](Batch&, InsertArgs& a) { a.latent.shape[1] = 448; }, E8, "latent: shape[1] = 448"},
      {"latent rows", [](Batch& b, InsertArgs& a) { a.latent.shape[0] = b.N - 1; }, E8, "latent: 20 rows"},
      {"latent absent", [](Batch&, InsertArgs& a) { a.latent = TensorView{}; }, E8, "latent: absent"},
      {"positions short", [](Batch& b, InsertArgs& a) { a.positions.shape[0] = b.N - 1; }, E8, "positions: 20 entries"},
      {"table width", [](Batch&, InsertArgs& a) { a.rope_table.shape[1] = 32; }, E8, "rope_table: shape[1] = 32"},
      {"table dtype", [](Batch&, InsertArgs& a) { a.rope_table.dtype = DType::BF16; }, E8, "rope_table: dtype bf16"},
      {"slots dtype", [](Batch&, InsertArgs& a) { a.slots.dtype = DType::I32; }, E8, "slots: dtype i32"},
      {"cache page stride", [](Batch&, InsertArgs& a) { a.cache.page_stride = 100; }, E8, "cache: page_stride = 100"},
      {"cache pages", [](Batch&, InsertArgs& a) { a.cache.num_pages = 0; }, E8, "cache: num_pages = 0"},
      {"cache pages overflow", [](Batch&, InsertArgs& a) { a.cache.num_pages = int64_t{1} << 50; }, E8, "span more than 2^62 bytes"},
      {"cache states overflow", [](Batch&, InsertArgs& a) { a.cache.states_per_page = int64_t{1} << 60; }, E8, "span more than 2^62 bytes"},
      {"cache null", [](Batch&, InsertArgs& a) { a.cache.base = nullptr; }, E8, "cache: base pointer is null"},
      {"cache format", [](Batch&, InsertArgs& a) { a.cache.format = static_cast<RecordFormat>(9); }, E8, "record format: unknown value 9"},
      {"fp8 scale", [](Batch&, InsertArgs& a) { a.cache.format = RecordFormat::PLAIN_FP8; a.cache.page_stride = a.cache.states_per_page * 512; a.cache.fp8_scale = 0.0f; }, E8, "fp8_scale = 0"},
      {"cache device", [](Batch&, InsertArgs& a) { a.cache.device = Device::CUDA; }, E8, "cache: on cuda, expected cpu"},
      {"latent device", [](Batch&, InsertArgs& a) { a.latent.device = Device::CUDA; }, E8, "latent: on cuda"},
      {"slot range", [](Batch& b, InsertArgs&) { b.cache_slots[5] = 3 * b.S; }, E8, "slots[5] = 384, expected < num_pages * states_per_page = 3 * 128 = 384"},
      {"beyond table", [](Batch& b, InsertArgs&) { b.positions[18] = 41; }, E8, "a position beyond the RoPE table"},
      {"negative position", [](Batch& b, InsertArgs&) { b.positions[2] = -3; }, E8, "positions[2] = -3"},
  };
  const Batch base = base_batch();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Batch b = base;
    InsertArgs a = b.insert_args();
    c.mutate(b, a);
    expect_error([&] { insert(a); }, c.code, c.fragment);
    expect_untouched(b);
  }
}

TEST(Validation, GatherAndSaveRingRows) {
  Batch b = base_batch(2);
  CacheView cv = b.cache_view();
  std::vector<int64_t> slots = {0, 5, -1, 3 * b.S};
  CanaryBuffer<uint16_t> out(4 * 512, kBf16Sentinel);
  GatherArgs g;
  g.cache = cv;
  g.slots = view_of(slots);
  g.out = out.view({4, 512});
  expect_error([&] { gather(g); }, E8, "gather: slots: slots[3] = 384");
  EXPECT_TRUE(out.untouched());
  slots[3] = 1;
  GatherArgs g2 = g;
  g2.out.shape[0] = 3;
  expect_error([&] { gather(g2); }, E8, "out: 3 rows, expected at least 4");
  g2 = g;
  g2.out.dtype = DType::F32;
  expect_error([&] { gather(g2); }, E8, "out: dtype f32");
  g2 = g;
  g2.cache.states_per_page = 0;
  expect_error([&] { gather(g2); }, E8, "gather: cache: states_per_page = 0");
  EXPECT_TRUE(out.untouched());

  std::vector<float> prev(3 * 1024, 1.0f);
  std::vector<int64_t> ws = {-1, 5, 48};
  std::vector<float> ring = b.ring_in;
  SaveRingRowsArgs s;
  s.prev_rows = view_of(prev, {3, 1024});
  s.ring_write_slots = view_of(ws);
  s.ring = TensorView::strided(ring.data(), DType::F32, {6, 8, 1024}, {8208, 1024, 1});
  expect_error([&] { save_ring_rows(s); }, E8, "ring_write_slots[2] = 48, expected < ring blocks * cap = 6 * 8 = 48");
  EXPECT_TRUE(bits_equal(b.ring_in, ring, "ring"));
  ws[2] = 47;
  SaveRingRowsArgs s2 = s;
  s2.prev_rows.shape[0] = 2;
  expect_error([&] { save_ring_rows(s2); }, E8, "prev_rows: 2 rows, expected G = 3");
  s2 = s;
  s2.ring.stride[1] = 1000;
  expect_error([&] { save_ring_rows(s2); }, E8, "ring: row stride 1000");
  EXPECT_TRUE(bits_equal(b.ring_in, ring, "ring"));
  EXPECT_NO_THROW(save_ring_rows(s));
}

}  // namespace
}  // namespace dsv41kv::test
