// One kv-source layer of one PCP rank (SPEC 7.5, 7.6) and the communication accounting of
// SPEC 7.7.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "dsv41kv/compressor.hpp"
#include "dsv41kv/pcp.hpp"
#include "pcp/layer_step_common.hpp"

namespace dsv41kv::pcp {

CommVolume& CommVolume::operator+=(const CommVolume& o) {
  keys_sent += o.keys_sent;
  keys_received += o.keys_received;
  positions_sent += o.positions_sent;
  positions_received += o.positions_received;
  rows_sent += o.rows_sent;
  rows_received += o.rows_received;
  latents_sent += o.latents_sent;
  latents_received += o.latents_received;
  swa_kv_sent += o.swa_kv_sent;
  swa_kv_received += o.swa_kv_received;
  replaced_received += o.replaced_received;
  return *this;
}

CommVolume expected_comm_volume(int P, int64_t padded, int64_t num_rows, int ratio, bool swa_kv) {
  if (P < 1 || padded < 0 || num_rows < 0 || (ratio != 1 && ratio != 2))
    invalid_argument(fmt::format(
        "expected_comm_volume: P = {}, padded = {}, num_rows = {}, ratio = {} (expected P >= 1, "
        "counts >= 0, ratio 1 or 2)", P, padded, num_rows, ratio));
  const uint64_t p = static_cast<uint64_t>(P), n = static_cast<uint64_t>(padded),
                 m = static_cast<uint64_t>(num_rows);
  CommVolume v;
  v.positions_sent = n * 8;
  v.positions_received = p * n * 8;
  v.latents_sent = n * kLatentDim * 2;
  v.latents_received = p * n * kLatentDim * 2;
  if (swa_kv) {
    v.swa_kv_sent = n * kLatentDim * 2;
    v.swa_kv_received = p * n * kLatentDim * 2;
  }
  if (ratio == 2) {
    v.keys_sent = m * 8;
    v.keys_received = p * m * 8;
    v.rows_sent = m * kRingRowFloats * 4;
    v.rows_received = p * m * kRingRowFloats * 4;
    v.replaced_received = p * n * kRingRowFloats * 4;
  }
  return v;
}

namespace {

void check_view(const TensorView& v, const char* name, DType dt, int64_t rows, int64_t cols) {
  step_common::check_view("pcp_layer_step", v, name, dt, rows, cols, Device::CPU);
}

}  // namespace

LayerStepResult pcp_layer_step(const LayerStepArgs& a, Communicator& comm) {
  const int P = comm.size();
  const int rank = comm.rank();
  if (a.ratio != 1 && a.ratio != 2)
    fail(ErrorCode::kCompressorRatio,
         fmt::format("pcp_layer_step: ratio = {} (expected 1 or 2)", a.ratio));
  const int64_t padded = step_common::check_step_views("pcp_layer_step", a, P, Device::CPU);

  LayerStepResult res;
  const auto* kv = a.kv_score.ptr<const float>();
  const int64_t kv_stride = a.kv_score.stride[0];

  TensorView slot_mapping;
  std::vector<float> gathered_rows;  // ratio 2: [P * num_rows, 1024] the ranks' last rows
  if (a.ratio == 2) {
    check_view(a.qsl, "qsl", DType::I32, 1, 0);
    check_view(a.ring_slots, "ring_slots", DType::I64, padded, 0);
    check_view(a.token_to_req, "token_to_req", DType::I32, padded, 0);
    LinkInput in;
    in.ring_slots = {a.ring_slots.ptr<const int64_t>(), static_cast<size_t>(padded)};
    in.qsl = {a.qsl.ptr<const int32_t>(), static_cast<size_t>(a.qsl.shape[0])};
    in.positions = {a.positions.ptr<const int64_t>(), static_cast<size_t>(padded)};
    in.cap = a.cap;
    in.max_num_seqs = a.max_num_seqs;
    res.link = link_pcp_chunks_ties(in, comm, step_common::faults_of(a).reverse_tie_break);
    const int64_t rows = res.link.num_rows;
    // Last rows of this rank's local requests, then the all-gather (SPEC 7.5).
    std::vector<float> send(static_cast<size_t>(rows) * kRingRowFloats);
    for (int64_t j = 0; j < rows; ++j)
      std::memcpy(send.data() + j * kRingRowFloats,
                  kv + res.link.gather_tokens[static_cast<size_t>(j)] * kv_stride,
                  sizeof(float) * kRingRowFloats);
    gathered_rows.assign(static_cast<size_t>(P) * send.size(), 0.0f);
    comm.all_gather(send.data(), send.size() * sizeof(float), gathered_rows.data());
    slot_mapping = a.ring_slots;
    slot_mapping.shape[0] = padded;
  } else {
    // Ratio 1 under PCP: no ring, no collective in the compressor; the validity mask is this
    // rank's chunk of the gathered compressed slot mapping.
    slot_mapping = TensorView::contiguous(a.gathered_cslots.ptr<int64_t>() + rank * padded,
                                          DType::I64, {padded});
  }

  // What compress() reads: the link's lookups (the seam's drop fault replaces them by ring reads).
  std::vector<int64_t> indices = res.link.prev_row_indices;
  if (step_common::faults_of(a).drop_gathered_predecessors) std::fill(indices.begin(), indices.end(), -1);
  TensorView prev_rows, prev_idx, wslots;
  const int64_t Gr = static_cast<int64_t>(gathered_rows.size()) / kRingRowFloats;
  if (a.ratio == 2 && Gr > 0) {
    prev_rows = TensorView::contiguous(gathered_rows.data(), DType::F32, {Gr, kRingRowFloats});
    wslots = TensorView::contiguous(res.link.ring_write_slots.data(), DType::I64, {Gr});
  }
  if (a.ratio == 2 && res.link.R > 0)
    prev_idx = TensorView::contiguous(indices.data(), DType::I64, {res.link.R});
  step_common::open_row_compress(a, padded, slot_mapping, prev_rows, prev_idx, wslots, a.exec);

  // Latents of every rank, then every rank inserts every closing token once (SPEC 7.6).
  step_common::gather_latents_and_insert(a, comm, padded, Device::CPU, a.exec);
  res.volume = step_common::layer_volume(P, padded, res.link.num_rows, a.ratio);
  return res;
}

}  // namespace dsv41kv::pcp
