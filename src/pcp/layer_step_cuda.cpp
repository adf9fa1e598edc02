// The PCP layer step on the GPU (pcp_step_cuda.hpp): the device twin of layer_step.cpp, built
// from the device link (link_cuda.cu), the communicator's device all-gathers and the public
// compress / save_ring_rows / insert entry points on device views. Host code (compiled by the
// host compiler); its one kernel is in layer_step_cuda_kernels.cu. CUDA builds only
// (layer_step_cuda_stub.cpp otherwise).
#if defined(DSV41KV_WITH_CUDA)
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "core/cuda/cuda_util.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/pcp_cuda.hpp"
#include "dsv41kv/pcp_step_cuda.hpp"
#include "pcp/layer_step_common.hpp"

namespace dsv41kv::pcp {

// layer_step_cuda_kernels.cu: out[j, 0:1024) = kv[tokens[j] * kv_stride + 0:1024), j < rows.
void launch_gather_last_rows(const float* kv, int64_t kv_stride, const int64_t* tokens, float* out, int64_t rows,
                             cudaStream_t stream);

namespace {

using detail::as_stream;

// Grow-only device allocation.
struct DevBuf {
  void* p = nullptr;
  size_t cap = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void* ensure(size_t bytes) {
    if (bytes <= cap && p) return p;
    if (p) {
      DSV41KV_CUDA_CHECK(cudaFree(p));
      p = nullptr;
      cap = 0;
    }
    const size_t n = std::max<size_t>(bytes, 256);
    DSV41KV_CUDA_CHECK(cudaMalloc(&p, n));
    cap = n;
    return p;
  }
  template <class T>
  T* as(size_t count) {
    return static_cast<T*>(ensure(count * sizeof(T)));
  }
};

void require(bool ok, const std::string& what) {
  if (!ok) invalid_argument("pcp_layer_step_cuda: " + what);
}

void check_view(const TensorView& v, const char* name, DType dt, int64_t rows, int64_t cols) {
  step_common::check_view("pcp_layer_step_cuda", v, name, dt, rows, cols, Device::CUDA);
}

template <class T>
std::vector<T> download(const T* d, int64_t n, cudaStream_t s) {
  std::vector<T> h(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (n > 0) DSV41KV_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, sizeof(T) * static_cast<size_t>(n), cudaMemcpyDeviceToHost, s));
  return h;
}

}  // namespace

struct LayerStepDeviceWorkspace::Impl {
  DevBuf local_keys, gather_tokens, all_keys, sorted_keys, order, ring_write_slots, prev_idx, drop_idx;
  DevBuf send_rows, prev_rows;
  std::unique_ptr<LinkDeviceWorkspace> link;
  LinkDeviceWorkspace& link_ws(int64_t keys) {
    if (!link || link->max_keys() < keys) {
      link.reset();
      link = std::make_unique<LinkDeviceWorkspace>(std::max<int64_t>(keys, 64));
    }
    return *link;
  }
};

LayerStepDeviceWorkspace::LayerStepDeviceWorkspace() : impl_(new Impl) {}
LayerStepDeviceWorkspace::~LayerStepDeviceWorkspace() = default;

