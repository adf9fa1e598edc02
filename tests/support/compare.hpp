// Comparators that report the first difference (index, both values) and the number of
// differing elements, for byte-for-byte backing checks and tolerance checks.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace dsv41kv::test {

// Index of the first differing byte, if any.
std::optional<size_t> first_difference(const void* a, const void* b, size_t nbytes);

// Byte-for-byte equality of `expected` and `got` (nbytes each). The message names `what`, the
// count of differing bytes and the first few differing offsets with both values.
::testing::AssertionResult bytes_equal(const void* expected, const void* got, size_t nbytes,
                                       const std::string& what = "");

template <class T>
::testing::AssertionResult bits_equal(const std::vector<T>& expected, const std::vector<T>& got,
                                      const std::string& what = "") {
  if (expected.size() != got.size())
    return ::testing::AssertionFailure()
           << what << ": sizes differ: expected " << expected.size() << ", got " << got.size();
  return bytes_equal(expected.data(), got.data(), expected.size() * sizeof(T),
                     what + " (element size " + std::to_string(sizeof(T)) + ")");
}

// |got[i] - ref[i]| <= atol + rtol * |ref[i]| for every i (NaN in got fails).
::testing::AssertionResult all_close(const float* got, const double* ref, size_t n, double rtol,
                                     double atol, const std::string& what = "");

// bf16 bit patterns compared as bf16 values against a double reference.
::testing::AssertionResult bf16_close(const uint16_t* got, const double* ref, size_t n,
                                      double rtol, double atol, const std::string& what = "");

}  // namespace dsv41kv::test
