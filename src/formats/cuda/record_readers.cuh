// Device readers of the record formats (SPEC 5.3): the dequantized bf16 values of E consecutive
// dims of one state, element-wise the readers of records.hpp (rec::read_*), so the same bits as the
// CPU's gather. The gather kernel reads a state with them today; the sparse-attention kernels will
// read their keys and values through the same functions.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsv41kv/records.hpp"
#include "formats/cuda/record_writers.cuh"

namespace dsv41kv::detail::cuda {

// The bf16 bits of dims [d0, d0 + E) of state r of the page at `pg` (S states per page; plain rows
// at pg + r * row_stride_bytes; fp8_scale: sigma of plain fp8 rows). F: a RecordFormat value.
template <int F, int E>
__device__ __forceinline__ void read_record_dims(const uint8_t* pg, int64_t S, int64_t r, int64_t row_stride_bytes,
                                                 float fp8_scale, int d0, uint16_t (&o)[E]) {
  if constexpr (F == kBf16) {
    const auto* row = reinterpret_cast<const uint16_t*>(pg + r * row_stride_bytes);
#pragma unroll
    for (int k = 0; k < E; ++k) o[k] = row[d0 + k];
  } else {
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const int d = d0 + k;
      if constexpr (F == kV4) o[k] = rec::read_v4_584(pg, S, r, d);
      else if constexpr (F == kMx) o[k] = rec::read_mxfp8_528(pg, S, r, d);
      else if constexpr (F == kNv) o[k] = rec::read_nvfp4_288(pg, S, r, d);
      else o[k] = rec::read_plain_fp8(pg + r * row_stride_bytes, d, fp8_scale);
    }
  }
}

}  // namespace dsv41kv::detail::cuda