LayerStepResult pcp_layer_step_cuda(const LayerStepArgs& a, Communicator& comm, LayerStepDeviceWorkspace& wsp) {
  LayerStepDeviceWorkspace::Impl& ws = wsp.impl();
  const int P = comm.size();
  const int rank = comm.rank();
  if (a.ratio != 1 && a.ratio != 2)
    fail(ErrorCode::kCompressorRatio, fmt::format("pcp_layer_step_cuda: ratio = {} (expected 1 or 2)", a.ratio));
  require(comm.supports(Device::CUDA),
          fmt::format("communicator of rank {} does not gather device buffers (expected NcclCommunicator or "
                      "ThreadGroup(P, Device::CUDA))", rank));
  require(!step_common::faults_of(a).reverse_tie_break,
          "fault reverse-tie-break: not available on the device (the CUB sort is stable by gathered index)");
  const int64_t padded = step_common::check_step_views("pcp_layer_step_cuda", a, P, Device::CUDA);

  ExecContext ctx = a.exec;
  const cudaStream_t stream = as_stream(ctx.stream);
  LayerStepResult res;
  TensorView slot_mapping;
  int64_t rows = 0, R = 0;
  int64_t *d_all = nullptr, *d_sorted = nullptr, *d_order = nullptr, *d_wslots = nullptr, *d_idx = nullptr,
          *d_gt = nullptr;
  float* d_prev = nullptr;
  if (a.ratio == 2) {
    check_view(a.qsl, "qsl", DType::I32, 1, 0);
    check_view(a.ring_slots, "ring_slots", DType::I64, padded, 0);
    check_view(a.token_to_req, "token_to_req", DType::I32, padded, 0);
    LinkDeviceInput in;
    in.ring_slots = a.ring_slots;
    in.ring_slots.shape[0] = padded;
    in.qsl = a.qsl;
    in.positions = a.positions;
    in.cap = a.cap;
    in.max_num_seqs = a.max_num_seqs;
    rows = link_device_num_rows(in);
    R = link_device_R(in);
    const int64_t GR = static_cast<int64_t>(P) * rows;
    int64_t* d_lk = ws.local_keys.as<int64_t>(static_cast<size_t>(rows));
    d_gt = ws.gather_tokens.as<int64_t>(static_cast<size_t>(rows));
    d_all = ws.all_keys.as<int64_t>(static_cast<size_t>(GR));
    d_sorted = ws.sorted_keys.as<int64_t>(static_cast<size_t>(GR));
    d_order = ws.order.as<int64_t>(static_cast<size_t>(GR));
    d_wslots = ws.ring_write_slots.as<int64_t>(static_cast<size_t>(GR));
    d_idx = ws.prev_idx.as<int64_t>(static_cast<size_t>(R));
    float* d_send = ws.send_rows.as<float>(static_cast<size_t>(rows) * kRingRowFloats);
    d_prev = ws.prev_rows.as<float>(static_cast<size_t>(GR) * kRingRowFloats);
    auto v64 = [](int64_t* p, int64_t n) { return TensorView::contiguous(p, DType::I64, {n}, Device::CUDA); };
    // The link (SPEC 7.4): local keys, their all-gather, the sort and the lookups.
    if (rows > 0) link_local_keys_cuda(in, v64(d_lk, rows), v64(d_gt, rows), ctx);
    comm.all_gather(d_lk, static_cast<size_t>(rows) * sizeof(int64_t), d_all, Device::CUDA, ctx);
    if (rows > 0) {
      LinkDeviceOutputs out;
      out.sorted_keys = v64(d_sorted, GR);
      out.order = v64(d_order, GR);
      out.ring_write_slots = v64(d_wslots, GR);
      if (R > 0) out.prev_row_indices = v64(d_idx, R);
      link_resolve_cuda(in, v64(d_all, GR), P, ws.link_ws(GR), out, ctx);
      // Last rows of this rank's local requests (SPEC 7.5).
      launch_gather_last_rows(a.kv_score.ptr<const float>(), a.kv_score.stride[0], d_gt, d_send, rows, stream);
    }
    comm.all_gather(d_send, static_cast<size_t>(rows) * kRingRowFloats * sizeof(float), d_prev, Device::CUDA, ctx);
    slot_mapping = a.ring_slots;
    slot_mapping.shape[0] = padded;
  } else {
    slot_mapping = TensorView::contiguous(a.gathered_cslots.ptr<int64_t>() + rank * padded, DType::I64, {padded},
                                          Device::CUDA);
  }

  // What compress() reads: the link's lookups (the seam's drop fault replaces them by ring reads).
  int64_t* d_use_idx = d_idx;
  if (a.ratio == 2 && R > 0 && step_common::faults_of(a).drop_gathered_predecessors) {
    d_use_idx = ws.drop_idx.as<int64_t>(static_cast<size_t>(R));
    DSV41KV_CUDA_CHECK(cudaMemsetAsync(d_use_idx, 0xFF, static_cast<size_t>(R) * sizeof(int64_t), stream));
  }
  const int64_t Gr = static_cast<int64_t>(P) * rows;
  TensorView prev_rows, prev_idx, wslots;
  if (a.ratio == 2 && Gr > 0) {
    prev_rows = TensorView::contiguous(d_prev, DType::F32, {Gr, kRingRowFloats}, Device::CUDA);
    wslots = TensorView::contiguous(d_wslots, DType::I64, {Gr}, Device::CUDA);
  }
  if (a.ratio == 2 && R > 0) prev_idx = TensorView::contiguous(d_use_idx, DType::I64, {R}, Device::CUDA);
  step_common::open_row_compress(a, padded, slot_mapping, prev_rows, prev_idx, wslots, ctx);

  // Latents of every rank, then every rank inserts every closing token once (SPEC 7.6).
  step_common::gather_latents_and_insert(a, comm, padded, Device::CUDA, ctx);
  res.volume = step_common::layer_volume(P, padded, rows, a.ratio);

  // Everything above, the collectives included, has to finish before the link comes back: wait
  // through the communicator so that a dead peer becomes its kComm error (NCCL: bounded by its
  // timeout, then ncclCommAbort) instead of a host blocked for ever. This comes before the
  // downloads because a device-to-pageable copy blocks the host like a synchronisation.
  comm.wait_device(stream);
  // The link and the gathered last rows on the host (one synchronisation per step).
  if (a.ratio == 2) {
    LinkResult& L = res.link;
    L.num_rows = rows;
    L.R = R;
    L.sorted_keys = rows > 0 ? download(d_sorted, Gr, stream) : std::vector<int64_t>(static_cast<size_t>(Gr), 0);
    L.order = rows > 0 ? download(d_order, Gr, stream) : std::vector<int64_t>(static_cast<size_t>(Gr), 0);
    L.ring_write_slots = rows > 0 ? download(d_wslots, Gr, stream) : std::vector<int64_t>(static_cast<size_t>(Gr), -1);
    L.prev_row_indices = download(d_idx, R, stream);
    L.gather_tokens = download(d_gt, rows, stream);
  }
  DSV41KV_CUDA_CHECK(cudaStreamSynchronize(stream));
  return res;
}

