// dsv41kv: the PCP link of SPEC 7.4 on the GPU, for CUDA builds. Same results as the host
// link (pcp.hpp: link_local_keys / link_resolve with TieBreak::kGatheredIndex), bit for bit,
// computed from device views on ctx.stream: keys by a kernel, the sort by CUB's stable radix
// sort (ties therefore stay in gathered-index order, DECISION 13), the ring write slots and
// the predecessor lookups (lower_bound) by a kernel. Nothing is allocated per call (the CUB
// temporary storage lives in a caller-owned LinkDeviceWorkspace), nothing synchronises, and the
// launch geometry depends only on N, num_reqs, P and max_num_seqs, so the calls can be captured
// in a CUDA graph. The all-gather of the keys between the two halves is the caller's (NCCL or a
// device copy). No CUDA type appears here: streams travel as ExecContext::stream (void*).
//
// Value checks of the host link (qsl monotone, positions < 2^31, E10 for a non-empty request
// at j >= num_rows) need host memory and are not made: requests j >= num_rows are ignored, and
// the caller (who planned the batch on the host, pcp::plan_pcp_step) is responsible for them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dsv41kv/common.hpp"

namespace dsv41kv::pcp {

// Device scratch of the link for up to `max_keys` = P * num_rows gathered keys: CUB's temporary
// storage and the gathered-index sequence. Allocates in the constructor (cudaMalloc on the
// current device) and frees in the destructor; throws Error(kCuda) on failure and E8 for a
// built-without-CUDA library.
class LinkDeviceWorkspace {
 public:
  explicit LinkDeviceWorkspace(int64_t max_keys);
  ~LinkDeviceWorkspace();
  LinkDeviceWorkspace(const LinkDeviceWorkspace&) = delete;
  LinkDeviceWorkspace& operator=(const LinkDeviceWorkspace&) = delete;

  int64_t max_keys() const { return max_keys_; }
  void* temp() const { return temp_; }
  size_t temp_bytes() const { return temp_bytes_; }
  int64_t* indices() const { return indices_; }

 private:
  int64_t max_keys_ = 0;
  void* temp_ = nullptr;
  size_t temp_bytes_ = 0;
  int64_t* indices_ = nullptr;  // [max_keys]: 0, 1, 2, ...
};

// One rank's local batch (device views).
struct LinkDeviceInput {
  TensorView ring_slots;  // i64 [N] local ring slots (SPEC 6.3, N = padded)
  TensorView qsl;         // i32 [num_reqs + 1]
  TensorView positions;   // i64 [>= N]
  int64_t cap = 8;
  int64_t max_num_seqs = 0;
};

// num_rows = min(N, 2 * max_num_seqs) and R = min(num_reqs, num_rows) from the shapes.
int64_t link_device_num_rows(const LinkDeviceInput& in);
int64_t link_device_R(const LinkDeviceInput& in);

// First half: local_keys[j] (i64 [num_rows]) and gather_tokens[j] (i64 [num_rows]).
void link_local_keys_cuda(const LinkDeviceInput& in, const TensorView& local_keys,
                          const TensorView& gather_tokens, const ExecContext& ctx = {});

// Second half, from the gathered keys of all P ranks (i64 [P * num_rows], rank-major):
// sorted_keys, order and ring_write_slots (i64 [P * num_rows]) and prev_row_indices (i64 [R]).
struct LinkDeviceOutputs {
  TensorView sorted_keys;
  TensorView order;
  TensorView ring_write_slots;
  TensorView prev_row_indices;
};
void link_resolve_cuda(const LinkDeviceInput& in, const TensorView& all_keys, int P,
                       LinkDeviceWorkspace& ws, const LinkDeviceOutputs& out,
                       const ExecContext& ctx = {});

}  // namespace dsv41kv::pcp
