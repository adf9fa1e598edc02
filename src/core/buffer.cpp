// Buffer (buffer.hpp): host memory through aligned operator new, device memory through the CUDA
// runtime in CUDA builds.
#include "dsv41kv/buffer.hpp"

#include <fmt/format.h>

#include <cstring>
#include <new>
#include <utility>

#include "core/validate.hpp"

#if defined(DSV41KV_WITH_CUDA)
#include "core/cuda/cuda_util.hpp"
#endif

namespace dsv41kv {
namespace {

constexpr std::align_val_t kHostAlign{256};

void check_range(const char* op, size_t offset, size_t bytes, size_t size) {
  if (offset > size || bytes > size - offset)
    detail::bad_arg(op, "offset + bytes",
                    fmt::format("{} + {} bytes, expected at most the buffer's {} bytes", offset, bytes, size));
}

// The copy behind Buffer::download and download_view: waits for it, since the caller reads the
// bytes next.
void copy_to_host(Device device, const void* src, void* host, size_t bytes, const ExecContext& ctx) {
  if (device == Device::CPU) {
    std::memcpy(host, src, bytes);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  const cudaStream_t s = detail::as_stream(ctx.stream);
  DSV41KV_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, s));
  DSV41KV_CUDA_CHECK(cudaStreamSynchronize(s));
#else
  (void)ctx;
#endif
}

}  // namespace

Buffer::Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  if (device != Device::CPU && device != Device::CUDA)
    detail::bad_arg("Buffer", "device", fmt::format("{}, expected cpu or cuda", static_cast<int>(device)));
#if !defined(DSV41KV_WITH_CUDA)
  if (device == Device::CUDA) detail::built_without_cuda("Buffer on cuda");
#endif
  if (bytes == 0) return;
  if (device == Device::CPU) {
    data_ = ::operator new(bytes, kHostAlign);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  DSV41KV_CUDA_CHECK(cudaMalloc(&data_, bytes));
#endif
}

void Buffer::release() noexcept {
  if (data_ == nullptr) return;
  if (device_ == Device::CPU) {
    ::operator delete(data_, kHostAlign);
  } else {
#if defined(DSV41KV_WITH_CUDA)
    cudaFree(data_);  // a destructor cannot throw; a failing free leaves nothing to recover
#endif
  }
  data_ = nullptr;
  bytes_ = 0;
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& o) noexcept
    : device_(o.device_), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// Places `v` (built with a null base) at element `offset` of the buffer, after checking that it
// stays inside it.
TensorView Buffer::place(TensorView v, int64_t offset) const {
  int64_t span = 0;
  const size_t es = dtype_size(v.dtype);
  bool negative = false;
  for (int d = 0; d < v.ndim; ++d) negative = negative || v.stride[static_cast<size_t>(d)] < 0;
  if (negative || !v.span_bytes(span) || offset < 0 || static_cast<size_t>(offset) > bytes_ / es ||
      static_cast<size_t>(span) > bytes_ - static_cast<size_t>(offset) * es)
    detail::bad_arg("Buffer::view", "shape",
                    fmt::format("{} from element {} addresses {} bytes, expected at most the buffer's {}",
                                v.describe(), offset, span, bytes_));
  v.data = static_cast<uint8_t*>(const_cast<void*>(data_)) + static_cast<size_t>(offset) * es;
  return v;
}

TensorView Buffer::view(DType dt, std::initializer_list<int64_t> shape, int64_t offset) const {
  return place(TensorView::contiguous(nullptr, dt, shape, device_), offset);
}

TensorView Buffer::view(DType dt, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride,
                        int64_t offset) const {
  return place(TensorView::strided(nullptr, dt, shape, stride, device_), offset);
}

void Buffer::upload(const void* host, size_t bytes, size_t offset, const ExecContext& ctx) {
  check_range("Buffer::upload", offset, bytes, bytes_);
  if (bytes == 0) return;
  if (host == nullptr) detail::bad_arg("Buffer::upload", "host", "null, expected the source of the copy");
  uint8_t* dst = static_cast<uint8_t*>(data_) + offset;
  if (device_ == Device::CPU) {
    std::memcpy(dst, host, bytes);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  DSV41KV_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, detail::as_stream(ctx.stream)));
#else
  (void)ctx;
#endif
}

void Buffer::download(void* host, size_t bytes, size_t offset, const ExecContext& ctx) const {
  check_range("Buffer::download", offset, bytes, bytes_);
  if (bytes == 0) return;
  if (host == nullptr) detail::bad_arg("Buffer::download", "host", "null, expected the destination of the copy");
  copy_to_host(device_, static_cast<const uint8_t*>(data_) + offset, host, bytes, ctx);
}

void download_view(const TensorView& v, void* host, const ExecContext& ctx) {
  const char* op = "download_view";
  detail::need_present(op, v, "view", "a contiguous view");
  detail::need_contiguous(op, v, "view");
  const size_t bytes = static_cast<size_t>(v.numel()) * dtype_size(v.dtype);
  if (bytes == 0) return;
  detail::need_data(op, v, "view");
  if (host == nullptr) detail::bad_arg(op, "host", "null, expected the destination of the copy");
#if !defined(DSV41KV_WITH_CUDA)
  if (v.device == Device::CUDA) detail::no_cuda(op);
#endif
  copy_to_host(v.device, v.data, host, bytes, ctx);
}

void Buffer::fill(uint8_t byte, size_t offset, size_t bytes, const ExecContext& ctx) {
  if (bytes == SIZE_MAX) bytes = offset <= bytes_ ? bytes_ - offset : 0;
  check_range("Buffer::fill", offset, bytes, bytes_);
  if (bytes == 0) return;
  uint8_t* dst = static_cast<uint8_t*>(data_) + offset;
  if (device_ == Device::CPU) {
    std::memset(dst, byte, bytes);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  DSV41KV_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, detail::as_stream(ctx.stream)));
#else
  (void)ctx;
#endif
}

void Buffer::fill_pattern(const void* pattern, size_t pattern_bytes, const ExecContext& ctx) {
  if (pattern == nullptr) detail::bad_arg("Buffer::fill_pattern", "pattern", "null, expected the bytes to repeat");
  if (pattern_bytes != 1 && pattern_bytes != 2 && pattern_bytes != 4 && pattern_bytes != 8)
    detail::bad_arg("Buffer::fill_pattern", "pattern_bytes", fmt::format("{}, expected 1, 2, 4 or 8", pattern_bytes));
  if (bytes_ % pattern_bytes != 0)
    detail::bad_arg("Buffer::fill_pattern", "pattern_bytes",
                    fmt::format("{} does not divide the buffer's {} bytes", pattern_bytes, bytes_));
  const auto* p = static_cast<const uint8_t*>(pattern);
  bool uniform = true;
  for (size_t i = 1; i < pattern_bytes; ++i) uniform = uniform && p[i] == p[0];
  if (uniform) {
    fill(p[0], 0, bytes_, ctx);
    return;
  }
  auto write = [&](uint8_t* dst) {
    for (size_t o = 0; o < bytes_; o += pattern_bytes) std::memcpy(dst + o, p, pattern_bytes);
  };
  if (device_ == Device::CPU) {
    write(static_cast<uint8_t*>(data_));
    return;
  }
  // an upload from pageable memory returns once the source is staged, so the copy may die here
  std::vector<uint8_t> host(bytes_);
  write(host.data());
  upload(host.data(), bytes_, 0, ctx);
}

}  // namespace dsv41kv
