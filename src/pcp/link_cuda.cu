// The PCP link (SPEC 7.4) on the GPU: see include/dsv41kv/pcp_cuda.hpp.
//   link_local_keys_cuda: one thread per row j < num_rows: key of request j's last token
//     ((ring block << 32) | position, -1 for empty/invalid), gather token = last token.
//   link_resolve_cuda: CUB stable radix sort of (key, gathered index) pairs -> sorted_keys and
//     order (ties keep ascending gathered index = DECISION 13), then one thread per sorted row i:
//     ring_write_slots[order[i]] for the newest row of each block run when its position is even,
//     and, for i < R, the predecessor lookup of request i by lower_bound over sorted_keys.
#include <cub/device/device_radix_sort.cuh>

#include <string>

#include "core/cuda/cuda_util.hpp"
#include "dsv41kv/pcp_cuda.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::pcp {
namespace {

constexpr int kThreads = 256;
unsigned grid_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ __forceinline__ int64_t dkey(int64_t slot, int64_t pos, int64_t cap) {
  if (slot < 0 || pos < 0) return -1;
  int64_t blk, r;
  detail::divmod(slot, cap, blk, r);
  return (blk << 32) | pos;
}

__global__ void iota_kernel(int64_t* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = i;
}

__global__ void local_keys_kernel(const int64_t* __restrict__ slots, const int32_t* __restrict__ qsl,
                                  const int64_t* __restrict__ pos, int64_t N, int64_t R,
                                  int64_t num_rows, int64_t cap, int64_t* __restrict__ keys,
                                  int64_t* __restrict__ gather) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= num_rows) return;
  int64_t key = -1, last = 0;
  if (j < R) {
    const int64_t s = qsl[j], e = qsl[j + 1];
    last = e - 1 > 0 ? e - 1 : 0;
    if (e > s && last < N) key = dkey(slots[last], pos[last], cap);
    if (last >= N) last = 0;  // out-of-range qsl (invalid input): never index past N
  }
  keys[j] = key;
  gather[j] = last;
}

__global__ void resolve_kernel(const int64_t* __restrict__ sorted, const int64_t* __restrict__ order,
                               int64_t G, const int64_t* __restrict__ slots,
                               const int32_t* __restrict__ qsl, const int64_t* __restrict__ pos,
                               int64_t N, int64_t R, int64_t cap, int64_t* __restrict__ ring_write,
                               int64_t* __restrict__ prev_idx) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= G) return;
  {
    const int64_t k = sorted[i];
    const int64_t blk = k >> 32, p = k & 0xFFFFFFFF;
    const bool newest = i == G - 1 || blk != (sorted[i + 1] >> 32);
    int64_t v = -1;
    if (k >= 0 && newest && !closes_group(p, 2)) {
      int64_t q, r;
      detail::divmod(p, cap, q, r);
      v = blk * cap + r;
    }
    const int64_t o = order[i];
    if (o >= 0 && o < G) ring_write[o] = v;
  }
  if (i < R) {
    const int64_t s = qsl[i], e = qsl[i + 1];
    int64_t start = s < N - 1 ? s : N - 1;
    if (start < 0) start = 0;
    const int64_t fp = pos[start];
    const int64_t wanted = dkey(slots[start], fp - 1, cap);
    int64_t lo = 0, hi = G;  // lower_bound
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (sorted[mid] < wanted) lo = mid + 1;
      else hi = mid;
    }
    const int64_t f = lo < G - 1 ? lo : G - 1;
    const bool has_prev = e > s && wanted >= 0 && (fp % 2) == 1 && sorted[f] == wanted;
    prev_idx[i] = has_prev ? order[f] : -1;
  }
}

[[noreturn]] void bad(const char* op, const char* arg, const std::string& msg) {
  invalid_argument(std::string(op) + ": " + arg + ": " + msg);
}

int64_t need_vec(const char* op, const TensorView& v, const char* arg, DType dt, int64_t min_len) {
  if (!v.present()) bad(op, arg, "absent");
  if (v.dtype != dt || v.ndim != 1 || !v.is_contiguous())
    bad(op, arg, v.describe() + ", expected a contiguous 1-D " + dtype_name(dt) + " vector");
  if (v.device != Device::CUDA) bad(op, arg, v.describe() + ", expected a cuda view");
  if (v.shape[0] < min_len)
    bad(op, arg, std::to_string(v.shape[0]) + " entries, expected at least " +
                     std::to_string(min_len));
  if (v.shape[0] > 0 && v.data == nullptr) bad(op, arg, "null data pointer");
  v.require_span(op, arg);
  return v.shape[0];
}

int64_t check_input(const char* op, const LinkDeviceInput& in) {
  const int64_t N = need_vec(op, in.ring_slots, "ring_slots", DType::I64, 0);
  need_vec(op, in.qsl, "qsl", DType::I32, 1);
  need_vec(op, in.positions, "positions", DType::I64, N);
  if (in.cap < 1) bad(op, "cap", std::to_string(in.cap) + ", expected >= 1");
  if (in.max_num_seqs < 1)
    bad(op, "max_num_seqs", std::to_string(in.max_num_seqs) + ", expected >= 1");
  return N;
}

}  // namespace

