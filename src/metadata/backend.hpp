// Internal contract between the public metadata API (validation + dispatch, metadata.cpp) and
// the CUDA backend (*.cu). metadata.cpp validates every argument on the host before dispatch:
// presence, dtypes, ndim, shapes, contiguity/strides, one device per call, N consistency and
// the scalar arguments (ratio in {1, 2}, page/cap/states_per_page > 0,
// 0 <= num_actual_tokens <= N). Value checks (qsl monotone, request indices, positions, block
// ids) are host-only, so for device views the CUDA builders must bound every index they
// dereference and emit -1 (or, for token_to_req, 0) instead of reading out of range:
//   - token_to_req index j outside [0, ring/block table rows) -> slot -1;
//   - logical page p / page (or s / S_r) >= table columns        -> slot -1;
//   - negative positions                                        -> slot -1;
//   - ids >= num_ring_blocks / num_pages when those are >= 0     -> slot -1.
// Results must be bit-identical to the CPU builders for valid inputs (SPEC 0.4 item 2); the
// launch geometry depends only on N; nothing is synchronised or allocated.
#pragma once

#include "dsv41kv/metadata.hpp"

namespace dsv41kv::detail {

#if defined(DSV41KV_WITH_CUDA)
namespace cuda {
// args.num_actual_tokens == -1 means qsl[num_reqs] (read on the device).
void build_token_to_req(const TokenToReqArgs& args, const ExecContext& ctx);
void build_ring_slots(const RingSlotArgs& args, const ExecContext& ctx);
void build_token_slots(const TokenSlotArgs& args, const ExecContext& ctx);
// args.ratio is 1 or 2; args.token_slots may be absent (ndim 0: every token valid).
void build_compressed_slots(const CompressedSlotArgs& args, const ExecContext& ctx);
}  // namespace cuda
#endif

// The read path's decode-step builders (read_path.cpp validates; declared in every build, defined
// in CUDA builds only, as core/dispatch.hpp expects). `split` is the host's split of qsl; every
// row of [0, max_tokens) is written from device data alone: the request of decode token t is the
// largest j < num_decodes with qsl[j] <= t, found on the device; an index the kernel cannot use
// gives -1 (a row entry) or an invalid token's row (a negative position, a request outside the
// block table).
namespace cuda {
void build_swa_window(const SwaWindowArgs& args, const DecodeSplit& split, const ExecContext& ctx);
void build_decode_topk_slots(const DecodeTopkSlotArgs& args, const DecodeSplit& split, const ExecContext& ctx);
void build_token_valid(const TensorView& slot_swa, const TensorView& token_valid, const ExecContext& ctx);
void mask_invalid_lengths(const TensorView& token_valid, const TensorView& lengths, const ExecContext& ctx);
}  // namespace cuda

}  // namespace dsv41kv::detail
