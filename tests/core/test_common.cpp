#include <gtest/gtest.h>

#include <limits>

#include "dsv41kv/common.hpp"

using namespace dsv41kv;

TEST(Error, CarriesCodeAndPrefixesSpecCodes) {
  try {
    fail(ErrorCode::kTopology, "kv_source_layer_ids: missing");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTopology);
    EXPECT_STREQ(e.what(), "E7: kv_source_layer_ids: missing");
  }
  try {
    fail(ErrorCode::kIo, "file.bin: cannot open");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_STREQ(e.what(), "file.bin: cannot open");
  }
}

TEST(TensorView, ContiguousAndStrided) {
  float buf[24];
  auto v = TensorView::contiguous(buf, DType::F32, {2, 3, 4});
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.stride[0], 12);
  EXPECT_EQ(v.stride[1], 4);
  EXPECT_EQ(v.stride[2], 1);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_TRUE(v.is_contiguous());
  auto s = TensorView::strided(buf, DType::F32, {2, 4}, {12, 1});
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.describe(), "f32[2, 4] strides [12, 1] on cpu");
  EXPECT_FALSE(TensorView{}.present());
}

// span_bytes: first to one past the last addressed element; false when the index arithmetic of
// the view would overflow (no allocation spans 2^62 bytes).
TEST(TensorView, SpanBytes) {
  float buf[24];
  int64_t b = -1;
  EXPECT_TRUE(TensorView::contiguous(buf, DType::F32, {2, 3, 4}).span_bytes(b));
  EXPECT_EQ(b, 96);
  EXPECT_TRUE(TensorView::strided(buf, DType::F32, {2, 4}, {12, 1}).span_bytes(b));
  EXPECT_EQ(b, (12 + 3 + 1) * 4);
  EXPECT_TRUE(TensorView::strided(buf, DType::BF16, {3, 0}, {1 << 30, 1}).span_bytes(b));  // no elements
  EXPECT_EQ(b, 0);
  EXPECT_TRUE(TensorView{}.span_bytes(b));
  EXPECT_EQ(b, 0);
  EXPECT_TRUE(TensorView::strided(buf, DType::U8, {2}, {(int64_t{1} << 62) - 1}).span_bytes(b));
  EXPECT_EQ(b, int64_t{1} << 62);  // the limit itself
  EXPECT_FALSE(TensorView::strided(buf, DType::U8, {2}, {int64_t{1} << 62}).span_bytes(b));
  EXPECT_FALSE(TensorView::strided(buf, DType::F32, {2}, {int64_t{1} << 60}).span_bytes(b));  // 2^62 + 4 bytes
  EXPECT_FALSE(TensorView::strided(buf, DType::F32, {21, 1024}, {int64_t{1} << 60, 1}).span_bytes(b));
  EXPECT_FALSE(TensorView::strided(buf, DType::F32, {int64_t{1} << 62, 1}, {1, 1}).span_bytes(b));
  EXPECT_FALSE(TensorView::strided(buf, DType::F32, {2, 2}, {std::numeric_limits<int64_t>::min(), 1}).span_bytes(b));
  TensorView neg = TensorView::contiguous(buf, DType::F32, {2, 3});
  neg.shape[0] = -2;
  EXPECT_FALSE(neg.span_bytes(b));
  EXPECT_NO_THROW(TensorView::contiguous(buf, DType::F32, {2, 3}).require_span("op", "x"));
  try {
    neg.require_span("op", "x");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("op: x: spans more than 2^62 bytes"), std::string::npos) << e.what();
  }
}

// The launch defaults are part of the API contract (docs/design.md): programmatic dependent
// launch on (it never changes results), the early-metadata promise off (breaking it is a race),
// and also when an engine writes ExecContext{stream, threads}.
TEST(ExecContext, ProgrammaticLaunchOnEarlyMetadataOffByDefault) {
  const ExecContext d;
  EXPECT_EQ(d.stream, nullptr);
  EXPECT_EQ(d.num_threads, 0);
  EXPECT_TRUE(d.programmatic_launch);
  EXPECT_FALSE(d.pdl_early_metadata);
  const ExecContext braced{nullptr, 4};
  EXPECT_TRUE(braced.programmatic_launch);
  EXPECT_FALSE(braced.pdl_early_metadata);
}
