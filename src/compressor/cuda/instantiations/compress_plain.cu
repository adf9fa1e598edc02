// Instantiation of the fused compress kernel family for one record writer (kBf16): ratio 1/2 x
// one-warp/four-warp programs. See ../launcher.cuh.
#include "compressor/cuda/launcher.cuh"

namespace dsv41kv::detail::cuda {
template void launch_compress<kBf16>(const CompressParams&, int, cudaStream_t, bool, const CompressTuning&);
template void launch_compress<kFp8>(const CompressParams&, int, cudaStream_t, bool, const CompressTuning&);
}  // namespace dsv41kv::detail::cuda
