// Instantiation of the fused compress kernel family for one record writer (kMx): ratio 1/2 x
// one-warp/four-warp programs. See ../launcher.cuh.
#include "compressor/cuda/launcher.cuh"

namespace dsv41kv::detail::cuda {
template void launch_compress<kMx>(const CompressParams&, int, cudaStream_t, bool, const CompressTuning&);

}  // namespace dsv41kv::detail::cuda
