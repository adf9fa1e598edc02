// dsv41kv: the PCP layer step (SPEC 7.5, 7.6) on the GPU, and a host-mirrored device rank for
// the simulation behind `dsv41kv run --device cuda`.
//
// pcp_layer_step_cuda takes the same LayerStepArgs as pcp_layer_step (pcp.hpp) with every view
// on Device::CUDA and a Communicator that supports Device::CUDA buffers (NcclCommunicator, or a
// ThreadGroup constructed with Device::CUDA). Everything is ordered on a.exec.stream:
//   link: link_local_keys_cuda -> all_gather(keys) -> link_resolve_cuda (pcp_cuda.hpp);
//   last rows: a gather kernel -> all_gather(rows);
//   compress (RingPolicy::kOpenRow) -> save_ring_rows -> all_gather(latents) -> insert per cache,
// all through the public API on device views (which dispatches to the CUDA kernels, bit-identical
// to the CPU path). At the end the stream is synchronised once and the link (and the gathered
// last rows) are copied to the host into LayerStepResult, so that callers can audit it exactly
// as they audit the host step. Scratch lives in a caller-owned, grow-only workspace.
//
// Not supported on the device: the test seam's fault kReverseTieBreak (the CUB sort is stable by
// gathered index; E8). The other faults behave as on the host.
#pragma once

#include <memory>

#include "dsv41kv/comm.hpp"
#include "dsv41kv/pcp.hpp"

namespace dsv41kv::pcp {

// Grow-only device scratch of pcp_layer_step_cuda (keys, link outputs, last rows, the link's
// CUB workspace). Allocates on the current device on first use; E8 in a build without CUDA.
class LayerStepDeviceWorkspace {
 public:
  LayerStepDeviceWorkspace();
  ~LayerStepDeviceWorkspace();
  LayerStepDeviceWorkspace(const LayerStepDeviceWorkspace&) = delete;
  LayerStepDeviceWorkspace& operator=(const LayerStepDeviceWorkspace&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

LayerStepResult pcp_layer_step_cuda(const LayerStepArgs& a, Communicator& comm,
                                    LayerStepDeviceWorkspace& ws);

// One rank of the simulation with its state on a GPU. `step` takes LayerStepArgs of host views
// (the simulation's own buffers): the per-step inputs are uploaded, the ring and the compressed
// caches are device-resident (uploaded from the host buffers at the first step that names them,
// keyed by host pointer, and from then on the device copy is the state), pcp_layer_step_cuda
// runs on them, and afterwards the ring, the caches, the local and the gathered latents are
// downloaded into the host buffers of `a` (so that a host-side check sees the GPU's bytes).
class DeviceRank {
 public:
  // Uses CUDA device `cuda_device` (made current on every call) and a stream of its own.
  explicit DeviceRank(int cuda_device);
  ~DeviceRank();
  DeviceRank(const DeviceRank&) = delete;
  DeviceRank& operator=(const DeviceRank&) = delete;

  LayerStepResult step(const LayerStepArgs& host_args, Communicator& comm);
  // A host-buffer all-gather over a device communicator (upload, gather on the device,
  // download); for the once-per-step positions.
  void all_gather_host(Communicator& comm, const void* send, size_t bytes_per_rank, void* recv);
  // Milliseconds of the last step on the device (CUDA events around pcp_layer_step_cuda, the
  // uploads and downloads excluded).
  double last_step_ms() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41kv::pcp
