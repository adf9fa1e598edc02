// The device-independent tail of one rank's PCP layer step (SPEC 7.5-7.6), shared by the host
// step (layer_step.cpp) and the device step (layer_step_cuda.cpp): the open-row compress,
// save_ring_rows, the all-gather of the latents and the inserts over the gathered rows. The
// views say where the data lives; the public API dispatches on that.
#pragma once

#include <cstdint>
#include <span>

#include "dsv41kv/comm.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/pcp.hpp"

namespace dsv41kv::pcp {
// link.cpp: the link with ties by ascending (DECISION 13) or, for the test seam, descending
// gathered index.
LinkResult link_resolve_ties(const LinkInput& in, const LinkLocal& local, std::span<const int64_t> all_keys, int P,
                             bool reversed_ties);
LinkResult link_pcp_chunks_ties(const LinkInput& in, Communicator& comm, bool reversed_ties);
}  // namespace dsv41kv::pcp

namespace dsv41kv::pcp::step_common {

// The fault the test seam injects into a layer step (none in builds without DSV41KV_TEST_SEAMS).
struct StepFaults {
  bool drop_gathered_predecessors = false;  // every prev_row_indices -1 (ring reads instead)
  bool reverse_tie_break = false;           // link ties by descending gathered index
  bool skip_save_ring_rows = false;
};
inline StepFaults faults_of([[maybe_unused]] const LayerStepArgs& a) {
  StepFaults f;
#if defined(DSV41KV_TEST_SEAMS)
  f.drop_gathered_predecessors = a.fault == seam::PcpFault::kDropGatheredPredecessors;
  f.reverse_tie_break = a.fault == seam::PcpFault::kReverseTieBreak;
  f.skip_save_ring_rows = a.fault == seam::PcpFault::kSkipSaveRingRows;
#endif
  return f;
}

// E8 "<op>: <name>: ..." unless `v` is a view on `device` of dtype `dt` with >= rows rows:
// cols == 0: contiguous 1-D; else [>= rows, cols] with inner stride 1.
void check_view(const char* op, const TensorView& v, const char* name, DType dt, int64_t rows,
                int64_t cols, Device device);

// The views every layer step needs, all on `device`: positions [padded], kv_score
// [padded, 512*ratio], latent [padded, 512] contiguous, gathered latent/positions/compressed
// slots [P*padded]. Returns padded (E8 naming `op` and the argument otherwise).
int64_t check_step_views(const char* op, const LayerStepArgs& a, int P, Device device);

// compress() with policy kOpenRow (ratio 2) or the plain ratio-1 compress, then, for ratio 2,
// save_ring_rows() (unless the test mutation skips it).
//   slot_mapping      i64 [padded]: ring slots (ratio 2) or this rank's chunk of the gathered
//                     compressed slots (ratio 1)
//   prev_rows         f32 [Gr, 1024] gathered last rows, or absent (Gr == 0)
//   prev_row_indices  i64 [R], or absent (R == 0)
//   ring_write_slots  i64 [Gr] (ratio 2 with Gr > 0)
void open_row_compress(const LayerStepArgs& a, int64_t padded, const TensorView& slot_mapping,
                       const TensorView& prev_rows, const TensorView& prev_row_indices,
                       const TensorView& ring_write_slots, const ExecContext& ctx);

// All-gathers this rank's latents ([padded, 512] bf16) into a.gathered_latent and inserts
// every gathered closing token into every cache of the rank (every rank writes each one once).
void gather_latents_and_insert(const LayerStepArgs& a, Communicator& comm, int64_t padded,
                               Device device, const ExecContext& ctx);

// The bytes a layer step moves: SPEC 7.7 (expected_comm_volume) without the positions, which
// are gathered once per step outside the layer.
CommVolume layer_volume(int P, int64_t padded, int64_t num_rows, int ratio);

}  // namespace dsv41kv::pcp::step_common
