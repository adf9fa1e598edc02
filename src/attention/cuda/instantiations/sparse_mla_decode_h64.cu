// The sparse MLA warpgroup (wgmma) mainloop for 64-row head tiles over the paged caches (decode).
#include "attention/cuda/sparse_mla_wgmma.cuh"

namespace dsv41kv::detail::cuda::mla {
DSV41KV_INSTANTIATE_SPARSE_MLA(64, CacheSource)
}  // namespace dsv41kv::detail::cuda::mla
