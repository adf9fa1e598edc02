// The bytes of a contiguous view on the host: the view's own memory for a host view, a copy for a
// device view (download_view: it waits for ctx.stream). For checks, statistics and tools that read
// a step's results, never for the serving path.
#pragma once

#include <cstdint>
#include <vector>

#include "dsv41kv/buffer.hpp"
#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

class HostCopy {
 public:
  HostCopy(const TensorView& v, const ExecContext& ctx) : data_(v.data) {
    if (v.device == Device::CPU || !v.present()) return;
    copy_.resize(static_cast<size_t>(v.numel()) * dtype_size(v.dtype));
    download_view(v, copy_.data(), ctx);
    data_ = copy_.data();
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }

 private:
  std::vector<uint8_t> copy_;
  const void* data_ = nullptr;
};

}  // namespace dsv41kv::detail
