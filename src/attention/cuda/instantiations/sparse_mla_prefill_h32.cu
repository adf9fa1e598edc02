// The sparse MLA mainloop for 32-row head tiles over the bf16 workspace (prefill).
#include "attention/cuda/sparse_mla.cuh"

namespace dsv41kv::detail::cuda::mla {
DSV41KV_INSTANTIATE_SPARSE_MLA(32, WorkspaceSource)
}  // namespace dsv41kv::detail::cuda::mla
