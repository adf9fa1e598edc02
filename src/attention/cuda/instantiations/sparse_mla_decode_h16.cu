// The sparse MLA mainloop for 16-row head tiles over the paged caches (decode).
#include "attention/cuda/sparse_mla.cuh"

namespace dsv41kv::detail::cuda::mla {
DSV41KV_INSTANTIATE_SPARSE_MLA(16, CacheSource)
}  // namespace dsv41kv::detail::cuda::mla