// ---------------------------------------------------------------- DeviceRank

struct DeviceRank::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
  double last_ms = 0;
  LayerStepDeviceWorkspace ws;
  // Per-step inputs and outputs, by role.
  DevBuf kv, positions, qsl, t2r, ring_slots, norm_w, gpos, gcslots, rope, latent, glatent, gather_send, gather_recv;
  // Device-resident state keyed by host pointer: ring and caches.
  std::map<const void*, std::unique_ptr<DevBuf>> resident;

  void set_device() const { DSV41KV_CUDA_CHECK(cudaSetDevice(device)); }

  static size_t extent_bytes(const TensorView& v) {
    if (!v.present()) return 0;
    int64_t last = 0;
    for (int d = 0; d < v.ndim; ++d) {
      if (v.shape[static_cast<size_t>(d)] <= 0) return 0;
      last += (v.shape[static_cast<size_t>(d)] - 1) * v.stride[static_cast<size_t>(d)];
    }
    return static_cast<size_t>(last + 1) * dtype_size(v.dtype);
  }
  // A device view with the host view's shape and strides; `upload` copies the host extent.
  TensorView mirror(const TensorView& h, DevBuf& b, bool upload) {
    if (!h.present()) return h;
    require(h.device == Device::CPU, fmt::format("DeviceRank::step: {} (expected a host view)", h.describe()));
    const size_t bytes = extent_bytes(h);
    TensorView d = h;
    d.device = Device::CUDA;
    d.data = b.ensure(bytes);
    if (upload && bytes > 0) DSV41KV_CUDA_CHECK(cudaMemcpyAsync(d.data, h.data, bytes, cudaMemcpyHostToDevice, stream));
    return d;
  }
  DevBuf& resident_for(const void* host, size_t bytes, bool& fresh) {
    auto& slot = resident[host];
    fresh = !slot;
    if (!slot) slot = std::make_unique<DevBuf>();
    slot->ensure(bytes);
    return *slot;
  }
};

DeviceRank::DeviceRank(int cuda_device) : impl_(new Impl) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (cuda_device < 0 || cuda_device >= n)
    invalid_argument(fmt::format("DeviceRank: cuda device {} (expected 0..{}; {} visible)", cuda_device, n - 1, n));
  impl_->device = cuda_device;
  impl_->set_device();
  DSV41KV_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  DSV41KV_CUDA_CHECK(cudaEventCreate(&impl_->ev0));
  DSV41KV_CUDA_CHECK(cudaEventCreate(&impl_->ev1));
}