LinkDeviceWorkspace::LinkDeviceWorkspace(int64_t max_keys) : max_keys_(max_keys) {
  if (max_keys < 0 || max_keys > (int64_t{1} << 30))
    invalid_argument("LinkDeviceWorkspace: max_keys = " + std::to_string(max_keys) +
                     ", expected 0 <= max_keys <= 2^30");
  size_t bytes = 0;
  DSV41KV_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<int>(max_keys > 0 ? max_keys : 1)));
  temp_bytes_ = bytes > 0 ? bytes : 1;
  DSV41KV_CUDA_CHECK(cudaMalloc(&temp_, temp_bytes_));
  const cudaError_t e =
      cudaMalloc(reinterpret_cast<void**>(&indices_), sizeof(int64_t) * static_cast<size_t>(max_keys > 0 ? max_keys : 1));
  if (e != cudaSuccess) {
    cudaFree(temp_);
    temp_ = nullptr;
    DSV41KV_CUDA_CHECK(e);
  }
  if (max_keys > 0) {
    iota_kernel<<<grid_for(max_keys), kThreads>>>(indices_, max_keys);
    DSV41KV_CUDA_CHECK(cudaPeekAtLastError());
    DSV41KV_CUDA_CHECK(cudaDeviceSynchronize());  // construction only, never per call
  }
}

LinkDeviceWorkspace::~LinkDeviceWorkspace() {
  if (temp_) cudaFree(temp_);
  if (indices_) cudaFree(indices_);
}

void link_local_keys_cuda(const LinkDeviceInput& in, const TensorView& local_keys,
                          const TensorView& gather_tokens, const ExecContext& ctx) {
  static constexpr const char* op = "link_local_keys_cuda";
  const int64_t N = check_input(op, in);
  const int64_t rows = link_device_num_rows(in), R = link_device_R(in);
  if (need_vec(op, local_keys, "local_keys", DType::I64, rows) != rows)
    bad(op, "local_keys", "expected exactly num_rows = " + std::to_string(rows) + " entries");
  if (need_vec(op, gather_tokens, "gather_tokens", DType::I64, rows) != rows)
    bad(op, "gather_tokens", "expected exactly num_rows = " + std::to_string(rows) + " entries");
  if (rows == 0) return;
  local_keys_kernel<<<grid_for(rows), kThreads, 0, detail::as_stream(ctx.stream)>>>(
      in.ring_slots.ptr<const int64_t>(), in.qsl.ptr<const int32_t>(),
      in.positions.ptr<const int64_t>(), N, R, rows, in.cap, local_keys.ptr<int64_t>(),
      gather_tokens.ptr<int64_t>());
  DSV41KV_CUDA_CHECK_LAUNCH("local_keys_kernel");
}

void link_resolve_cuda(const LinkDeviceInput& in, const TensorView& all_keys, int P,
                       LinkDeviceWorkspace& ws, const LinkDeviceOutputs& out,
                       const ExecContext& ctx) {
  static constexpr const char* op = "link_resolve_cuda";
  const int64_t N = check_input(op, in);
  if (P < 1) bad(op, "P", std::to_string(P) + ", expected >= 1");
  const int64_t rows = link_device_num_rows(in), R = link_device_R(in);
  const int64_t G = static_cast<int64_t>(P) * rows;
  auto exact = [&](const TensorView& v, const char* arg, int64_t n) {
    if (need_vec(op, v, arg, DType::I64, n) != n)
      bad(op, arg, v.describe() + ", expected exactly " + std::to_string(n) + " entries");
  };
  exact(all_keys, "all_keys", G);
  exact(out.sorted_keys, "sorted_keys", G);
  exact(out.order, "order", G);
  exact(out.ring_write_slots, "ring_write_slots", G);
  exact(out.prev_row_indices, "prev_row_indices", R);
  if (G > ws.max_keys())
    bad(op, "workspace", "sized for " + std::to_string(ws.max_keys()) + " keys, expected >= P * num_rows = " +
                             std::to_string(G));
  if (G == 0) return;
  const cudaStream_t st = detail::as_stream(ctx.stream);
  size_t need = 0;
  DSV41KV_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, need, all_keys.ptr<const int64_t>(), out.sorted_keys.ptr<int64_t>(),
      static_cast<const int64_t*>(ws.indices()), out.order.ptr<int64_t>(), static_cast<int>(G), 0,
      64, st));
  if (need > ws.temp_bytes())
    bad(op, "workspace", "CUB needs " + std::to_string(need) + " temporary bytes, the workspace has " +
                             std::to_string(ws.temp_bytes()));
  size_t have = ws.temp_bytes();
  DSV41KV_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      ws.temp(), have, all_keys.ptr<const int64_t>(), out.sorted_keys.ptr<int64_t>(),
      static_cast<const int64_t*>(ws.indices()), out.order.ptr<int64_t>(), static_cast<int>(G), 0,
      64, st));
  resolve_kernel<<<grid_for(G), kThreads, 0, st>>>(
      out.sorted_keys.ptr<const int64_t>(), out.order.ptr<const int64_t>(), G,
      in.ring_slots.ptr<const int64_t>(), in.qsl.ptr<const int32_t>(),
      in.positions.ptr<const int64_t>(), N, R, in.cap, out.ring_write_slots.ptr<int64_t>(),
      out.prev_row_indices.ptr<int64_t>());
  DSV41KV_CUDA_CHECK_LAUNCH("resolve_kernel");
}

}  // namespace dsv41kv::pcp
