// Internal contract between the public attention API (validation + dispatch, attention.cpp), its
// validation (plan.cpp), the planning of schedules and chunks (schedule.cpp) and the CPU backend
// (cpu.cpp). plan_*() checks dtypes, shapes, strides, devices and scalars and returns the derived
// sizes; check_*_values() additionally checks host index data. Both run before anything is
// written. Device views go to the CUDA backend (cuda/backend_cuda.hpp) through core/dispatch.hpp.
#pragma once

#include <cstdint>
#include <string>

#include "core/cpu_form.hpp"
#include "dsv41kv/attention.hpp"

namespace dsv41kv::detail {

// The query, output and lse views of an attention op: q [T, H, 512], out [rows >= T, H, 512],
// lse [rows >= T, H] (strides in elements).
struct HeadsPlan {
  int64_t T = 0;
  int H = 0;
  int64_t q_tok = 0, q_head = 0;      // q strides
  int64_t out_tok = 0, out_head = 0;  // out strides
  int64_t lse_tok = 0;                // lse row stride (heads contiguous)
};

struct DecodePlan {
  Device device = Device::CPU;
  HeadsPlan heads;
  bool with_cmp = false;
  int64_t swa_row_stride = 0, cmp_row_stride = 0;
  int64_t swa_capacity = 0, cmp_capacity = 0;  // num_pages * states_per_page
  int64_t splits = 1;
  int64_t key_blocks = 0;
};
DecodePlan plan_sparse_decode(const SparseDecodeArgs& a);
void check_sparse_decode_values(const SparseDecodeArgs& a, const DecodePlan& p);

struct PrefillPlan {
  Device device = Device::CPU;
  HeadsPlan heads;
  int64_t s_kv = 0, kv_row_stride = 0;
  int64_t topk = 0, idx_row_stride = 0;
};
PrefillPlan plan_sparse_prefill(const SparsePrefillArgs& a);
void check_sparse_prefill_values(const SparsePrefillArgs& a, const PrefillPlan& p);

struct GatherPlan {
  Device device = Device::CPU;
  int64_t R = 0;  // prefill requests the per-request views describe
  int64_t ws_row_stride = 0;
  int64_t swa_bt_stride = 0, swa_bt_cols = 0;
  int64_t cmp_bt_stride = 0, cmp_bt_cols = 0;
};
GatherPlan plan_prefill_gather(const WorkspaceGatherArgs& a);
void check_prefill_gather_values(const WorkspaceGatherArgs& a, const GatherPlan& p);

struct IndexPlan {
  Device device = Device::CPU;
  int64_t T = 0, R = 0;
  int64_t topk_row_stride = 0, idx_row_stride = 0;
};
IndexPlan plan_prefill_indices(const PrefillIndexArgs& a);
void check_prefill_index_values(const PrefillIndexArgs& a, const IndexPlan& p);

struct OutputRopePlan {
  Device device = Device::CPU;
  int64_t T = 0;
  int H = 0, H_real = 0;
  int64_t o_tok = 0, o_head = 0, out_tok = 0, out_head = 0;
  int64_t table_rows = 0;
};
OutputRopePlan plan_output_rope(const OutputRopeArgs& a);
void check_output_rope_values(const OutputRopeArgs& a, const OutputRopePlan& p);

// Whether H is one of kAttentionHeadCounts, and that list as text for messages.
bool attention_head_count_ok(int64_t H);
std::string attention_head_counts();

// The split count of T query rows with at most key_blocks key blocks each on `threads` threads:
// enough work items to use every thread when T is small (the decode schedule; the prefill op
// plans its own with it). Never changes a result.
int64_t plan_splits(int64_t T, int64_t key_blocks, int threads);

// The CUDA decode schedule of T query rows of H heads with at most key_blocks key blocks on a
// device of `sms` SMs: the head tile (16 for H <= 16, 32 for 32, else 64; 16 when even
// single-block splits of 64-head tiles would leave SMs idle) and enough splits to give every SM
// a CTA when T * head groups < sms (1 otherwise: batch 64+ of 64 heads needs no split).
struct CudaDecodePlan {
  int64_t splits = 1;
  int head_tile = 64;
};
CudaDecodePlan plan_cuda_decode(int64_t T, int H, int64_t key_blocks, int sms);
// A head tile the CUDA kernels have for H heads (DecodeSchedule::head_tile).
bool cuda_head_tile_ok(int H, int head_tile);

namespace cpu {
// The attention ops with their block loops in `form` (the API takes the fastest this CPU runs; the
// tests force each to show that both give the same bits).
void sparse_decode(const SparseDecodeArgs& a, const DecodePlan& p, const ExecContext& ctx,
                   CpuForm form = fastest_cpu_form());
void sparse_prefill(const SparsePrefillArgs& a, const PrefillPlan& p, const ExecContext& ctx,
                    CpuForm form = fastest_cpu_form());
void gather_prefill_workspace(const WorkspaceGatherArgs& a, const GatherPlan& p, const ExecContext& ctx);
void build_prefill_indices(const PrefillIndexArgs& a, const IndexPlan& p, const ExecContext& ctx);
void attention_output_rope(const OutputRopeArgs& a, const OutputRopePlan& p, const ExecContext& ctx);
}  // namespace cpu

}  // namespace dsv41kv::detail
