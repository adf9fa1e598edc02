// Canary-filled backings (SPEC 10.2): a whole allocation pre-filled with a canary value so a
// test can compare every byte after an op against "canary everywhere + the expected writes".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv::test {

inline constexpr uint8_t kByteCanary = 0xA5;        // 165: packed and fp8 caches
inline constexpr uint16_t kBf16Canary = 0x4040;     // 3.0: bf16 caches
inline constexpr uint16_t kBf16NaN = 0x7FC0;        // latents before an op
inline constexpr uint16_t kBf16Sentinel = 0xC2F6;   // -123.0: gather outputs

// The library dtype of an element type (uint16_t = bf16 bits).
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, uint16_t>) return DType::BF16;
  else if constexpr (std::is_same_v<T, uint8_t>) return DType::U8;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::I32;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::I64;
  else static_assert(sizeof(T) == 0, "no dsv41kv dtype for this type");
}

// A host buffer of n elements, every one set to `canary` until written.
template <class T>
class CanaryBuffer {
 public:
  CanaryBuffer() = default;
  CanaryBuffer(size_t n, T canary) : data_(n, canary), canary_(canary) {}

  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  size_t size() const { return data_.size(); }
  size_t bytes() const { return data_.size() * sizeof(T); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  std::vector<T>& vec() { return data_; }
  const std::vector<T>& vec() const { return data_; }
  // True when every element still holds the canary (bitwise).
  bool untouched() const {
    for (const T& v : data_)
      if (std::memcmp(&v, &canary_, sizeof(T)) != 0) return false;
    return true;
  }

  TensorView view(std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(data_.data(), dtype_of<T>(), shape);
  }
  TensorView view(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride) {
    return TensorView::strided(data_.data(), dtype_of<T>(), shape, stride);
  }

 private:
  std::vector<T> data_;
  T canary_{};
};

// A contiguous host view of a vector (1-D unless a shape is given).
template <class T>
TensorView view_of(std::vector<T>& v) {
  return TensorView::contiguous(v.data(), dtype_of<T>(), {static_cast<int64_t>(v.size())});
}
template <class T>
TensorView view_of(std::vector<T>& v, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(v.data(), dtype_of<T>(), shape);
}

}  // namespace dsv41kv::test
