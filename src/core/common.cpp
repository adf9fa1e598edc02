#include "dsv41kv/common.hpp"

#include <fmt/format.h>

#include <limits>

namespace dsv41kv {
namespace {
std::string with_code(ErrorCode code, const std::string& message) {
  const int c = static_cast<int>(code);
  if (c >= 1 && c <= 10) return fmt::format("E{}: {}", c, message);
  return message;
}
}  // namespace

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(with_code(code, message)), code_(code) {}

void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::U8: return "u8";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  return "?";
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::U8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

int64_t TensorView::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

bool TensorView::span_bytes(int64_t& bytes) const {
  constexpr int64_t kLimit = int64_t{1} << 62;
  bytes = 0;
  int64_t last = 0;  // element offset of the last element
  for (int i = 0; i < ndim; ++i) {
    const auto u = static_cast<size_t>(i);
    if (shape[u] < 0) return false;
    if (shape[u] == 0) return true;  // no elements
    if (stride[u] == std::numeric_limits<int64_t>::min()) return false;
    const int64_t st = stride[u] < 0 ? -stride[u] : stride[u];
    int64_t step = 0;
    if (__builtin_mul_overflow(shape[u] - 1, st, &step) || __builtin_add_overflow(last, step, &last) ||
        last >= kLimit)
      return false;
  }
  if (ndim == 0) return true;
  int64_t span = 0;
  if (__builtin_add_overflow(last, int64_t{1}, &span) ||
      __builtin_mul_overflow(span, static_cast<int64_t>(dtype_size(dtype)), &span) || span > kLimit)
    return false;
  bytes = span;
  return true;
}

void TensorView::require_span(const char* op, const char* arg) const {
  int64_t bytes = 0;
  if (!span_bytes(bytes))
    invalid_argument(
        fmt::format("{}: {}: spans more than 2^62 bytes ({}), expected the view of an allocation", op, arg, describe()));
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    const auto u = static_cast<size_t>(i);
    if (shape[u] != 1 && stride[u] != expect) return false;
    expect *= shape[u];
  }
  return true;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  if (shape.size() > 4) invalid_argument("TensorView: at most 4 dimensions");
  v.ndim = static_cast<int>(shape.size());
  size_t i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  int64_t st = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.stride[static_cast<size_t>(d)] = st;
    st *= v.shape[static_cast<size_t>(d)];
  }
  return v;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> stride, Device device) {
  if (shape.size() != stride.size()) invalid_argument("TensorView: shape and stride ranks differ");
  TensorView v = contiguous(data, dtype, shape, device);
  size_t i = 0;
  for (int64_t s : stride) v.stride[i++] = s;
  return v;
}

std::string TensorView::describe() const {
  if (ndim == 0) return "absent";
  std::string s = fmt::format("{}[", dtype_name(dtype));
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[static_cast<size_t>(i)]);
  s += "] strides [";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", stride[static_cast<size_t>(i)]);
  s += fmt::format("] on {}", device_name(device));
  return s;
}

}  // namespace dsv41kv
