// dsv41kv: errors, dtypes, devices and tensor views shared by every public API.
//
// Every public entry point takes views of caller-owned memory, validates them on the host
// before touching any output, and throws dsv41kv::Error naming the argument on bad input.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
#define DSV41KV_HD __host__ __device__ __forceinline__
#else
#define DSV41KV_HD inline
#endif

namespace dsv41kv {

// Error codes of SPEC section 6.7 plus the generic ones the library needs.
enum class ErrorCode : int {
  kConfigRatio = 1,        // E1: a layer's compress_ratio not in {0,1,2}
  kMetadataRatio = 2,      // E2: compressed-cache metadata for a ratio not in {1,2}
  kCompressorRatio = 3,    // E3: compressor with a ratio not in {1,2}
  kBackendUnsupported = 4, // E4
  kComputeCapability = 5,  // E5
  kPcpWithSpec = 6,        // E6: PCP combined with speculative decoding
  kTopology = 7,           // E7: missing/inconsistent kv/index source lists
  kInvalidArgument = 8,    // E8: shapes, dtypes, strides, qsl, values
  kPcpPadding = 9,         // E9: PCP graph padding below the largest rank
  kPcpOverflow = 10,       // E10: more non-empty local requests than num_rows
  kIo = 100,               // file could not be read/written
  kFormat = 101,           // malformed file (safetensors, config.json, conformance)
  kCuda = 102,             // a CUDA runtime/library call failed
  kComm = 103,             // communicator failure (timeout, dead peer)
  kCapacity = 104,         // a cache pool has no free page or ring block for a request
};

// The single exception type of the library. what() is "E<code>: <message>" for E1..E10.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

[[noreturn]] void fail(ErrorCode code, const std::string& message);
[[noreturn]] inline void invalid_argument(const std::string& message) {
  fail(ErrorCode::kInvalidArgument, message);
}

enum class DType : uint8_t { F32, BF16, U8, I32, I64 };
enum class Device : uint8_t { CPU, CUDA };

const char* dtype_name(DType d);
size_t dtype_size(DType d);
const char* device_name(Device d);

// A strided view of caller-owned memory. Strides are in elements. Up to 4 dimensions.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;  // 0 means "absent" (optional arguments)
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> stride{};
  Device device = Device::CPU;

  bool present() const { return ndim > 0; }
  int64_t size(int d) const { return shape.at(static_cast<size_t>(d)); }
  int64_t numel() const;
  bool is_contiguous() const;
  // Bytes from the first to one past the last element the view addresses (0 when it has no
  // elements); false when a shape is negative or that span does not fit in 2^62 bytes (no real
  // allocation is that large, and index arithmetic on such a view would overflow int64). Every
  // op's validation rejects such views.
  bool span_bytes(int64_t& bytes) const;
  // Throws E8 "<op>: <arg>: spans more than 2^62 bytes (...)" unless span_bytes holds: the check
  // every op's view validation shares.
  void require_span(const char* op, const char* arg) const;
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  // Row-major contiguous view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::CPU);
  // Explicit strides (elements).
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> stride, Device device = Device::CPU);
  std::string describe() const;  // e.g. "f32[26, 1024] strides [1024, 1] on cpu"
};

// Where and how a call runs. The backend is the device of the tensors; every tensor of one
// call must be on the same device. `stream` is a cudaStream_t for CUDA calls (nullptr = the
// legacy default stream); `num_threads` bounds CPU parallelism (0 = hardware concurrency).
// `programmatic_launch` (CUDA, sm_90; on by default): compress and compress_insert launch with
// programmatic dependent launch (PDL), so that the kernel is scheduled while the previous kernel
// of the stream finishes; the kernel waits for that kernel's completion (and the visibility of
// its writes) before its first memory access, so results never change. It shortens every
// launch where launches are back to back (decode layers in a CUDA graph: it overlaps the graph's
// launch gap; docs/performance.md has decode with and without it). Default on, as
// FlashInfer and TensorRT-LLM do on sm_90+; set it to false for plain launches (for example to
// keep the previous kernel's SM slots free of waiting blocks). Other operations ignore it.
// `pdl_early_metadata` (with programmatic_launch; a promise by the caller, off by default): the
// step metadata of the call (positions, slot_mapping, query_start_loc, token_to_req,
// insert_slots) and norm_weight are not written by the kernel launched just before this call on
// the stream (for example the metadata is built once per step, before the first layer). The
// decode-sized kernel then reads them before waiting for that kernel (kv_score, the ring,
// prev_row_indices, prev_rows, the RoPE table and every output only after): one dependent round
// trip less per layer. Breaking the promise is a data race.
// `compress_tuning` (CUDA compress and compress_insert; null: the library's choices): launch
// choices for benchmarks and tests (tuning.hpp), never a change of results.
struct CompressTuning;
struct ExecContext {
  void* stream = nullptr;
  int num_threads = 0;
  bool programmatic_launch = true;
  bool pdl_early_metadata = false;
  const CompressTuning* compress_tuning = nullptr;
};

}  // namespace dsv41kv
