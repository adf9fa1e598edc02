#include <gtest/gtest.h>

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