DeviceRank::~DeviceRank() {
  if (!impl_) return;
  cudaSetDevice(impl_->device);
  if (impl_->stream) cudaStreamSynchronize(impl_->stream);
  impl_->resident.clear();
  if (impl_->ev0) cudaEventDestroy(impl_->ev0);
  if (impl_->ev1) cudaEventDestroy(impl_->ev1);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

double DeviceRank::last_step_ms() const { return impl_->last_ms; }

void DeviceRank::all_gather_host(Communicator& comm, const void* send, size_t bytes, void* recv) {
  Impl& m = *impl_;
  m.set_device();
  const size_t total = bytes * static_cast<size_t>(comm.size());
  void* ds = m.gather_send.ensure(bytes);
  void* dr = m.gather_recv.ensure(total);
  if (bytes > 0) DSV41KV_CUDA_CHECK(cudaMemcpyAsync(ds, send, bytes, cudaMemcpyHostToDevice, m.stream));
  ExecContext ctx;
  ctx.stream = m.stream;
  comm.all_gather(ds, bytes, dr, Device::CUDA, ctx);
  comm.wait_device(m.stream);  // a dead peer: the communicator's error, not a hang in the copy below
  if (total > 0) DSV41KV_CUDA_CHECK(cudaMemcpyAsync(recv, dr, total, cudaMemcpyDeviceToHost, m.stream));
  DSV41KV_CUDA_CHECK(cudaStreamSynchronize(m.stream));
}

LayerStepResult DeviceRank::step(const LayerStepArgs& h, Communicator& comm) {
  Impl& m = *impl_;
  m.set_device();
  LayerStepArgs d = h;
  d.kv_score = m.mirror(h.kv_score, m.kv, true);
  d.positions = m.mirror(h.positions, m.positions, true);
  d.qsl = m.mirror(h.qsl, m.qsl, true);
  d.token_to_req = m.mirror(h.token_to_req, m.t2r, true);
  d.ring_slots = m.mirror(h.ring_slots, m.ring_slots, true);
  d.norm_weight = m.mirror(h.norm_weight, m.norm_w, true);
  d.gathered_positions = m.mirror(h.gathered_positions, m.gpos, true);
  d.gathered_cslots = m.mirror(h.gathered_cslots, m.gcslots, true);
  d.rope_table = m.mirror(h.rope_table, m.rope, true);
  d.latent = m.mirror(h.latent, m.latent, true);            // canaries travel too
  d.gathered_latent = m.mirror(h.gathered_latent, m.glatent, true);
  size_t ring_bytes = 0;
  if (h.ring.present()) {
    ring_bytes = Impl::extent_bytes(h.ring);
    bool fresh = false;
    DevBuf& b = m.resident_for(h.ring.data, ring_bytes, fresh);
    d.ring = h.ring;
    d.ring.device = Device::CUDA;
    d.ring.data = b.p;
    if (fresh && ring_bytes > 0)
      DSV41KV_CUDA_CHECK(cudaMemcpyAsync(b.p, h.ring.data, ring_bytes, cudaMemcpyHostToDevice, m.stream));
  }
  for (size_t i = 0; i < h.caches.size(); ++i) {
    const CacheView& hc = h.caches[i];
    require(hc.device == Device::CPU, "DeviceRank::step: caches must be host views");
    const size_t bytes = hc.backing_bytes();
    bool fresh = false;
    DevBuf& b = m.resident_for(hc.base, bytes, fresh);
    if (fresh && bytes > 0) DSV41KV_CUDA_CHECK(cudaMemcpyAsync(b.p, hc.base, bytes, cudaMemcpyHostToDevice, m.stream));
    d.caches[i].base = b.p;
    d.caches[i].device = Device::CUDA;
  }
  d.exec = ExecContext{};
  d.exec.stream = m.stream;

  DSV41KV_CUDA_CHECK(cudaEventRecord(m.ev0, m.stream));
  LayerStepResult res = pcp_layer_step_cuda(d, comm, m.ws);
  DSV41KV_CUDA_CHECK(cudaEventRecord(m.ev1, m.stream));

  // The GPU's bytes back into the host buffers.
  auto back = [&](const TensorView& hv, const TensorView& dv) {
    const size_t bytes = Impl::extent_bytes(hv);
    if (bytes > 0) DSV41KV_CUDA_CHECK(cudaMemcpyAsync(hv.data, dv.data, bytes, cudaMemcpyDeviceToHost, m.stream));
  };
  back(h.latent, d.latent);
  back(h.gathered_latent, d.gathered_latent);
  if (h.ring.present()) back(h.ring, d.ring);
  for (size_t i = 0; i < h.caches.size(); ++i) {
    const size_t bytes = h.caches[i].backing_bytes();
    if (bytes > 0)
      DSV41KV_CUDA_CHECK(cudaMemcpyAsync(h.caches[i].base, d.caches[i].base, bytes, cudaMemcpyDeviceToHost, m.stream));
  }
  DSV41KV_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  float ms = 0;
  DSV41KV_CUDA_CHECK(cudaEventElapsedTime(&ms, m.ev0, m.ev1));
  m.last_ms = ms;
  return res;
}

}  // namespace dsv41kv::pcp
#endif  // DSV41KV_WITH_CUDA
