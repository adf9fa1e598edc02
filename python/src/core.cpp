// dsv41kv._core: the library's ops over caller-owned arrays (docs/python.md).
//
// Every array argument is taken through DLPack as it is: no conversion, no temporary. A dtype
// the argument does not take is a TypeError, a layout the binding needs (rank, inner stride,
// writable output) a ValueError, each naming the op and the argument; the library's own checks
// (shapes, strides, values, devices) throw dsv41kv::Error, which surfaces as ValueError with the
// library's text. All of that happens before the library writes anything. The call itself runs
// without the GIL; the arrays stay alive through the DLPack capsules held for the call.
// CUDA arrays are exported with __dlpack__(stream=-1) (no synchronisation: capture-safe) and the
// op runs on `stream` (None: the framework's current stream of the arrays' device,
// dsv41kv._streams) with the arrays' device current.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <algorithm>
#include <memory>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "dsv41kv/attention.hpp"
#include "dsv41kv/attention_layer.hpp"
#include "dsv41kv/cache.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/indexer.hpp"
#include "dsv41kv/metadata.hpp"
#include "dsv41kv/pipeline.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rope.hpp"

#if defined(DSV41KV_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace dsv41kv::py {
namespace {

// ---------------------------------------------------------------- DLPack (the ABI of dlpack.h)

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1;
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLFloat8_e4m3fn = 10;

[[noreturn]] void type_error(const std::string& m) { throw nb::type_error(m.c_str()); }
[[noreturn]] void value_error(const std::string& m) { throw nb::value_error(m.c_str()); }

// The library's dtype of a DLPack dtype: bf16 as bfloat16 or as its uint16 bits, fp8 (e4m3) as
// float8_e4m3fn or as its uint8 codes. Returns false for anything else.
bool library_dtype(DLDataType t, DType& d) {
  if (t.lanes != 1) return false;
  if (t.code == kDLFloat && t.bits == 32) d = DType::F32;
  else if ((t.code == kDLBfloat && t.bits == 16) || (t.code == kDLUInt && t.bits == 16)) d = DType::BF16;
  else if ((t.code == kDLUInt && t.bits == 8) || (t.code == kDLFloat8_e4m3fn && t.bits == 8)) d = DType::U8;
  else if (t.code == kDLInt && t.bits == 32) d = DType::I32;
  else if (t.code == kDLInt && t.bits == 64) d = DType::I64;
  else return false;
  return true;
}
const char* expected_name(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16 (or its uint16 bits)";
    case DType::U8: return "uint8 (or float8_e4m3fn for e4m3 codes)";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
  }
  return "?";
}
std::string dl_dtype_name(DLDataType t) {
  const char* k = t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint" : t.code == kDLFloat ? "float"
                : t.code == kDLBfloat ? "bfloat" : "dlpack code " ;
  std::string s = k;
  if (t.code > kDLBfloat) s += std::to_string(t.code) + " bits ";
  s += std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}
std::string to_string(nb::handle h) {
  nb::object s = nb::steal(PyObject_Str(h.ptr()));
  if (!s.is_valid()) throw nb::python_error();
  const char* c = PyUnicode_AsUTF8(s.ptr());
  return c ? c : "?";
}
std::string py_type_name(nb::handle o) { return to_string(o.type().attr("__name__")); }

// The arrays and the device of one call.
class Call {
 public:
  explicit Call(const char* op) : op_(op) {}

  // A required or optional (None -> absent view) input array.
  TensorView in(nb::handle o, const char* arg, DType want, bool optional = false) {
    return take(o, arg, want, optional, false);
  }
  // An output: also refused when read-only.
  TensorView out(nb::handle o, const char* arg, DType want, bool optional = false) {
    return take(o, arg, want, optional, true);
  }

  // A paged cache: packed formats as uint8 [num_pages, page_bytes] (page stride = the row
  // stride); plain bf16 / fp8 rows as [num_pages, S, 512] (S and both strides from the array).
  CacheView cache(nb::handle o, const char* arg, const std::string& format,
                  std::optional<int64_t> states_per_page, float fp8_scale, bool write) {
    CacheView c;
    c.format = parse_format(format, arg);
    const RecordInfo& info = record_info(c.format);
    TensorView v = take(o, arg, info.element, false, write);
    c.base = v.data;
    c.device = v.device;
    c.fp8_scale = fp8_scale;
    if (info.packed) {
      if (v.ndim != 2 || v.stride[1] != 1)
        value_error(std::string(op_) + ": " + arg + ": " + v.describe() + ", expected uint8 [num_pages, page_bytes] " +
                    "with inner stride 1 for the " + info.name + " format");
      if (!states_per_page)
        value_error(std::string(op_) + ": " + keyword(arg, "states_per_page") + ": required for the " + info.name + " format");
      c.num_pages = v.shape[0];
      c.states_per_page = *states_per_page;
      c.page_stride = v.shape[0] > 1 ? v.stride[0] : v.shape[1];
    } else {
      if (v.ndim != 3 || v.stride[2] != 1 || v.shape[2] != kLatentDim)
        value_error(std::string(op_) + ": " + arg + ": " + v.describe() + ", expected [num_pages, S, 512] with " +
                    "inner stride 1 for the " + info.name + " format");
      if (states_per_page && *states_per_page != v.shape[1])
        value_error(std::string(op_) + ": " + keyword(arg, "states_per_page") + " = " + std::to_string(*states_per_page) +
                    ", but the array has " + std::to_string(v.shape[1]) + " rows per page");
      c.num_pages = v.shape[0];
      c.states_per_page = v.shape[1];
      c.row_stride = v.stride[1];
      c.page_stride = v.shape[0] > 1 ? v.stride[0] : v.shape[1] * v.stride[1];
    }
    return c;
  }

  // An index-K cache: uint8 [num_pages, page_bytes], inner stride 1.
  IndexKCacheView index_k_cache(nb::handle o, const char* arg, const std::string& format,
                                int64_t states_per_page, bool write) {
    IndexKCacheView c;
    if (format == "fp8_132" || format == "fp8" || format == "132") c.format = IndexKFormat::FP8_132;
    else if (format == "mxfp4_68" || format == "mxfp4" || format == "68") c.format = IndexKFormat::MXFP4_68;
    else value_error(std::string(op_) + ": " + keyword(arg, "format") + " = '" + format + "', expected 'fp8_132' or 'mxfp4_68'");
    TensorView v = take(o, arg, DType::U8, false, write);
    if (v.ndim != 2 || v.stride[1] != 1)
      value_error(std::string(op_) + ": " + arg + ": " + v.describe() +
                  ", expected uint8 [num_pages, page_bytes] with inner stride 1");
    c.base = v.data;
    c.device = v.device;
    c.num_pages = v.shape[0];
    c.states_per_page = states_per_page;
    c.page_stride = v.shape[0] > 1 ? v.stride[0] : v.shape[1];
    return c;
  }

  RecordFormat parse_format(const std::string& f, const char* arg) {
    try {
      return parse_record_format(f.c_str());
    } catch (const Error& e) {
      value_error(std::string(op_) + ": " + keyword(arg, "format") + ": " + e.what());
    }
  }

  // The keyword of a cache argument's companion: cache -> cache_format / states_per_page,
  // swa_cache -> swa_format / swa_states_per_page, k_cache -> k_format.
  static std::string keyword(const std::string& cache_arg, const std::string& what) {
    if (cache_arg == "cache") return what == "format" ? "cache_format" : what;
    const std::string prefix = cache_arg.substr(0, cache_arg.rfind("_cache"));
    return prefix + "_" + what;
  }

  // Whether any array was taken, and their device (CUDA: its ordinal).
  bool any() const { return any_; }
  Device device() const { return device_; }
  int cuda_device() const { return device_id_; }
  const char* op() const { return op_; }

  // The ExecContext of the call: its stream (CUDA arrays), threads (CPU).
  ExecContext ctx(nb::handle stream, int num_threads = 0) {
    ExecContext c;
    c.num_threads = num_threads;
    if (device_ == Device::CUDA) c.stream = resolve_stream(stream);
    else if (!stream.is_none() && !(nb::isinstance<nb::int_>(stream) && nb::cast<int64_t>(stream) == 0))
      value_error(std::string(op_) + ": stream: given for host arrays (the CPU backend runs on the calling thread)");
    return c;
  }

  // Runs f without the GIL, the arrays' CUDA device current.
  template <class F>
  auto run(F&& f) {
#if defined(DSV41KV_WITH_CUDA)
    int prev = -1;
    if (device_ == Device::CUDA && cudaGetDevice(&prev) == cudaSuccess && prev != device_id_) {
      if (cudaSetDevice(device_id_) != cudaSuccess) value_error(std::string(op_) + ": cannot make device " + std::to_string(device_id_) + " current");
    } else {
      prev = -1;
    }
    struct Restore {
      int p;
      ~Restore() { if (p >= 0) cudaSetDevice(p); }
    } restore{prev};
#endif
    nb::gil_scoped_release release;
    return f();
  }

 private:
  TensorView take(nb::handle o, const char* arg, DType want, bool optional, bool write) {
    if (o.is_none()) {
      if (optional) return {};
      type_error(std::string(op_) + ": " + arg + ": required, got None");
    }
    const DLTensor* t = nullptr;
    bool read_only = false;
    DLTensor torch_desc;
    int64_t torch_shape[4], torch_strides[4];
    if (torch_tensor(o, arg, want, torch_desc, torch_shape, torch_strides)) {
      t = &torch_desc;
      keep_.push_back(nb::borrow(o));
    } else {
    nb::object cap = export_capsule(o, arg);
    if (PyCapsule_IsValid(cap.ptr(), "dltensor")) {
      t = &static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"))->dl_tensor;
    } else if (PyCapsule_IsValid(cap.ptr(), "dltensor_versioned")) {
      auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), "dltensor_versioned"));
      t = &m->dl_tensor;
      read_only = (m->flags & kDLFlagReadOnly) != 0;
    } else {
      type_error(std::string(op_) + ": " + arg + ": __dlpack__ of " + py_type_name(o) + " returned no DLPack capsule");
    }
    keep_.push_back(std::move(cap));  // its destructor releases the tensor after the call
    }
    DType d;
    if (!library_dtype(t->dtype, d) || d != want)
      type_error(std::string(op_) + ": " + arg + ": dtype " + dl_dtype_name(t->dtype) + ", expected " + expected_name(want));
    if (t->ndim < 1 || t->ndim > 4)
      value_error(std::string(op_) + ": " + arg + ": " + std::to_string(t->ndim) + " dimensions, expected 1 to 4");
    if (write && read_only) value_error(std::string(op_) + ": " + arg + ": a read-only array, expected a writable output");
    TensorView v;
    v.data = static_cast<char*>(t->data) + t->byte_offset;
    v.dtype = d;
    v.ndim = t->ndim;
    // An axis of extent 1, or any axis of an empty array, has no meaningful stride (numpy and
    // torch export anything there): it gets the compact one, as the library's checks expect.
    bool empty = false;
    for (int i = 0; i < t->ndim; ++i) empty = empty || t->shape[i] == 0;
    for (int i = t->ndim - 1; i >= 0; --i) {
      v.shape[i] = t->shape[i];
      const int64_t compact = i == t->ndim - 1 ? 1 : v.stride[i + 1] * std::max<int64_t>(v.shape[i + 1], 1);
      v.stride[i] = t->strides && t->shape[i] > 1 && !empty ? t->strides[i] : compact;
    }
    Device dev;
    if (t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost) dev = Device::CPU;
    else if (t->device.device_type == kDLCUDA || t->device.device_type == kDLCUDAManaged) dev = Device::CUDA;
    else value_error(std::string(op_) + ": " + arg + ": DLPack device type " + std::to_string(t->device.device_type) +
                     ", expected the CPU or a CUDA device");
    v.device = dev;
    if (dev == Device::CUDA) {
      if (device_id_ >= 0 && t->device.device_id != device_id_)
        value_error(std::string(op_) + ": " + arg + ": on cuda:" + std::to_string(t->device.device_id) +
                    ", the call's other arrays on cuda:" + std::to_string(device_id_));
      device_id_ = t->device.device_id;
      if (!first_cuda_.is_valid()) first_cuda_ = nb::borrow(o);
    }
    if (any_ && dev != device_)
      value_error(std::string(op_) + ": " + arg + ": on " + device_name(dev) + ", the call's other arrays on " + device_name(device_));
    any_ = true;
    device_ = dev;
    return v;
  }

  // A torch.Tensor read through its attributes (data_ptr, dtype, shape, stride, device): what its
  // DLPack export would say, without the cost of torch's Python-level __dlpack__ (several
  // microseconds a tensor). False for anything that is not a torch.Tensor.
  bool torch_tensor(nb::handle o, const char* arg, DType want, DLTensor& t, int64_t* shape, int64_t* strides) {
    static PyObject* tensor_type = nullptr;
    static PyObject *f32, *bf16, *u16, *u8, *e4m3, *i32, *i64;
    if (!tensor_type) {
      PyObject* torch = PyImport_GetModule(nb::str("torch").ptr());  // only once torch is imported
      if (!torch) {
        PyErr_Clear();
        return false;
      }
      nb::module_ m = nb::steal<nb::module_>(torch);
      auto dt = [&](const char* n) { return nb::hasattr(m, n) ? nb::object(m.attr(n)).release().ptr() : nullptr; };
      f32 = dt("float32"), bf16 = dt("bfloat16"), u16 = dt("uint16"), u8 = dt("uint8"), e4m3 = dt("float8_e4m3fn");
      i32 = dt("int32"), i64 = dt("int64");
      tensor_type = nb::object(m.attr("Tensor")).release().ptr();
    }
    const int is = PyObject_IsInstance(o.ptr(), tensor_type);
    if (is <= 0) {
      if (is < 0) PyErr_Clear();
      return false;
    }
    nb::object dtype = o.attr("dtype");
    PyObject* d = dtype.ptr();
    t.dtype = d == f32 ? DLDataType{kDLFloat, 32, 1} : d == bf16 ? DLDataType{kDLBfloat, 16, 1}
            : (u16 && d == u16) ? DLDataType{kDLUInt, 16, 1} : d == u8 ? DLDataType{kDLUInt, 8, 1}
            : (e4m3 && d == e4m3) ? DLDataType{kDLFloat8_e4m3fn, 8, 1} : d == i32 ? DLDataType{kDLInt, 32, 1}
            : d == i64 ? DLDataType{kDLInt, 64, 1} : DLDataType{255, 0, 1};
    if (t.dtype.code == 255)
      type_error(std::string(op_) + ": " + arg + ": dtype " + to_string(dtype) + ", expected " + expected_name(want));
    nb::tuple sh = nb::borrow<nb::tuple>(o.attr("shape"));
    nb::tuple st = nb::borrow<nb::tuple>(o.attr("stride")());
    t.ndim = static_cast<int32_t>(nb::len(sh));
    if (t.ndim > 4) t.ndim = 5;  // refused by the caller's rank check
    for (int i = 0; i < t.ndim && i < 4; ++i) {
      shape[i] = nb::cast<int64_t>(sh[i]);
      strides[i] = nb::cast<int64_t>(st[i]);
    }
    t.shape = shape;
    t.strides = strides;
    t.byte_offset = 0;
    t.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(o.attr("data_ptr")()));
    if (nb::cast<bool>(o.attr("is_cuda"))) {
      t.device = {kDLCUDA, nb::cast<int32_t>(o.attr("get_device")())};
    } else {
      const std::string type = to_string(o.attr("device").attr("type"));
      if (type != "cpu")
        value_error(std::string(op_) + ": " + arg + ": a torch tensor on '" + type + "', expected the CPU or a CUDA device");
      t.device = {kDLCPU, 0};
    }
    return true;
  }

  nb::object export_capsule(nb::handle o, const char* arg) {
    if (PyCapsule_CheckExact(o.ptr())) return nb::borrow(o);
    if (!nb::hasattr(o, "__dlpack__") || !nb::hasattr(o, "__dlpack_device__"))
      type_error(std::string(op_) + ": " + arg + ": " + py_type_name(o) +
                 " is not an array with __dlpack__ (numpy, torch, cupy, jax arrays are)");
    nb::tuple dev = nb::borrow<nb::tuple>(o.attr("__dlpack_device__")());
    const int type = nb::cast<int>(dev[0]);
    std::string first_error;
    try {
      if (type == kDLCUDA || type == kDLCUDAManaged) return o.attr("__dlpack__")("stream"_a = -1);
      return o.attr("__dlpack__")();
    } catch (nb::python_error& e) {
      if (!e.matches(PyExc_BufferError) && !e.matches(PyExc_TypeError)) throw;
      first_error = e.what();
    }
    // numpy refuses a read-only array in the unversioned protocol (the versioned capsule flags
    // it), and arrays of ml_dtypes' bfloat16 / float8_e4m3fn altogether (older torch its
    // float8_e4m3fn): their bits are taken as uint16 / uint8 through a view (no copy).
    if (nb::hasattr(o, "dtype") && nb::hasattr(o, "view")) {
      const std::string dt = to_string(o.attr("dtype"));
      if (dt == "bfloat16") return export_capsule(o.attr("view")("uint16"), arg);
      if (dt == "float8_e4m3fn") return export_capsule(o.attr("view")("uint8"), arg);
      // torch before DLPack's float8 codes: the e4m3 codes as uint8
      if (dt == "torch.float8_e4m3fn")
        return export_capsule(o.attr("view")(nb::module_::import_("torch").attr("uint8")), arg);
    }
    try {
      return o.attr("__dlpack__")("max_version"_a = nb::make_tuple(1, 0));
    } catch (nb::python_error&) {
    }
    type_error(std::string(op_) + ": " + arg + ": " + py_type_name(o) + " could not be exported through DLPack: " +
               first_error);
  }

  void* resolve_stream(nb::handle s) {
    nb::object v = nb::borrow(s);
    if (v.is_none()) {
      // looked up once (an import and an attribute lookup per call cost microseconds); never
      // released, so that no Python object is freed after the interpreter has finalized
      static nb::object* current = new nb::object(nb::module_::import_("dsv41kv._streams").attr("current_stream"));
      v = (*current)(first_cuda_);
    }
    return stream_pointer(v, op_);
  }

 public:
  // An int cudaStream_t, a torch.cuda.Stream or a cupy stream as the pointer.
  static void* stream_pointer(nb::object v, const char* op) {
    if (nb::hasattr(v, "cuda_stream")) v = v.attr("cuda_stream");  // torch.cuda.Stream
    else if (nb::hasattr(v, "ptr")) v = v.attr("ptr");              // cupy.cuda.Stream
    if (!nb::isinstance<nb::int_>(v))
      type_error(std::string(op) + ": stream: " + py_type_name(v) + ", expected None, an int (cudaStream_t) or a stream object");
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(v));
  }

 private:

  const char* op_;
  std::vector<nb::object> keep_;
  bool any_ = false;
  Device device_ = Device::CPU;
  int device_id_ = -1;
  nb::object first_cuda_;
};

LayerType parse_layer(const std::string& s) {
  if (s == "swaonly" || s == "0") return LayerType::kSwaOnly;
  if (s == "c1a" || s == "1") return LayerType::kC1A;
  if (s == "c2a" || s == "2") return LayerType::kC2A;
  value_error("layer = '" + s + "', expected 'swaonly', 'c1a' or 'c2a'");
}
IndexerRole parse_role(const std::string& s) {
  if (s == "plain") return IndexerRole::kPlain;
  if (s == "candidate_source") return IndexerRole::kCandidateSource;
  if (s == "candidate_consumer") return IndexerRole::kCandidateConsumer;
  value_error("indexer_topk: role = '" + s + "', expected 'plain', 'candidate_source' or 'candidate_consumer'");
}
RingPolicy parse_policy(const std::string& s) {
  if (s == "tail") return RingPolicy::kTail;
  if (s == "open_row") return RingPolicy::kOpenRow;
  value_error("fused_save_compress_norm: policy = '" + s + "', expected 'tail' or 'open_row'");
}
ComputeDevice parse_device(const std::string& s) {
  if (s == "cpu") return ComputeDevice::cpu(false);
  if (s == "cpu_sm100") return ComputeDevice::cpu(true);
  if (s.rfind("sm_", 0) == 0 && s.size() >= 5) {
    const int v = std::atoi(s.c_str() + 3);
    return ComputeDevice::cuda(v / 10, v % 10);
  }
  value_error("device = '" + s + "', expected 'cpu', 'cpu_sm100' or 'sm_XY' (a CUDA compute capability)");
}

// The fields of CompressArgs shared by fused_save_compress_norm and compress_insert.
CompressArgs compress_args(Call& c, int ratio, nb::handle kv_score, nb::handle positions, nb::handle slot_mapping,
                           nb::handle norm_weight, float eps, nb::handle latent_out, bool latent_optional,
                           nb::handle ring, nb::handle qsl, nb::handle token_to_req, const std::string& policy,
                           nb::handle prev_rows, nb::handle prev_row_indices) {
  CompressArgs a;
  a.ratio = ratio;
  a.kv_score = c.in(kv_score, "kv_score", DType::F32);
  a.positions = c.in(positions, "positions", DType::I64);
  a.slot_mapping = c.in(slot_mapping, "slot_mapping", DType::I64);
  a.norm_weight = c.in(norm_weight, "norm_weight", DType::BF16);
  a.eps = eps;
  a.latent_out = c.out(latent_out, "latent_out", DType::BF16, latent_optional);
  a.ring = c.out(ring, "ring", DType::F32, true);
  a.qsl = c.in(qsl, "qsl", DType::I32, true);
  a.token_to_req = c.in(token_to_req, "token_to_req", DType::I32, true);
  a.policy = parse_policy(policy);
  a.prev_rows = c.in(prev_rows, "prev_rows", DType::F32, true);
  a.prev_row_indices = c.in(prev_row_indices, "prev_row_indices", DType::I64, true);
  return a;
}

nb::dict split_dict(const DecodeSplit& s) {
  nb::dict d;
  d["num_reqs"] = s.num_reqs;
  d["num_decodes"] = s.num_decodes;
  d["num_decode_tokens"] = s.num_decode_tokens;
  d["num_prefills"] = s.num_prefills;
  d["num_prefill_tokens"] = s.num_prefill_tokens;
  return d;
}

constexpr auto kw = nb::kw_only();
#define ARR(name) nb::arg(name).none()  // None reaches Call::in: "required, got None"
#define OPT(name) nb::arg(name).none() = nb::none()
#define STREAM nb::arg("stream").none() = nb::none()

}  // namespace

void bind(nb::module_& m) {
  // dsv41kv::Error -> dsv41kv.Error, a ValueError whose text is the library's message.
  nb::exception<Error>(m, "Error", PyExc_ValueError);

  // ------------------------------------------------------------ build and device
  m.def("built_with_cuda", &built_with_cuda, "True when the library was built with the CUDA backend.");
  m.def("cuda_device_available", &cuda_device_available, "True when built with CUDA and a device is visible.");
  m.def("cuda_device_description", &cuda_device_description, "The visible GPU, or why there is none.");

  // ------------------------------------------------------------ records and sizes
  m.def("record_info", [](const std::string& format) {
    Call c("record_info");
    const RecordInfo& i = record_info(c.parse_format(format, "cache"));
    nb::dict d;
    d["name"] = i.name; d["packed"] = i.packed; d["value_bytes"] = i.value_bytes;
    d["scale_bytes"] = i.scale_bytes; d["record_bytes"] = i.record_bytes; d["page_align"] = i.page_align;
    d["element"] = dtype_name(i.element);
    return d;
  }, "format"_a,
  "The layout of a record format ('v4_584', 'mxfp8_528', 'nvfp4_288', 'bf16', 'fp8'; '584', '528', '288'):\n"
  "dict(name, packed, value_bytes, scale_bytes, record_bytes, page_align, element).");
  m.def("default_page_stride", [](const std::string& format, int64_t states_per_page) {
    Call c("default_page_stride");
    return CacheView::with_default_strides(nullptr, c.parse_format(format, "cache"), 1, states_per_page).page_stride;
  }, "format"_a, "states_per_page"_a,
  "The library's page stride of a cache (SPEC 3.6), in elements of the format's element type (bytes for\n"
  "packed formats and fp8 rows, bf16 elements for bf16 rows).");
  m.def("index_k_record_bytes", [](const std::string& format) {
    return format == "mxfp4_68" ? index_k_record_bytes(IndexKFormat::MXFP4_68) : index_k_record_bytes(IndexKFormat::FP8_132);
  }, "format"_a = "fp8_132", "Bytes of one index-K record: 132 (fp8_132) or 68 (mxfp4_68).");
  m.def("index_k_default_page_stride", [](const std::string& format, int64_t states_per_page) {
    return IndexKCacheView::with_default_strides(nullptr, format == "mxfp4_68" ? IndexKFormat::MXFP4_68 : IndexKFormat::FP8_132,
                                                 1, states_per_page).page_stride;
  }, "format"_a, "states_per_page"_a, "The library's page stride (bytes) of an index-K cache.");
  m.def("prefill_workspace_rows", &prefill_workspace_rows, "ratio"_a, "max_model_len"_a, "max_num_batched_tokens"_a,
        "Rows of the bf16 [rows, 512] prefill workspace (SPEC 9.5 cap_ws).");
  m.def("ring_capacity", &ring_capacity, "num_speculative_tokens"_a,
        "Rows per compressor ring block: max(8, next_pow2(num_speculative_tokens + 2)) (SPEC 3.2).");
  m.attr("SOFTMAX_SCALE") = kSoftmaxScale;
  m.attr("LATENT_DIM") = kLatentDim;
  m.attr("INDEX_TOPK") = kIndexTopk;
  m.attr("PREFILL_INDEX_WIDTH") = kPrefillIndexWidth;
  m.attr("CANDIDATE_TOPK_BLOCKS") = kCandidateTopkBlocks;

  // ------------------------------------------------------------ config
  nb::class_<LayerInfo>(m, "LayerInfo", "One layer's role (SPEC 1.3).")
      .def_ro("index", &LayerInfo::index).def_ro("ratio", &LayerInfo::ratio)
      .def_prop_ro("type", [](const LayerInfo& l) { return std::string(layer_type_name(l.type)); })
      .def_ro("is_draft", &LayerInfo::is_draft).def_ro("is_kv_source", &LayerInfo::is_kv_source)
      .def_ro("is_index_source", &LayerInfo::is_index_source)
      .def_ro("is_candidate_source", &LayerInfo::is_candidate_source)
      .def_ro("is_candidate_consumer", &LayerInfo::is_candidate_consumer)
      .def_ro("kv_src", &LayerInfo::kv_src).def_ro("idx_src", &LayerInfo::idx_src);
  nb::class_<ModelConfig>(m, "ModelConfig", "A model's config.json (SPEC 1.1-1.3) with its finalized topology.")
      .def_ro("hidden_size", &ModelConfig::hidden_size).def_ro("num_hidden_layers", &ModelConfig::num_hidden_layers)
      .def_ro("num_nextn_predict_layers", &ModelConfig::num_nextn_predict_layers)
      .def_ro("num_attention_heads", &ModelConfig::num_attention_heads).def_ro("head_dim", &ModelConfig::head_dim)
      .def_ro("index_topk", &ModelConfig::index_topk).def_ro("sliding_window", &ModelConfig::sliding_window)
      .def_ro("max_position_embeddings", &ModelConfig::max_position_embeddings)
      .def_ro("rms_norm_eps", &ModelConfig::rms_norm_eps).def_ro("rope_theta", &ModelConfig::rope_theta)
      .def_ro("compress_rope_theta", &ModelConfig::compress_rope_theta)
      .def_ro("compress_ratios", &ModelConfig::compress_ratios)
      .def_ro("layers", &ModelConfig::layers)
      .def("num_layers", &ModelConfig::num_layers)
      .def("ratio", &ModelConfig::ratio, "layer"_a)
      .def("describe_topology", [](const ModelConfig& c) { return describe_topology(c); });
  m.def("load_model_config", &load_model_config, "path"_a, "Reads a config.json (ValueError on a bad file).");
  m.def("parse_model_config", [](const std::string& text, const std::string& source) { return parse_model_config(text, source); },
        "text"_a, "source"_a = "config.json", "Parses the text of a config.json.");
  m.def("deepseek_v41_flash", &deepseek_v41_flash, "The published DeepSeek-V4.1-Flash configuration (SPEC 1.1).");
  m.def("rope_table", [](const ModelConfig& cfg, int ratio, nb::handle out, const std::string& angle) {
    Call c("rope_table");
    TensorView o = c.out(out, "out", DType::F32);
    if (o.device != Device::CPU || o.ndim != 2 || o.shape[1] != kRopeTableWidth || !o.is_contiguous())
      value_error("rope_table: out: " + o.describe() + ", expected a contiguous host float32 [rows, 64]");
    const RopeAngle a = parse_rope_angle(angle.c_str());
    c.run([&] {
      RopeTable t = rope_table_for_ratio(cfg, ratio, o.shape[0], a);
      std::memcpy(o.data, t.data.data(), t.data.size() * sizeof(float));
    });
  }, "config"_a, "ratio"_a, "out"_a, "angle"_a = "binary64",
  "Fills out (float32 [rows, 64], host, contiguous) with the RoPE table of the layers of `ratio`\n"
  "(plain for 0, YaRN for 1 and 2; SPEC 1.4): row p = 32 cos | 32 sin.");

  // ------------------------------------------------------------ write path
  m.def("fused_save_compress_norm",
        [](nb::handle kv_score, nb::handle positions, nb::handle slot_mapping, nb::handle norm_weight, float eps,
           nb::handle latent_out, int ratio, nb::handle ring, nb::handle qsl, nb::handle token_to_req,
           const std::string& policy, nb::handle prev_rows, nb::handle prev_row_indices, int num_threads, nb::handle stream) {
          Call c("fused_save_compress_norm");
          CompressArgs a = compress_args(c, ratio, kv_score, positions, slot_mapping, norm_weight, eps, latent_out, false,
                                         ring, qsl, token_to_req, policy, prev_rows, prev_row_indices);
          ExecContext x = c.ctx(stream, num_threads);
          c.run([&] { compress(a, x); });
        },
        ARR("kv_score"), ARR("positions"), ARR("slot_mapping"), ARR("norm_weight"), ARR("eps"), ARR("latent_out"), kw,
        nb::arg("ratio") = 2, OPT("ring"), OPT("qsl"), OPT("token_to_req"), nb::arg("policy") = "tail", OPT("prev_rows"),
        OPT("prev_row_indices"), nb::arg("num_threads") = 0, STREAM,
        "The compressor (SPEC 4): pools, RMS-normalizes and writes the latent of every closing token.\n\n"
        "kv_score f32 [rows >= N, 512*ratio]; positions i64 [>= N]; slot_mapping i64 [N] (ratio 2: ring slots,\n"
        "ratio 1: compressed slots as a validity mask); norm_weight bf16 [512]; eps: rms_norm_eps;\n"
        "latent_out bf16 [rows >= N, 512] (output, closing rows). Ratio 2: ring f32 [blocks, cap, 1024]\n"
        "(in/out), qsl i32 [num_reqs + 1], token_to_req i32 [N]; policy 'tail' or 'open_row' (PCP, with\n"
        "prev_rows f32 [G, 1024] and prev_row_indices i64 [R]).");
  m.def("rope_quant_insert",
        [](nb::handle latent, nb::handle positions, nb::handle rope_table, nb::handle slots, nb::handle cache,
           const std::string& cache_format, std::optional<int64_t> states_per_page, float fp8_scale, int ratio,
           nb::handle stream) {
          Call c("rope_quant_insert");
          InsertArgs a;
          a.ratio = ratio;
          a.latent = c.in(latent, "latent", DType::BF16);
          a.positions = c.in(positions, "positions", DType::I64);
          a.rope_table = c.in(rope_table, "rope_table", DType::F32);
          a.slots = c.in(slots, "slots", DType::I64);
          a.cache = c.cache(cache, "cache", cache_format, states_per_page, fp8_scale, true);
          ExecContext x = c.ctx(stream);
          c.run([&] { insert(a, x); });
        },
        ARR("latent"), ARR("positions"), ARR("rope_table"), ARR("slots"), ARR("cache"), kw,
        nb::arg("cache_format") = "v4_584", OPT("states_per_page"), nb::arg("fp8_scale") = 1.0f, nb::arg("ratio") = 2,
        STREAM,
        "RoPE + quantized insert (SPEC 5.1) of every closing token's latent into a paged cache.\n\n"
        "latent bf16 [rows >= N, 512]; positions i64 [>= N]; rope_table f32 [rows, 64]; slots i64 [N];\n"
        "cache: packed formats uint8 [num_pages, page_bytes] (states_per_page required), plain 'bf16' /\n"
        "'fp8' rows [num_pages, S, 512] (bf16 / uint8; fp8_scale the per-tensor scale).");
  m.def("compress_insert",
        [](nb::handle kv_score, nb::handle positions, nb::handle slot_mapping, nb::handle norm_weight, float eps,
           nb::handle rope_table, nb::handle insert_slots, nb::handle cache, const std::string& cache_format,
           std::optional<int64_t> states_per_page, float fp8_scale, int ratio, nb::handle latent_out, nb::handle ring,
           nb::handle qsl, nb::handle token_to_req, const std::string& policy, nb::handle prev_rows,
           nb::handle prev_row_indices, int num_threads, nb::handle stream) {
          Call c("compress_insert");
          CompressInsertArgs a;
          a.compress = compress_args(c, ratio, kv_score, positions, slot_mapping, norm_weight, eps, latent_out, true,
                                     ring, qsl, token_to_req, policy, prev_rows, prev_row_indices);
          a.rope_table = c.in(rope_table, "rope_table", DType::F32);
          a.insert_slots = c.in(insert_slots, "insert_slots", DType::I64);
          a.cache = c.cache(cache, "cache", cache_format, states_per_page, fp8_scale, true);
          ExecContext x = c.ctx(stream, num_threads);
          c.run([&] { dsv41kv::compress_insert(a, x); });
        },
        ARR("kv_score"), ARR("positions"), ARR("slot_mapping"), ARR("norm_weight"), ARR("eps"), ARR("rope_table"),
        ARR("insert_slots"), ARR("cache"), kw, nb::arg("cache_format") = "v4_584", OPT("states_per_page"),
        nb::arg("fp8_scale") = 1.0f, nb::arg("ratio") = 2, OPT("latent_out"), OPT("ring"), OPT("qsl"),
        OPT("token_to_req"), nb::arg("policy") = "tail", OPT("prev_rows"), OPT("prev_row_indices"),
        nb::arg("num_threads") = 0, STREAM,
        "fused_save_compress_norm then rope_quant_insert of every closing token in one call (one fused\n"
        "launch on CUDA). Arguments as the two ops; insert_slots i64 [N] is the compressed slot mapping;\n"
        "latent_out is optional.");
  m.def("save_ring_rows",
        [](nb::handle prev_rows, nb::handle ring_write_slots, nb::handle ring, nb::handle stream) {
          Call c("save_ring_rows");
          SaveRingRowsArgs a;
          a.prev_rows = c.in(prev_rows, "prev_rows", DType::F32);
          a.ring_write_slots = c.in(ring_write_slots, "ring_write_slots", DType::I64);
          a.ring = c.out(ring, "ring", DType::F32);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::save_ring_rows(a, x); });
        },
        ARR("prev_rows"), ARR("ring_write_slots"), ARR("ring"), kw, STREAM,
        "PCP ring write (SPEC 7.5): prev_rows f32 [G, 1024] into ring f32 [blocks, cap, 1024] at\n"
        "ring_write_slots i64 [G] (block * cap + row; -1 skips).");
  m.def("gather",
        [](nb::handle cache, nb::handle slots, nb::handle out, const std::string& cache_format,
           std::optional<int64_t> states_per_page, float fp8_scale, nb::handle stream) {
          Call c("gather");
          GatherArgs a;
          a.cache = c.cache(cache, "cache", cache_format, states_per_page, fp8_scale, false);
          a.slots = c.in(slots, "slots", DType::I64);
          a.out = c.out(out, "out", DType::BF16);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::gather(a, x); });
        },
        ARR("cache"), ARR("slots"), ARR("out"), kw, nb::arg("cache_format") = "v4_584", OPT("states_per_page"),
        nb::arg("fp8_scale") = 1.0f, STREAM,
        "Dequantize-gather (SPEC 5.3): out bf16 [M, 512] row i = the state at slots[i] (i64 [M]); rows with\n"
        "a negative slot are left untouched.");
  m.def("swa_insert_q_rope",
        [](nb::handle kv, nb::handle q, nb::handle positions, nb::handle rope_table, nb::handle slot_swa,
           nb::handle cache, nb::handle q_out, const std::string& cache_format, std::optional<int64_t> states_per_page,
           float fp8_scale, nb::handle stream) {
          Call c("swa_insert_q_rope");
          SwaInsertArgs a;
          a.kv = c.in(kv, "kv", DType::BF16);
          a.q = c.in(q, "q", DType::BF16);
          a.positions = c.in(positions, "positions", DType::I64);
          a.rope_table = c.in(rope_table, "rope_table", DType::F32);
          a.slot_swa = c.in(slot_swa, "slot_swa", DType::I64);
          a.cache = c.cache(cache, "cache", cache_format, states_per_page, fp8_scale, true);
          a.q_out = c.out(q_out, "q_out", DType::BF16);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::swa_insert_q_rope(a, x); });
        },
        ARR("kv"), ARR("q"), ARR("positions"), ARR("rope_table"), ARR("slot_swa"), ARR("cache"), ARR("q_out"), kw,
        nb::arg("cache_format") = "v4_584", OPT("states_per_page"), nb::arg("fp8_scale") = 1.0f, STREAM,
        "The SWA insert fused with the query RoPE (SPEC 5.4, 9.2): kv bf16 [rows >= T, 512] into the SWA\n"
        "cache at slot_swa i64 [T]; q bf16 [rows >= T, H, 512] rotated into q_out bf16 [rows >= T, H_pad, 512]\n"
        "(may be q itself); positions i64 [>= T]; rope_table f32 [rows, 64].");

  // ------------------------------------------------------------ metadata
  m.def("build_token_to_req",
        [](nb::handle qsl, nb::handle token_to_req, int64_t num_actual_tokens, nb::handle stream) {
          Call c("build_token_to_req");
          TokenToReqArgs a;
          a.qsl = c.in(qsl, "qsl", DType::I32);
          a.token_to_req = c.out(token_to_req, "token_to_req", DType::I32);
          a.num_actual_tokens = num_actual_tokens;
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::build_token_to_req(a, x); });
        },
        ARR("qsl"), ARR("token_to_req"), kw, nb::arg("num_actual_tokens") = -1, STREAM,
        "token_to_req i32 [N] (output) = the request of each token of qsl i32 [num_reqs + 1]; 0 for padding.");
  m.def("build_ring_slots",
        [](nb::handle token_to_req, nb::handle positions, nb::handle ring_block_table, nb::handle ring_slots,
           int64_t num_actual_tokens, int64_t cap, int64_t num_ring_blocks, nb::handle stream) {
          Call c("build_ring_slots");
          RingSlotArgs a;
          a.token_to_req = c.in(token_to_req, "token_to_req", DType::I32);
          a.positions = c.in(positions, "positions", DType::I64);
          a.ring_block_table = c.in(ring_block_table, "ring_block_table", DType::I32);
          a.ring_slots = c.out(ring_slots, "ring_slots", DType::I64);
          a.num_actual_tokens = num_actual_tokens;
          a.cap = cap;
          a.num_ring_blocks = num_ring_blocks;
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::build_ring_slots(a, x); });
        },
        ARR("token_to_req"), ARR("positions"), ARR("ring_block_table"), ARR("ring_slots"), kw,
        ARR("num_actual_tokens"), nb::arg("cap") = 8, nb::arg("num_ring_blocks") = -1, STREAM,
        "SPEC 6.3: ring_slots i64 [N] (output) = b * cap + p % cap with b = ring_block_table[req][0]\n"
        "(i32 [num_reqs, >= 1]), -1 for a null block or a padding row. token_to_req i32 [N], positions i64 [>= N].");
  m.def("build_token_slots",
        [](nb::handle token_to_req, nb::handle positions, nb::handle block_table, nb::handle slots,
           int64_t num_actual_tokens, int64_t page, int64_t num_pages, nb::handle stream) {
          Call c("build_token_slots");
          TokenSlotArgs a;
          a.token_to_req = c.in(token_to_req, "token_to_req", DType::I32);
          a.positions = c.in(positions, "positions", DType::I64);
          a.block_table = c.in(block_table, "block_table", DType::I32);
          a.slots = c.out(slots, "slots", DType::I64);
          a.num_actual_tokens = num_actual_tokens;
          a.page = page;
          a.num_pages = num_pages;
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::build_token_slots(a, x); });
        },
        ARR("token_to_req"), ARR("positions"), ARR("block_table"), ARR("slots"), kw, ARR("num_actual_tokens"),
        nb::arg("page") = 32, nb::arg("num_pages") = -1, STREAM,
        "SPEC 6.4: slots i64 [N] (output) = bt[req][p / page] * page + p % page, -1 for a null page or padding.\n"
        "block_table i32 [num_reqs, max_pages].");
  m.def("build_compressed_slots",
        [](nb::handle token_to_req, nb::handle positions, nb::handle block_table, nb::handle slots, int ratio,
           int64_t num_actual_tokens, int64_t states_per_page, nb::handle token_slots, int64_t num_pages,
           nb::handle stream) {
          Call c("build_compressed_slots");
          CompressedSlotArgs a;
          a.ratio = ratio;
          a.token_to_req = c.in(token_to_req, "token_to_req", DType::I32);
          a.positions = c.in(positions, "positions", DType::I64);
          a.block_table = c.in(block_table, "block_table", DType::I32);
          a.token_slots = c.in(token_slots, "token_slots", DType::I64, true);
          a.slots = c.out(slots, "slots", DType::I64);
          a.num_actual_tokens = num_actual_tokens;
          a.states_per_page = states_per_page;
          a.num_pages = num_pages;
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::build_compressed_slots(a, x); });
        },
        ARR("token_to_req"), ARR("positions"), ARR("block_table"), ARR("slots"), kw, ARR("ratio"),
        ARR("num_actual_tokens"), nb::arg("states_per_page") = 32, OPT("token_slots"), nb::arg("num_pages") = -1,
        STREAM,
        "SPEC 6.5: the compressed slot mapping of ratio 1 or 2 with the PAD rule, slots i64 [N] (output);\n"
        "token_slots i64 [N] optional (the token's ordinary slot; -1 masks it).");
  m.def("build_token_valid",
        [](nb::handle slot_swa, nb::handle token_valid, nb::handle stream) {
          Call c("build_token_valid");
          const TensorView s = c.in(slot_swa, "slot_swa", DType::I64);
          const TensorView v = c.out(token_valid, "token_valid", DType::I32);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::build_token_valid(s, v, x); });
        },
        ARR("slot_swa"), ARR("token_valid"), kw, STREAM,
        "SPEC 6.1: token_valid i32 [N] (output) = 1 where slot_swa (i64 [N]) >= 0, else 0.");
  m.def("mask_invalid_lengths",
        [](nb::handle token_valid, nb::handle lengths, nb::handle stream) {
          Call c("mask_invalid_lengths");
          const TensorView v = c.in(token_valid, "token_valid", DType::I32);
          const TensorView l = c.out(lengths, "lengths", DType::I32);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::mask_invalid_lengths(v, l, x); });
        },
        ARR("token_valid"), ARR("lengths"), kw, STREAM,
        "SPEC 6.1 / 9.3: lengths i32 [n] (in/out) = 0 where token_valid i32 [>= n] is 0 (an invalid token has\n"
        "no key); other entries untouched.");
  m.def("split_decode_prefill",
        [](nb::handle qsl, int64_t num_speculative_tokens) {
          Call c("split_decode_prefill");
          TensorView q = c.in(qsl, "qsl", DType::I32);
          return split_dict(c.run([&] { return dsv41kv::split_decode_prefill(q, num_speculative_tokens); }));
        },
        ARR("qsl"), "num_speculative_tokens"_a = 0,
        "SPEC 6.2 decode/prefill split of a host qsl i32 [num_reqs + 1]: dict(num_reqs, num_decodes,\n"
        "num_decode_tokens, num_prefills, num_prefill_tokens).");
  m.def("build_swa_window",
        [](nb::handle qsl, nb::handle positions, nb::handle slot_swa, nb::handle block_table, nb::handle indices,
           nb::handle lengths, int64_t num_speculative_tokens, int64_t page, int64_t num_pages) {
          Call c("build_swa_window");
          SwaWindowArgs a;
          a.qsl = c.in(qsl, "qsl", DType::I32);
          a.positions = c.in(positions, "positions", DType::I64);
          a.slot_swa = c.in(slot_swa, "slot_swa", DType::I64);
          a.block_table = c.in(block_table, "block_table", DType::I32);
          a.indices = c.out(indices, "indices", DType::I32);
          a.lengths = c.out(lengths, "lengths", DType::I32);
          a.num_speculative_tokens = num_speculative_tokens;
          a.page = page;
          a.num_pages = num_pages;
          return split_dict(c.run([&] { return dsv41kv::build_swa_window(a); }));
        },
        ARR("qsl"), ARR("positions"), ARR("slot_swa"), ARR("block_table"), ARR("indices"), ARR("lengths"), kw,
        nb::arg("num_speculative_tokens") = 0, nb::arg("page") = 32, nb::arg("num_pages") = -1,
        "SPEC 6.6: the SWA window rows of the decode tokens (host arrays): indices i32 [max_tokens, 128] and\n"
        "lengths i32 [max_tokens] (outputs). Returns the split (split_decode_prefill).");
  m.def("build_prefill_gather",
        [](nb::handle qsl, nb::handle seq_lens, nb::handle gather_lens, nb::handle gather_starts,
           int64_t num_speculative_tokens) {
          Call c("build_prefill_gather");
          PrefillGatherArgs a;
          a.qsl = c.in(qsl, "qsl", DType::I32);
          a.seq_lens = c.in(seq_lens, "seq_lens", DType::I64);
          a.gather_lens = c.out(gather_lens, "gather_lens", DType::I64);
          a.gather_starts = c.out(gather_starts, "gather_starts", DType::I64);
          a.num_speculative_tokens = num_speculative_tokens;
          return split_dict(c.run([&] { return dsv41kv::build_prefill_gather(a); }));
        },
        ARR("qsl"), ARR("seq_lens"), ARR("gather_lens"), ARR("gather_starts"), kw,
        nb::arg("num_speculative_tokens") = 0,
        "SPEC 6.6: per prefill request the SWA gather length and start (i64 [>= num_prefills] outputs) from\n"
        "seq_lens i64 [>= num_reqs]. Host arrays. Returns the split.");
  m.def("build_decode_topk_slots",
        [](nb::handle qsl, nb::handle slot_swa, nb::handle topk, nb::handle block_table, nb::handle indices,
           nb::handle lengths, int64_t num_speculative_tokens, int64_t states_per_page, int64_t num_pages) {
          Call c("build_decode_topk_slots");
          DecodeTopkSlotArgs a;
          a.qsl = c.in(qsl, "qsl", DType::I32);
          a.slot_swa = c.in(slot_swa, "slot_swa", DType::I64);
          a.topk = c.in(topk, "topk", DType::I32);
          a.block_table = c.in(block_table, "block_table", DType::I32);
          a.indices = c.out(indices, "indices", DType::I32);
          a.lengths = c.out(lengths, "lengths", DType::I32);
          a.num_speculative_tokens = num_speculative_tokens;
          a.states_per_page = states_per_page;
          a.num_pages = num_pages;
          return split_dict(c.run([&] { return dsv41kv::build_decode_topk_slots(a); }));
        },
        ARR("qsl"), ARR("slot_swa"), ARR("topk"), ARR("block_table"), ARR("indices"), ARR("lengths"), kw,
        nb::arg("num_speculative_tokens") = 0, nb::arg("states_per_page") = 64, nb::arg("num_pages") = -1,
        "SPEC 6.6: the decode tokens' top-k entries (topk i32 [>= T, K]) as global compressed slots:\n"
        "indices i32 [max_tokens, K], lengths i32 [max_tokens] (outputs). Host arrays. Returns the split.");
  m.def("kernel_block_size", [](const std::string& device) { return dsv41kv::kernel_block_size(parse_device(device)); },
        "device"_a = "cpu", "Tokens per compressed kernel page (SPEC 6.7): 64 on SM90 and the CPU, 128 otherwise.");
  m.def("select_backend",
        [](const ModelConfig& cfg, const std::string& device, const std::string& kv_cache_dtype, int64_t block_size,
           const std::string& backend) {
          BackendOptions o;
          if (backend == "sparse") o.backend = AttentionBackend::kSparse;
          else if (backend == "mega") o.backend = AttentionBackend::kMega;
          else value_error("select_backend: backend = '" + backend + "', expected 'sparse' or 'mega'");
          const BackendSelection s = dsv41kv::select_backend(cfg, parse_device(device), kv_cache_dtype, block_size, o);
          nb::dict d;
          d["backend"] = attention_backend_name(s.backend);
          d["kv_cache_dtype"] = s.kv_cache_dtype;
          d["swa_format"] = record_info(s.swa_format).name;
          d["compressed_format"] = record_info(s.compressed_format).name;
          d["kernel_block_size"] = s.kernel_block_size;
          d["topk_tokens"] = s.topk_tokens;
          return d;
        },
        "config"_a, "device"_a = "cpu", "kv_cache_dtype"_a = "auto", "block_size"_a = 0, "backend"_a = "sparse",
        "SPEC 6.7's backend check: a dict(backend, kv_cache_dtype, swa_format, compressed_format,\n"
        "kernel_block_size, topk_tokens), or ValueError listing every failing check (E4 / E5).");

  // ------------------------------------------------------------ indexer
  m.def("indexer_k_store",
        [](nb::handle latent, nb::handle positions, nb::handle slots, nb::handle wk, nb::handle k_norm, float eps,
           nb::handle rope_table, nb::handle k_cache, int64_t states_per_page, int ratio, const std::string& k_format,
           nb::handle stream) {
          Call c("indexer_k_store");
          IndexKStoreArgs a;
          a.ratio = ratio;
          a.latent = c.in(latent, "latent", DType::BF16);
          a.positions = c.in(positions, "positions", DType::I64);
          a.slots = c.in(slots, "slots", DType::I64);
          a.wk = c.in(wk, "wk", DType::BF16);
          a.k_norm = c.in(k_norm, "k_norm", DType::BF16);
          a.eps = eps;
          a.rope_table = c.in(rope_table, "rope_table", DType::F32);
          a.cache = c.index_k_cache(k_cache, "k_cache", k_format, states_per_page, true);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::indexer_k_store(a, x); });
        },
        ARR("latent"), ARR("positions"), ARR("slots"), ARR("wk"), ARR("k_norm"), ARR("eps"), ARR("rope_table"),
        ARR("k_cache"), kw, ARR("states_per_page"), nb::arg("ratio") = 2, nb::arg("k_format") = "fp8_132", STREAM,
        "SPEC 8.1 index-K store: latent bf16 [rows >= N, 512], positions i64, slots i64 [N], wk bf16 [128, 512],\n"
        "k_norm bf16 [128], rope_table f32 [rows, 64]; k_cache uint8 [num_pages, page_bytes] (output).");
  m.def("indexer_prepare_q",
        [](nb::handle q, nb::handle w_raw, nb::handle positions, nb::handle rope_table, nb::handle q8, nb::handle w,
           nb::handle stream) {
          Call c("indexer_prepare_q");
          IndexQPrepArgs a;
          a.q = c.in(q, "q", DType::BF16);
          a.w_raw = c.in(w_raw, "w_raw", DType::BF16);
          a.positions = c.in(positions, "positions", DType::I64);
          a.rope_table = c.in(rope_table, "rope_table", DType::F32);
          a.q8 = c.out(q8, "q8", DType::U8);
          a.w = c.out(w, "w", DType::F32);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::indexer_prepare_q(a, x); });
        },
        ARR("q"), ARR("w_raw"), ARR("positions"), ARR("rope_table"), ARR("q8"), ARR("w"), kw, STREAM,
        "SPEC 8.2: q bf16 [T, 32, 128], w_raw bf16 [T, 32] -> q8 uint8 [rows >= T, 32, 128] (e4m3 codes) and\n"
        "w f32 [rows >= T, 32] (folded weights).");
  m.def("indexer_topk",
        [](nb::handle q8, nb::handle w, nb::handle positions, nb::handle token_to_req, nb::handle block_table,
           nb::handle k_cache, nb::handle topk, int64_t states_per_page, int ratio, const std::string& role,
           nb::handle token_valid, nb::handle candidates, nb::handle scores, nb::handle workspace, int num_threads,
           nb::handle stream) {
          Call c("indexer_topk");
          IndexerTopkArgs a;
          a.ratio = ratio;
          a.role = parse_role(role);
          a.q8 = c.in(q8, "q8", DType::U8);
          a.w = c.in(w, "w", DType::F32);
          a.positions = c.in(positions, "positions", DType::I64);
          a.token_to_req = c.in(token_to_req, "token_to_req", DType::I32);
          a.token_valid = c.in(token_valid, "token_valid", DType::I32, true);
          a.block_table = c.in(block_table, "block_table", DType::I32);
          a.k_cache = c.index_k_cache(k_cache, "k_cache", "fp8_132", states_per_page, false);
          a.topk = c.out(topk, "topk", DType::I32);
          a.candidates = a.role == IndexerRole::kCandidateSource ? c.out(candidates, "candidates", DType::I32, true)
                                                                 : c.in(candidates, "candidates", DType::I32, true);
          a.scores = c.out(scores, "scores", DType::F32, true);
          a.workspace = c.out(workspace, "workspace", DType::U8, true);
          ExecContext x = c.ctx(stream, num_threads);
          c.run([&] { dsv41kv::indexer_topk(a, x); });
        },
        ARR("q8"), ARR("w"), ARR("positions"), ARR("token_to_req"), ARR("block_table"), ARR("k_cache"), ARR("topk"),
        kw, ARR("states_per_page"), nb::arg("ratio") = 1, nb::arg("role") = "plain", OPT("token_valid"),
        OPT("candidates"), OPT("scores"), OPT("workspace"), nb::arg("num_threads") = 0, STREAM,
        "SPEC 8.3-8.5, 8.7: scores and top-512. q8 uint8 [rows >= T, 32, 128], w f32 [rows >= T, 32],\n"
        "positions i64 [T], token_to_req i32 [T], block_table i32 [num_reqs, max_pages], k_cache uint8\n"
        "[num_pages, page_bytes] (fp8_132); topk i32 [rows >= T, 512] (output); candidates i32 [rows >= T, 2048]\n"
        "(written by role 'candidate_source', read by 'candidate_consumer'); scores f32 [rows >= T, cols]\n"
        "(optional output); workspace uint8 [>= indexer_topk_workspace_bytes(...)] (CUDA: required, 16-byte\n"
        "aligned; not read on the CPU); token_valid i32 [T] optional.");
  m.def("indexer_topk_workspace_bytes",
        [](int64_t T, int64_t max_pages, int64_t states_per_page, const std::string& role) {
          return indexer_topk_workspace_bytes(T, max_pages, states_per_page, parse_role(role));
        },
        "T"_a, "max_pages"_a, "states_per_page"_a, "role"_a = "plain",
        "Bytes of indexer_topk's CUDA workspace for T tokens and a block table of max_pages pages of\n"
        "states_per_page states.");
  m.def("indexer_takes_shortcut", &indexer_takes_shortcut, "max_seq_len_in_batch"_a, "ratio"_a,
        "capturing_cuda_graph"_a = false, "SPEC 8.6: whether a step's indexer takes the short-context shortcut.");
  m.def("indexer_shortcut_topk",
        [](nb::handle positions, nb::handle topk, int ratio, nb::handle token_valid, nb::handle stream) {
          Call c("indexer_shortcut_topk");
          IndexerShortcutArgs a;
          a.ratio = ratio;
          a.positions = c.in(positions, "positions", DType::I64);
          a.token_valid = c.in(token_valid, "token_valid", DType::I32, true);
          a.topk = c.out(topk, "topk", DType::I32);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::indexer_shortcut_topk(a, x); });
        },
        ARR("positions"), ARR("topk"), kw, nb::arg("ratio") = 1, OPT("token_valid"), STREAM,
        "SPEC 8.6: topk i32 [rows >= T, 512] (output) = 0 .. n_c - 1 then -1; positions i64 [T].");

  // ------------------------------------------------------------ attention
  nb::class_<DecodeSchedule>(m, "DecodeSchedule", "A decode step's split-K plan (plan_decode_schedule).")
      .def_prop_ro("layer", [](const DecodeSchedule& s) { return std::string(layer_type_name(s.layer)); })
      .def_ro("num_tokens", &DecodeSchedule::num_tokens).def_ro("num_heads", &DecodeSchedule::num_heads)
      .def_ro("s_q", &DecodeSchedule::s_q).def_ro("cmp_states_per_page", &DecodeSchedule::cmp_states_per_page)
      .def_ro("key_width", &DecodeSchedule::key_width).def_ro("key_blocks", &DecodeSchedule::key_blocks)
      .def_rw("splits", &DecodeSchedule::splits).def_rw("head_tile", &DecodeSchedule::head_tile)
      .def_prop_ro("device", [](const DecodeSchedule& s) { return std::string(s.device == Device::CUDA ? "cuda" : "cpu"); });
  m.def("plan_decode_schedule",
        [](const std::string& layer, int64_t num_tokens, int num_heads, int s_q, int64_t block_size, int num_threads,
           const std::string& device) {
          DecodeScheduleArgs a;
          a.layer = parse_layer(layer);
          a.num_tokens = num_tokens;
          a.num_heads = num_heads;
          a.s_q = s_q;
          a.block_size = block_size;
          if (device != "cpu" && device != "cuda")
            throw nb::value_error(("plan_decode_schedule: device = '" + device + "', expected 'cpu' or 'cuda'").c_str());
          a.device = device == "cuda" ? Device::CUDA : Device::CPU;
          ExecContext x;
          x.num_threads = num_threads;
          return dsv41kv::plan_decode_schedule(a, x);
        },
        "layer"_a, "num_tokens"_a, "num_heads"_a = 64, "s_q"_a = 1, "block_size"_a = 64, "num_threads"_a = 0,
        "device"_a = "cpu",
        "The decode schedule of one step and layer type ('swaonly', 'c1a', 'c2a'), for sparse_decode on\n"
        "device 'cpu' or 'cuda' (a CUDA schedule splits by the current GPU's SMs).");
  m.def("sparse_decode_workspace_floats", &sparse_decode_workspace_floats, "schedule"_a,
        "f32 elements of sparse_decode's CUDA split-K workspace for this schedule (0: none needed).");
  m.def("sparse_decode",
        [](const DecodeSchedule& schedule, nb::handle q, nb::handle swa_cache, nb::handle swa_indices,
           nb::handle swa_lens, nb::handle sink, nb::handle out, nb::handle lse, const std::string& swa_format,
           std::optional<int64_t> swa_states_per_page, float swa_fp8_scale, nb::handle cmp_cache,
           nb::handle cmp_indices, nb::handle cmp_lens, const std::string& cmp_format,
           std::optional<int64_t> cmp_states_per_page, float cmp_fp8_scale, int s_q, float softmax_scale,
           nb::handle workspace, int num_threads, nb::handle stream) {
          Call c("sparse_decode");
          SparseDecodeArgs a;
          a.schedule = &schedule;
          a.s_q = s_q;
          a.q = c.in(q, "q", DType::BF16);
          a.swa_cache = c.cache(swa_cache, "swa_cache", swa_format, swa_states_per_page, swa_fp8_scale, false);
          a.swa_indices = c.in(swa_indices, "swa_indices", DType::I32);
          a.swa_lens = c.in(swa_lens, "swa_lens", DType::I32);
          if (!cmp_cache.is_none())
            a.cmp_cache = c.cache(cmp_cache, "cmp_cache", cmp_format,
                                  cmp_states_per_page ? cmp_states_per_page : std::optional<int64_t>(schedule.cmp_states_per_page),
                                  cmp_fp8_scale, false);
          a.cmp_indices = c.in(cmp_indices, "cmp_indices", DType::I32, true);
          a.cmp_lens = c.in(cmp_lens, "cmp_lens", DType::I32, true);
          a.sink = c.in(sink, "sink", DType::F32);
          a.softmax_scale = softmax_scale;
          a.out = c.out(out, "out", DType::BF16);
          a.lse = c.out(lse, "lse", DType::F32);
          a.workspace = c.out(workspace, "workspace", DType::F32, true);
          ExecContext x = c.ctx(stream, num_threads);
          c.run([&] { dsv41kv::sparse_decode(a, x); });
        },
        "schedule"_a, ARR("q"), ARR("swa_cache"), ARR("swa_indices"), ARR("swa_lens"), ARR("sink"), ARR("out"),
        ARR("lse"), kw, nb::arg("swa_format") = "v4_584", nb::arg("swa_states_per_page").none() = 32,
        nb::arg("swa_fp8_scale") = 1.0f, OPT("cmp_cache"), OPT("cmp_indices"), OPT("cmp_lens"),
        nb::arg("cmp_format") = "v4_584", OPT("cmp_states_per_page"), nb::arg("cmp_fp8_scale") = 1.0f,
        nb::arg("s_q") = 1, nb::arg("softmax_scale") = kSoftmaxScale, OPT("workspace"), nb::arg("num_threads") = 0,
        STREAM,
        "Sparse MLA decode with sink (SPEC 9.4). q bf16 [T, H, 512]; swa_cache (see rope_quant_insert),\n"
        "swa_indices i32 [rows >= T, 128], swa_lens i32 [>= T]; c1a / c2a: cmp_cache, cmp_indices i32\n"
        "[rows >= T, 512], cmp_lens i32 [>= T]; sink f32 [H]; out bf16 [rows >= T, H, 512] and lse f32\n"
        "[rows >= T, H] (outputs); workspace f32 [>= sparse_decode_workspace_floats(schedule)] on the GPU\n"
        "(CUDA schedules with splits > 1).");
  m.def("sparse_prefill",
        [](nb::handle q, nb::handle kv, nb::handle indices, nb::handle topk_length, nb::handle sink, nb::handle out,
           nb::handle lse, float softmax_scale, int num_threads, nb::handle stream) {
          Call c("sparse_prefill");
          SparsePrefillArgs a;
          a.q = c.in(q, "q", DType::BF16);
          a.kv = c.in(kv, "kv", DType::BF16);
          a.indices = c.in(indices, "indices", DType::I32);
          a.topk_length = c.in(topk_length, "topk_length", DType::I32);
          a.sink = c.in(sink, "sink", DType::F32);
          a.softmax_scale = softmax_scale;
          a.out = c.out(out, "out", DType::BF16);
          a.lse = c.out(lse, "lse", DType::F32);
          ExecContext x = c.ctx(stream, num_threads);
          c.run([&] { dsv41kv::sparse_prefill(a, x); });
        },
        ARR("q"), ARR("kv"), ARR("indices"), ARR("topk_length"), ARR("sink"), ARR("out"), ARR("lse"), kw,
        nb::arg("softmax_scale") = kSoftmaxScale, nb::arg("num_threads") = 0, STREAM,
        "Sparse MLA prefill with sink over a bf16 workspace (SPEC 9.5 step 3): q bf16 [T, H, 512], kv bf16\n"
        "[s_kv, 512], indices i32 [rows >= T, topk], topk_length i32 [>= T], sink f32 [H]; out bf16\n"
        "[rows >= T, H, 512], lse f32 [rows >= T, H] (outputs).");
  nb::class_<PrefillChunk>(m, "PrefillChunk", "One chunk of prefill requests (plan_prefill_chunks).")
      .def(nb::init<>())
      .def_rw("req_begin", &PrefillChunk::req_begin).def_rw("req_end", &PrefillChunk::req_end)
      .def_rw("n_ch", &PrefillChunk::n_ch).def_rw("m_ch", &PrefillChunk::m_ch)
      .def("num_reqs", &PrefillChunk::num_reqs);
  m.def("plan_prefill_chunks",
        [](nb::handle seq_lens, nb::handle gather_lens, int ratio, int64_t max_model_len,
           int64_t max_num_batched_tokens) {
          Call c("plan_prefill_chunks");
          PrefillChunkArgs a;
          a.ratio = ratio;
          a.max_model_len = max_model_len;
          a.max_num_batched_tokens = max_num_batched_tokens;
          a.seq_lens = c.in(seq_lens, "seq_lens", DType::I32);
          a.gather_lens = c.in(gather_lens, "gather_lens", DType::I32);
          return c.run([&] { return dsv41kv::plan_prefill_chunks(a); });
        },
        ARR("seq_lens"), ARR("gather_lens"), kw, ARR("ratio"), ARR("max_model_len"), ARR("max_num_batched_tokens"),
        "SPEC 9.5's greedy chunk plan over host seq_lens / gather_lens i32 [R]: a list of PrefillChunk.");
  m.def("gather_prefill_workspace",
        [](const PrefillChunk& chunk, nb::handle seq_lens, nb::handle gather_lens, nb::handle gather_starts,
           nb::handle swa_cache, nb::handle swa_block_table, nb::handle workspace, int ratio,
           const std::string& swa_format, std::optional<int64_t> swa_states_per_page, float swa_fp8_scale,
           nb::handle cmp_cache, nb::handle cmp_block_table, const std::string& cmp_format,
           std::optional<int64_t> cmp_states_per_page, float cmp_fp8_scale, nb::handle stream) {
          Call c("gather_prefill_workspace");
          WorkspaceGatherArgs a;
          a.ratio = ratio;
          a.chunk = chunk;
          a.seq_lens = c.in(seq_lens, "seq_lens", DType::I32);
          a.gather_lens = c.in(gather_lens, "gather_lens", DType::I32);
          a.gather_starts = c.in(gather_starts, "gather_starts", DType::I32);
          a.swa_cache = c.cache(swa_cache, "swa_cache", swa_format, swa_states_per_page, swa_fp8_scale, false);
          a.swa_block_table = c.in(swa_block_table, "swa_block_table", DType::I32);
          if (!cmp_cache.is_none())
            a.cmp_cache = c.cache(cmp_cache, "cmp_cache", cmp_format, cmp_states_per_page, cmp_fp8_scale, false);
          a.cmp_block_table = c.in(cmp_block_table, "cmp_block_table", DType::I32, true);
          a.workspace = c.out(workspace, "workspace", DType::BF16);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::gather_prefill_workspace(a, x); });
        },
        "chunk"_a, ARR("seq_lens"), ARR("gather_lens"), ARR("gather_starts"), ARR("swa_cache"), ARR("swa_block_table"),
        ARR("workspace"), kw, ARR("ratio"), nb::arg("swa_format") = "v4_584", nb::arg("swa_states_per_page").none() = 32,
        nb::arg("swa_fp8_scale") = 1.0f, OPT("cmp_cache"), OPT("cmp_block_table"), nb::arg("cmp_format") = "v4_584",
        OPT("cmp_states_per_page"), nb::arg("cmp_fp8_scale") = 1.0f, STREAM,
        "SPEC 9.5 step 1: the chunk's compressed entries and SWA window into workspace bf16 [rows, 512].\n"
        "seq_lens / gather_lens / gather_starts i32 [R]; block tables i32 [R, pages].");
  m.def("build_prefill_indices",
        [](const PrefillChunk& chunk, nb::handle positions, nb::handle token_to_req, nb::handle gather_lens,
           nb::handle gather_starts, nb::handle indices, nb::handle lengths, int ratio, nb::handle topk,
           nb::handle stream) {
          Call c("build_prefill_indices");
          PrefillIndexArgs a;
          a.ratio = ratio;
          a.chunk = chunk;
          a.positions = c.in(positions, "positions", DType::I64);
          a.token_to_req = c.in(token_to_req, "token_to_req", DType::I32);
          a.gather_lens = c.in(gather_lens, "gather_lens", DType::I32);
          a.gather_starts = c.in(gather_starts, "gather_starts", DType::I32);
          a.topk = c.in(topk, "topk", DType::I32, true);
          a.indices = c.out(indices, "indices", DType::I32);
          a.lengths = c.out(lengths, "lengths", DType::I32);
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::build_prefill_indices(a, x); });
        },
        "chunk"_a, ARR("positions"), ARR("token_to_req"), ARR("gather_lens"), ARR("gather_starts"), ARR("indices"),
        ARR("lengths"), kw, ARR("ratio"), OPT("topk"), STREAM,
        "SPEC 9.5 step 2: the combined index rows i32 [rows >= T, 640] and lengths i32 [>= T] (outputs)\n"
        "of the chunk's query tokens (positions i64 [T], token_to_req i32 [T]; topk i32 [rows >= T, 512]\n"
        "for ratio > 0).");
  m.def("attention_output_rope",
        [](nb::handle o, nb::handle positions, nb::handle rope_table, nb::handle out, int num_real_heads,
           nb::handle stream) {
          Call c("attention_output_rope");
          OutputRopeArgs a;
          a.o = c.in(o, "o", DType::BF16);
          a.positions = c.in(positions, "positions", DType::I64);
          a.rope_table = c.in(rope_table, "rope_table", DType::F32);
          a.out = c.out(out, "out", DType::BF16);
          a.num_real_heads = num_real_heads;
          ExecContext x = c.ctx(stream);
          c.run([&] { dsv41kv::attention_output_rope(a, x); });
        },
        ARR("o"), ARR("positions"), ARR("rope_table"), ARR("out"), kw, ARR("num_real_heads"), STREAM,
        "SPEC 9.6: the inverse RoPE of the attention output o bf16 [T, H, 512] into out bf16\n"
        "[rows >= T, num_real_heads, 512] (may be o itself).");
}

// ---------------------------------------------------------------- the whole layer (attention_layer.hpp)
//
// The library objects own their buffers; their views come back as arrays over that memory, kept
// alive by the Python object they belong to: numpy arrays for a CPU configuration (bf16 as its
// uint16 bits), DLPack arrays (__dlpack__: torch.from_dlpack, cupy.from_dlpack) on CUDA, bf16 as
// bfloat16. A view holds the last step's data until the next one.
namespace {

using pipeline::AttentionLayer;
using pipeline::LayerInputs;
using pipeline::LayerShared;
using pipeline::LayerStepStats;
using pipeline::LayerWeights;
using pipeline::ReadPathConfig;
using pipeline::ServingConfig;
using pipeline::StepBatch;
using pipeline::StepMetadata;
using pipeline::StepRequest;

// A ServingConfig with the CUDA ordinal its objects live on: the library's configuration names
// the backend only, and CUDA buffers are allocated on the device current at construction.
struct Serving {
  ServingConfig c;
  int device_id = 0;
};

std::string device_label(const Serving& s) {
  return s.c.device == Device::CUDA ? "cuda:" + std::to_string(s.device_id) : "cpu";
}

// Makes a CUDA ordinal current for a scope, the previous one restored.
class DeviceScope {
 public:
  DeviceScope(const Serving& s, const char* op) {
#if defined(DSV41KV_WITH_CUDA)
    if (s.c.device == Device::CUDA && cudaGetDevice(&prev_) == cudaSuccess && prev_ != s.device_id) {
      if (cudaSetDevice(s.device_id) != cudaSuccess)
        value_error(std::string(op) + ": cannot make device " + std::to_string(s.device_id) + " current");
    } else {
      prev_ = -1;
    }
#else
    (void)s;
    (void)op;
#endif
  }
  ~DeviceScope() {
#if defined(DSV41KV_WITH_CUDA)
    if (prev_ >= 0) cudaSetDevice(prev_);
#endif
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

// The ExecContext of a call that takes no arrays (construction, StepMetadata.build): on CUDA
// `stream`, None being the framework's current stream on the configuration's device
// (dsv41kv._streams.current_device_stream); on the CPU no stream.
ExecContext exec_for(const Serving& s, nb::handle stream, const char* op) {
  ExecContext x = s.c.exec;
  if (s.c.device == Device::CUDA) {
    nb::object v = nb::borrow(stream);
    if (v.is_none()) v = nb::module_::import_("dsv41kv._streams").attr("current_device_stream")(s.device_id);
    x.stream = Call::stream_pointer(v, op);
  } else if (!stream.is_none() && !(nb::isinstance<nb::int_>(stream) && nb::cast<int64_t>(stream) == 0)) {
    value_error(std::string(op) + ": stream: given for a CPU configuration (the CPU backend runs on the calling thread)");
  }
  return x;
}

// A view of library-owned memory as an array that keeps `owner` alive.
nb::object owned_array(const TensorView& v, nb::handle owner, int device_id) {
  size_t shape[4];
  int64_t strides[4];
  for (int i = 0; i < v.ndim; ++i) {
    shape[i] = static_cast<size_t>(v.shape[i]);
    strides[i] = v.stride[i];
  }
  const bool host = v.device == Device::CPU;
  using Code = nb::dlpack::dtype_code;
  nb::dlpack::dtype dt{};
  dt.lanes = 1;
  auto set = [&](Code c, int bits) {
    dt.code = static_cast<uint8_t>(c);
    dt.bits = static_cast<uint8_t>(bits);
  };
  switch (v.dtype) {
    case DType::F32: set(Code::Float, 32); break;
    case DType::BF16: set(host ? Code::UInt : Code::Bfloat, 16); break;  // numpy has no bfloat16
    case DType::U8: set(Code::UInt, 8); break;
    case DType::I32: set(Code::Int, 32); break;
    case DType::I64: set(Code::Int, 64); break;
  }
  if (host)
    return nb::cast(nb::ndarray<nb::numpy>(v.data, static_cast<size_t>(v.ndim), shape, owner, strides, dt,
                                           nb::device::cpu::value, 0),
                    nb::rv_policy::reference);
  return nb::cast(nb::ndarray<>(v.data, static_cast<size_t>(v.ndim), shape, owner, strides, dt, nb::device::cuda::value,
                                device_id),
                  nb::rv_policy::reference);
}

// A paged cache as the package takes caches: packed formats uint8 [num_pages, page_stride],
// plain rows [num_pages, S, 512] (bf16 or fp8 codes) with the cache's page and row strides.
nb::object cache_array(const CacheView& c, nb::handle owner, int device_id) {
  const RecordInfo& info = record_info(c.format);
  TensorView v;
  v.data = c.base;
  v.device = c.device;
  v.dtype = info.element;
  if (info.packed) {
    v.ndim = 2;
    v.shape = {c.num_pages, c.page_stride, 0, 0};
    v.stride = {c.page_stride, 1, 0, 0};
  } else {
    v.ndim = 3;
    v.shape = {c.num_pages, c.states_per_page, kLatentDim, 0};
    v.stride = {c.page_stride, c.row_stride, 1, 0};
  }
  return owned_array(v, owner, device_id);
}

nb::object index_k_array(const IndexKCacheView& c, nb::handle owner, int device_id) {
  TensorView v;
  v.data = c.base;
  v.device = c.device;
  v.dtype = DType::U8;
  v.ndim = 2;
  v.shape = {c.num_pages, c.page_stride, 0, 0};
  v.stride = {c.page_stride, 1, 0, 0};
  return owned_array(v, owner, device_id);
}

// A host array copied into a vector: `dims` its shape (-1: any extent), in any strides.
template <class T>
std::vector<T> host_vector(const TensorView& v, const char* op, const char* arg, std::vector<int64_t> dims,
                           const char* what) {
  bool ok = v.device == Device::CPU && v.ndim == static_cast<int>(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = dims[i] < 0 || v.shape[i] == dims[i];
  if (!ok) value_error(std::string(op) + ": " + arg + ": " + v.describe() + ", expected a host " + what);
  std::vector<T> out;
  const int64_t rows = v.shape[0], cols = v.ndim == 2 ? v.shape[1] : 1;
  const int64_t cs = v.ndim == 2 ? v.stride[1] : 0;
  out.reserve(static_cast<size_t>(rows * cols));
  const T* p = static_cast<const T*>(v.data);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) out.push_back(p[r * v.stride[0] + k * cs]);
  return out;
}

Device parse_serving_device(const std::string& s, int& id) {
  if (s == "cpu") {
    id = 0;
    return Device::CPU;
  }
  if (s == "cuda" || s.rfind("cuda:", 0) == 0) {
    id = 0;
    if (s.size() > 5) {
      char* end = nullptr;
      const long v = std::strtol(s.c_str() + 5, &end, 10);
      if (*end != '\0' || v < 0) value_error("ServingConfig: device = '" + s + "', expected 'cpu', 'cuda' or 'cuda:N'");
      id = static_cast<int>(v);
    } else {
#if defined(DSV41KV_WITH_CUDA)
      if (cudaGetDevice(&id) != cudaSuccess) id = 0;
#endif
    }
    return Device::CUDA;
  }
  value_error("ServingConfig: device = '" + s + "', expected 'cpu', 'cuda' or 'cuda:N'");
}

IndexKFormat parse_index_k_format(const std::string& f, const char* op) {
  if (f == "fp8_132" || f == "fp8" || f == "132") return IndexKFormat::FP8_132;
  if (f == "mxfp4_68" || f == "mxfp4" || f == "68") return IndexKFormat::MXFP4_68;
  value_error(std::string(op) + ": index_k_format = '" + f + "', expected 'fp8_132' or 'mxfp4_68'");
}

RecordFormat parse_format_arg(const std::string& f, const char* op, const char* arg) {
  try {
    return parse_record_format(f.c_str());
  } catch (const Error& e) {
    value_error(std::string(op) + ": " + arg + ": " + e.what());
  }
}

struct Meta {
  Serving cfg;
  std::unique_ptr<StepMetadata> m;
};
struct Shared {
  Serving cfg;
  std::unique_ptr<LayerShared> s;
};
struct Layer {
  Serving cfg;
  std::unique_ptr<AttentionLayer> l;
};

void same_device(const Serving& a, const Serving& b, const char* op, const char* arg) {
  if (a.c.device != b.c.device || (a.c.device == Device::CUDA && a.device_id != b.device_id))
    value_error(std::string(op) + ": " + arg + ": on " + device_label(a) + ", the layer on " + device_label(b));
}

enum class StepMode { kFull, kQueries, kWrites };

// One step of the layer: the inputs through DLPack (one device, the layer's), the layer's ops on
// `stream` (CUDA; None: the framework's current stream of the inputs) without the GIL.
void layer_step(Layer& L, Meta& M, nb::handle q, nb::handle kv, nb::handle kv_score, nb::handle index_q,
                nb::handle w_raw, StepMode mode, int64_t step_max_seq_len, nb::handle stream, const char* op) {
  Call c(op);
  LayerInputs in;
  in.q = c.in(q, "q", DType::BF16);
  in.kv = c.in(kv, "kv", DType::BF16);
  in.kv_score = c.in(kv_score, "kv_score", DType::F32, true);
  in.index_q = c.in(index_q, "index_q", DType::BF16, true);
  in.w_raw = c.in(w_raw, "w_raw", DType::BF16, true);
  same_device(M.cfg, L.cfg, op, "meta");
  if (c.device() != L.cfg.c.device || (c.device() == Device::CUDA && c.cuda_device() != L.cfg.device_id))
    value_error(std::string(op) + ": q: on " +
                (c.device() == Device::CUDA ? "cuda:" + std::to_string(c.cuda_device()) : std::string("cpu")) +
                ", the layer on " + device_label(L.cfg));
  ExecContext x = L.cfg.c.exec;
  x.stream = c.ctx(stream).stream;
  L.l->set_exec(x);
  c.run([&] {
    switch (mode) {
      case StepMode::kFull: L.l->run(*M.m, in); break;
      case StepMode::kQueries: L.l->run_queries(*M.m, in, step_max_seq_len); break;
      case StepMode::kWrites: L.l->run_writes(*M.m, in); break;
    }
  });
}

constexpr const char* kInputsDoc =
    "meta: this step's StepMetadata (built from the layer's configuration); q bf16 [>= N, H, 512], inner\n"
    "stride 1 (the queries before RoPE); kv bf16 [>= N, 512] contiguous (the normalized kv rows); kv\n"
    "sources: kv_score f32 [>= N, 512 * ratio] (inner stride 1, row stride a multiple of 16); index\n"
    "sources: index_q bf16 [>= N, 32, 128] and w_raw bf16 [>= N, 32], contiguous. Others: None. N =\n"
    "meta.num_rows; every input on the layer's device.";

}  // namespace

void bind_layer(nb::module_& m) {
  // ------------------------------------------------------------ configuration
  nb::class_<Serving>(m, "ServingConfig",
                      "The geometry of a serving step (pipeline::ServingConfig): rows, requests, the SWA cache and\n"
                      "the compressed caches of each layer type, on one device ('cpu', 'cuda', 'cuda:N').")
      .def("__init__",
           [](Serving* self, const std::string& device, int64_t max_tokens, int64_t max_requests,
              int64_t num_speculative_tokens, int64_t ring_blocks, int64_t swa_page_tokens, int64_t swa_num_pages,
              int64_t swa_block_table_width, int64_t c1a_states_per_page, int64_t c1a_num_pages,
              int64_t c1a_block_table_width, int64_t c2a_states_per_page, int64_t c2a_num_pages,
              int64_t c2a_block_table_width, std::optional<std::vector<std::string>> formats, float fp8_scale,
              int num_threads) {
             Serving s;
             s.c.device = parse_serving_device(device, s.device_id);
             s.c.exec.num_threads = num_threads;
             s.c.max_tokens = max_tokens;
             s.c.max_requests = max_requests;
             s.c.num_speculative_tokens = num_speculative_tokens;
             s.c.ring_blocks = ring_blocks;
             s.c.swa = {swa_page_tokens, swa_num_pages, swa_block_table_width};
             s.c.c1a = {c1a_states_per_page, c1a_num_pages, c1a_block_table_width};
             s.c.c2a = {c2a_states_per_page, c2a_num_pages, c2a_block_table_width};
             if (formats) {
               s.c.formats.clear();
               for (const std::string& f : *formats) s.c.formats.push_back(parse_format_arg(f, "ServingConfig", "formats"));
             }
             s.c.fp8_scale = fp8_scale;
             pipeline::validate(s.c);
             if (num_threads < 0)
               value_error("ServingConfig: num_threads = " + std::to_string(num_threads) + ", expected >= 0 (0: every core)");
             new (self) Serving(std::move(s));
           },
           kw, "device"_a = "cpu", "max_tokens"_a, "max_requests"_a, "num_speculative_tokens"_a = 0, "ring_blocks"_a = 0,
           "swa_page_tokens"_a = 32, "swa_num_pages"_a = 0, "swa_block_table_width"_a = 0, "c1a_states_per_page"_a = 0,
           "c1a_num_pages"_a = 0, "c1a_block_table_width"_a = 0, "c2a_states_per_page"_a = 0, "c2a_num_pages"_a = 0,
           "c2a_block_table_width"_a = 0, "formats"_a.none() = nb::none(), "fp8_scale"_a = 1.0f, "num_threads"_a = 0,
           "max_tokens: rows of a step (padding included); max_requests; num_speculative_tokens (sets the ring\n"
           "capacity); ring_blocks: blocks of every ratio-2 ring (block 0 the null block); swa_*: the SWA cache of\n"
           "every layer (pages of swa_page_tokens tokens, page 0 the null page; swa_num_pages 0: none);\n"
           "c1a_* / c2a_*: the compressed caches of each type (states_per_page 0: 64 / ratio; num_pages 0: not\n"
           "served); formats: the compressed formats a write-path layer writes (None: all five); fp8_scale: plain\n"
           "fp8 rows' scale; num_threads: CPU threads of every op (0: every core). dsv41kv.Error (E8) naming the\n"
           "field for an invalid configuration.")
      .def_prop_ro("device", [](const Serving& s) { return device_label(s); })
      .def_prop_ro("max_tokens", [](const Serving& s) { return s.c.max_tokens; })
      .def_prop_ro("max_requests", [](const Serving& s) { return s.c.max_requests; })
      .def_prop_ro("num_speculative_tokens", [](const Serving& s) { return s.c.num_speculative_tokens; })
      .def_prop_ro("ring_blocks", [](const Serving& s) { return s.c.ring_blocks; })
      .def_prop_ro("swa_page_tokens", [](const Serving& s) { return s.c.swa.page_tokens; })
      .def_prop_ro("swa_num_pages", [](const Serving& s) { return s.c.swa.num_pages; })
      .def_prop_ro("swa_block_table_width", [](const Serving& s) { return s.c.swa.block_table_width; })
      .def_prop_ro("formats", [](const Serving& s) {
        std::vector<std::string> v;
        for (RecordFormat f : s.c.formats) v.push_back(record_info(f).name);
        return v;
      })
      .def_prop_ro("fp8_scale", [](const Serving& s) { return s.c.fp8_scale; })
      .def_prop_ro("num_threads", [](const Serving& s) { return s.c.exec.num_threads; })
      .def("states_per_page", [](const Serving& s, int ratio) { return s.c.states_per_page(ratio); }, "ratio"_a,
           "S_r of the compressed caches of ratio 1 or 2 (E2 otherwise).")
      .def("num_pages", [](const Serving& s, int ratio) { return s.c.compressed(ratio).num_pages; }, "ratio"_a,
           "Pages of each compressed cache of ratio 1 or 2 (0: not served).")
      .def("block_table_width", [](const Serving& s, int ratio) { return s.c.compressed(ratio).block_table_width; },
           "ratio"_a, "Block-table columns of ratio 1 or 2.")
      .def("serves", [](const Serving& s, int ratio) { return s.c.serves(ratio); }, "ratio"_a,
           "Whether layers of ratio 1 or 2 are served.")
      .def("ring_capacity", [](const Serving& s) { return s.c.ring_capacity(); },
           "Rows per ring block (SPEC 3.2) for num_speculative_tokens.");

  nb::class_<ReadPathConfig>(m, "ReadPathConfig", "The read path's choices, shared by every layer of a model.")
      .def("__init__",
           [](ReadPathConfig* self, float eps, int64_t max_model_len, int num_heads, int padded_heads,
              const std::string& swa_format, const std::string& compressed_format, const std::string& index_k_format,
              float softmax_scale, bool capturing_cuda_graph, bool device_stats) {
             ReadPathConfig r;
             r.eps = eps;
             r.max_model_len = max_model_len;
             r.num_heads = num_heads;
             r.padded_heads = padded_heads;
             r.swa_format = parse_format_arg(swa_format, "ReadPathConfig", "swa_format");
             r.compressed_format = parse_format_arg(compressed_format, "ReadPathConfig", "compressed_format");
             r.index_k_format = parse_index_k_format(index_k_format, "ReadPathConfig");
             r.softmax_scale = softmax_scale;
             r.capturing_cuda_graph = capturing_cuda_graph;
             r.device_stats = device_stats;
             pipeline::validate(r);
             new (self) ReadPathConfig(r);
           },
           kw, "eps"_a, "max_model_len"_a, "num_heads"_a = 64, "padded_heads"_a = 0, "swa_format"_a = "v4_584",
           "compressed_format"_a = "v4_584", "index_k_format"_a = "fp8_132", "softmax_scale"_a = 0.0f,
           "capturing_cuda_graph"_a = false, "device_stats"_a = false,
           "eps: the model's rms_norm_eps (required); max_model_len: the longest sequence (sizes the prefill\n"
           "workspace); num_heads: H of q (8, 16, 32, 64, 128); padded_heads: 0, or 64 / 128 above H (sink -inf\n"
           "heads); swa_format: 'v4_584', 'mxfp8_528', 'bf16', 'fp8'; compressed_format: any record format;\n"
           "index_k_format: 'fp8_132'; softmax_scale 0: 512^-0.5; capturing_cuda_graph: never take the indexer\n"
           "shortcut (SPEC 8.6); device_stats: CUDA layers fill last_stats' counts (synchronises).\n"
           "dsv41kv.Error (E8) naming the field for an invalid choice.")
      .def_ro("eps", &ReadPathConfig::eps)
      .def_ro("max_model_len", &ReadPathConfig::max_model_len)
      .def_ro("num_heads", &ReadPathConfig::num_heads)
      .def_ro("padded_heads", &ReadPathConfig::padded_heads)
      .def_prop_ro("swa_format", [](const ReadPathConfig& r) { return std::string(record_info(r.swa_format).name); })
      .def_prop_ro("compressed_format",
                   [](const ReadPathConfig& r) { return std::string(record_info(r.compressed_format).name); })
      .def_prop_ro("index_k_format", [](const ReadPathConfig& r) { return std::string(index_k_format_name(r.index_k_format)); })
      .def_ro("softmax_scale", &ReadPathConfig::softmax_scale)
      .def_ro("capturing_cuda_graph", &ReadPathConfig::capturing_cuda_graph)
      .def_ro("device_stats", &ReadPathConfig::device_stats)
      .def("heads_padded", &ReadPathConfig::heads_padded, "H_pad the attention runs with (num_heads when not padded).");

  // ------------------------------------------------------------ one step's metadata
  nb::class_<StepRequest>(m, "StepRequest",
                          "One request of a step (SPEC 6.1): positions num_computed .. num_computed + query_len - 1.")
      .def("__init__",
           [](StepRequest* self, int64_t query_len, int64_t num_computed, int32_t ring_block,
              std::vector<int32_t> swa_pages, std::vector<int32_t> c1a_pages, std::vector<int32_t> c2a_pages) {
             StepRequest r;
             r.query_len = query_len;
             r.num_computed = num_computed;
             r.ring_block = ring_block;
             r.swa_pages = std::move(swa_pages);
             r.c1a_pages = std::move(c1a_pages);
             r.c2a_pages = std::move(c2a_pages);
             new (self) StepRequest(std::move(r));
           },
           "query_len"_a, "num_computed"_a = 0, kw, "ring_block"_a = 0, "swa_pages"_a = std::vector<int32_t>{},
           "c1a_pages"_a = std::vector<int32_t>{}, "c2a_pages"_a = std::vector<int32_t>{},
           "query_len, num_computed >= 0; ring_block: its block of every ratio-2 ring (<= 0: the null block);\n"
           "swa_pages / c1a_pages / c2a_pages: the block-table rows (list of int, physical page per logical page,\n"
           "<= 0 the null page; at most the configured width, missing entries 0).")
      .def_rw("query_len", &StepRequest::query_len)
      .def_rw("num_computed", &StepRequest::num_computed)
      .def_rw("ring_block", &StepRequest::ring_block)
      .def_rw("swa_pages", &StepRequest::swa_pages)
      .def_rw("c1a_pages", &StepRequest::c1a_pages)
      .def_rw("c2a_pages", &StepRequest::c2a_pages);

#define META_VIEW(name, doc)                                                                 \
  def(#name, [](nb::handle self) {                                                           \
    Meta& M = nb::cast<Meta&>(self);                                                         \
    return owned_array(M.m->name(), self, M.cfg.device_id);                                  \
  }, doc)
#define META_VIEW_R(name, doc)                                                               \
  def(#name, [](nb::handle self, int ratio) {                                                \
    Meta& M = nb::cast<Meta&>(self);                                                         \
    return owned_array(M.m->name(ratio), self, M.cfg.device_id);                             \
  }, "ratio"_a, doc)
  nb::class_<Meta>(m, "StepMetadata",
                   "The metadata of one step for every layer (SPEC 6), built once per step by build(). Its views\n"
                   "(arrays on the configuration's device over the object's memory) hold the last build.")
      .def("__init__",
           [](Meta* self, const Serving& cfg) {
             DeviceScope d(cfg, "StepMetadata");
             ServingConfig c = cfg.c;
             c.exec = exec_for(cfg, nb::none(), "StepMetadata");
             auto p = std::make_unique<StepMetadata>(c);
             new (self) Meta{cfg, std::move(p)};
           },
           "config"_a, "Allocates every buffer for the configuration's max_tokens rows and max_requests requests.")
      .def("build",
           [](Meta& M, const std::vector<StepRequest>& requests, int64_t padding_rows, nb::handle stream) {
             StepBatch b;
             b.requests = requests;
             b.padding_rows = padding_rows;
             DeviceScope d(M.cfg, "StepMetadata.build");
             M.m->set_exec(exec_for(M.cfg, stream, "StepMetadata.build"));
             nb::gil_scoped_release release;
             M.m->build(b);
           },
           "requests"_a, "padding_rows"_a = 0, kw, STREAM,
           "Builds the step of `requests` (a list of StepRequest, decodes first) and padding_rows padding rows\n"
           "(position 0, every slot -1): qsl, positions, token_to_req, the slot mappings, block tables, the\n"
           "SWA window rows and the prefill gather (SPEC 6). dsv41kv.Error (E8) naming the request and field\n"
           "before anything is written. CUDA: on `stream` (None: the framework's current stream of the device).")
      .def_prop_ro("num_requests", [](const Meta& M) { return M.m->num_requests(); })
      .def_prop_ro("num_tokens", [](const Meta& M) { return M.m->num_tokens(); }, "Real tokens of the last build.")
      .def_prop_ro("num_rows", [](const Meta& M) { return M.m->num_rows(); }, "N: real tokens + padding rows.")
      .def_prop_ro("max_position", [](const Meta& M) { return M.m->max_position(); })
      .def_prop_ro("max_seq_len", [](const Meta& M) { return M.m->max_seq_len(); })
      .def_prop_ro("decode_s_q", [](const Meta& M) { return M.m->decode_s_q(); })
      .def_prop_ro("generation", [](const Meta& M) { return M.m->generation(); }, "Builds so far.")
      .def_prop_ro("split", [](const Meta& M) { return split_dict(M.m->split()); },
                   "dict(num_reqs, num_decodes, num_decode_tokens, num_prefills, num_prefill_tokens).")
      .META_VIEW(qsl, "i32 [num_reqs + 1].")
      .META_VIEW(positions, "i64 [N].")
      .META_VIEW(token_to_req, "i32 [N].")
      .META_VIEW_R(compressed_slots, "i64 [N]: the compressed slot mapping of a served ratio (1 or 2).")
      .META_VIEW(ring_slots, "i64 [N]: the ratio-2 ring slots (c2a served).")
      .META_VIEW(ring_block_table, "i32 [num_reqs, 1].")
      .META_VIEW_R(block_table, "i32 [num_reqs, block_table_width] of a served ratio (1 or 2).")
      .META_VIEW(swa_block_table, "i32 [num_reqs, swa_block_table_width].")
      .META_VIEW(swa_slots, "i64 [N]: slot_swa (SPEC 6.4), -1 for an invalid token or padding.")
      .META_VIEW(token_valid, "i32 [N]: 1 where slot_swa >= 0.")
      .META_VIEW(seq_lens, "i64 [num_reqs]: num_computed + query_len.")
      .META_VIEW(swa_window, "i32 [max_tokens, 128]: the decode tokens' SWA window rows (SPEC 6.6).")
      .META_VIEW(swa_window_lens, "i32 [max_tokens]: their lengths (0 beyond the decodes).")
      .META_VIEW(gather_lens, "i64 [num_prefills]: the SWA gather length of each prefill (SPEC 6.6).")
      .META_VIEW(gather_starts, "i64 [num_prefills]: its start.");
#undef META_VIEW
#undef META_VIEW_R

  // ------------------------------------------------------------ weights, shared buffers, the layer
  nb::class_<LayerWeights>(m, "LayerWeights",
                           "The small weights of one layer, host copies: attn_sink f32 [H]; kv sources also\n"
                           "compressor_norm bf16 [512], wk bf16 [128, 512], k_norm bf16 [128].")
      .def("__init__",
           [](LayerWeights* self, nb::handle attn_sink, nb::handle compressor_norm, nb::handle wk, nb::handle k_norm) {
             const char* op = "LayerWeights";
             Call c(op);
             LayerWeights w;
             w.attn_sink = host_vector<float>(c.in(attn_sink, "attn_sink", DType::F32), op, "attn_sink", {-1}, "f32 [H]");
             const TensorView n = c.in(compressor_norm, "compressor_norm", DType::BF16, true);
             const TensorView k = c.in(wk, "wk", DType::BF16, true);
             const TensorView kn = c.in(k_norm, "k_norm", DType::BF16, true);
             if (n.present() != k.present() || n.present() != kn.present())
               value_error(std::string(op) + ": compressor_norm, wk, k_norm: all three (a kv source) or none, got " +
                           (n.present() ? "" : "no ") + "compressor_norm, " + (k.present() ? "" : "no ") + "wk, " +
                           (kn.present() ? "" : "no ") + "k_norm");
             if (n.present()) {
               w.compressor_norm = host_vector<uint16_t>(n, op, "compressor_norm", {kLatentDim}, "bf16 [512]");
               w.wk = host_vector<uint16_t>(k, op, "wk", {kIndexHeadDim, kLatentDim}, "bf16 [128, 512]");
               w.k_norm = host_vector<uint16_t>(kn, op, "k_norm", {kIndexHeadDim}, "bf16 [128]");
             }
             new (self) LayerWeights(std::move(w));
           },
           ARR("attn_sink"), OPT("compressor_norm"), OPT("wk"), OPT("k_norm"),
           "Copies of host arrays: attn_sink f32 [H]; for a kv source compressor_norm bf16 [512], wk bf16\n"
           "[128, 512] and k_norm bf16 [128] (any strides).")
      .def_static("from_seed", &LayerWeights::from_seed, "layer"_a, "num_heads"_a, "seed"_a,
                  "Deterministic weights of `layer` (a LayerInfo) for H = num_heads: sinks N(0, 1), norm weights\n"
                  "1 + N(0, 0.1), wk N(0, 1/sqrt(512)), rounded to bf16 / f32.")
      .def_prop_ro("attn_sink", [](nb::handle self) {
        LayerWeights& w = nb::cast<LayerWeights&>(self);
        return owned_array(TensorView::contiguous(w.attn_sink.data(), DType::F32, {static_cast<int64_t>(w.attn_sink.size())}),
                           self, 0);
      }, "f32 [H] (a view of the object's copy).")
      .def_prop_ro("compressor_norm", [](nb::handle self) -> nb::object {
        LayerWeights& w = nb::cast<LayerWeights&>(self);
        if (w.compressor_norm.empty()) return nb::none();
        return owned_array(TensorView::contiguous(w.compressor_norm.data(), DType::BF16, {kLatentDim}), self, 0);
      }, "bf16 [512] as uint16 bits (kv sources; None otherwise).")
      .def_prop_ro("wk", [](nb::handle self) -> nb::object {
        LayerWeights& w = nb::cast<LayerWeights&>(self);
        if (w.wk.empty()) return nb::none();
        return owned_array(TensorView::contiguous(w.wk.data(), DType::BF16, {kIndexHeadDim, kLatentDim}), self, 0);
      }, "bf16 [128, 512] as uint16 bits (kv sources; None otherwise).")
      .def_prop_ro("k_norm", [](nb::handle self) -> nb::object {
        LayerWeights& w = nb::cast<LayerWeights&>(self);
        if (w.k_norm.empty()) return nb::none();
        return owned_array(TensorView::contiguous(w.k_norm.data(), DType::BF16, {kIndexHeadDim}), self, 0);
      }, "bf16 [128] as uint16 bits (kv sources; None otherwise).");

  nb::class_<LayerStepStats>(m, "LayerStepStats", "What one layer wrote and read on its last step.")
      .def_ro("swa_records", &LayerStepStats::swa_records)
      .def_ro("compressed_records", &LayerStepStats::compressed_records)
      .def_ro("index_keys", &LayerStepStats::index_keys)
      .def_ro("shortcut", &LayerStepStats::shortcut)
      .def_ro("topk_entries", &LayerStepStats::topk_entries)
      .def_ro("topk_max", &LayerStepStats::topk_max)
      .def_ro("candidate_blocks", &LayerStepStats::candidate_blocks)
      .def_ro("candidate_masked", &LayerStepStats::candidate_masked)
      .def_ro("swa_keys", &LayerStepStats::swa_keys)
      .def_ro("decode_rows", &LayerStepStats::decode_rows)
      .def_ro("prefill_rows", &LayerStepStats::prefill_rows)
      .def_ro("prefill_chunks", &LayerStepStats::prefill_chunks)
      .def_ro("checksum", &LayerStepStats::checksum)
      .def_ro("ms", &LayerStepStats::ms);

  nb::class_<Shared>(m, "LayerShared",
                     "What the layers of a model share in a step (SPEC 1.3): the top-k and candidates buffers, the\n"
                     "prefill workspace and the layers themselves.")
      .def("__init__",
           [](Shared* self, const Serving& cfg, const ReadPathConfig& read, const ModelConfig& model) {
             DeviceScope d(cfg, "LayerShared");
             ServingConfig c = cfg.c;
             c.exec = exec_for(cfg, nb::none(), "LayerShared");
             auto p = std::make_unique<LayerShared>(c, read, model);
             new (self) Shared{cfg, std::move(p)};
           },
           "config"_a, "read"_a, "model"_a, "The shared buffers of `model`'s layers for this configuration.")
      .def("topk", [](nb::handle self) {
        Shared& S = nb::cast<Shared&>(self);
        return owned_array(S.s->topk(), self, S.cfg.device_id);
      }, "i32 [max_tokens, 512]: the top-k of the last index source that ran.")
      .def("candidates", [](nb::handle self) {
        Shared& S = nb::cast<Shared&>(self);
        return owned_array(S.s->candidates(), self, S.cfg.device_id);
      }, "i32 [max_tokens, 2048]: the candidate source's blocks.")
      .def_prop_ro("topk_writer", [](const Shared& S) { return S.s->topk_writer(); },
                   "The layer whose top-k the buffer holds (-1: none yet).")
      .def_prop_ro("candidates_writer", [](const Shared& S) { return S.s->candidates_writer(); },
                   "The layer whose candidates the buffer holds (-1: none yet).");

#define LAYER_VIEW(name, doc)                                                                \
  def(#name, [](nb::handle self) {                                                           \
    Layer& L = nb::cast<Layer&>(self);                                                       \
    return owned_array(L.l->name(), self, L.cfg.device_id);                                  \
  }, doc)
  nb::class_<Layer>(m, "AttentionLayer",
                    "One V4.1 attention layer (SPEC 9.8) with its caches and outputs of max_tokens rows: run() is\n"
                    "the write path, the indexer and the sparse attention of a step, through the library's ops.")
      .def("__init__",
           [](Layer* self, const Serving& cfg, const ReadPathConfig& read, const ModelConfig& model, int layer,
              const LayerWeights& weights, Shared& shared, nb::handle rope_table, const std::string& angle) {
             const char* op = "AttentionLayer";
             if (shared.cfg.c.device != cfg.c.device || (cfg.c.device == Device::CUDA && shared.cfg.device_id != cfg.device_id))
               value_error(std::string(op) + ": shared: on " + device_label(shared.cfg) + ", the configuration on " +
                           device_label(cfg));
             RopeTable t;
             if (rope_table.is_none()) {
               t = rope_table_for_ratio(model, model.ratio(layer), read.max_model_len, parse_rope_angle(angle.c_str()));
             } else {
               Call c(op);
               const TensorView v = c.in(rope_table, "rope_table", DType::F32);
               t.data = host_vector<float>(v, op, "rope_table", {-1, kRopeTableWidth}, "f32 [rows, 64]");
               t.rows = v.shape[0];
             }
             DeviceScope d(cfg, op);
             ServingConfig c = cfg.c;
             c.exec = exec_for(cfg, nb::none(), op);
             auto p = std::make_unique<AttentionLayer>(c, read, model, layer, weights, t, *shared.s);
             new (self) Layer{cfg, std::move(p)};
           },
           "config"_a, "read"_a, "model"_a, "layer"_a, "weights"_a, "shared"_a, kw, OPT("rope_table"),
           "angle"_a = "binary64", nb::keep_alive<1, 7>(),
           "Layer `layer` of `model` (its role from the topology) on the configuration's device, registered in\n"
           "`shared` (kept alive by the layer). rope_table: host f32 [rows, 64] (None: the table of the layer's\n"
           "ratio with read.max_model_len rows and `angle`). Caches, ring and outputs start zeroed.\n"
           "dsv41kv.Error (E8) for a configuration without the SWA cache or the layer's type, weights of other\n"
           "sizes, a layer `shared` already holds.")
      .def("run",
           [](Layer& L, Meta& M, nb::handle q, nb::handle kv, nb::handle kv_score, nb::handle index_q, nb::handle w_raw,
              nb::handle stream) {
             layer_step(L, M, q, kv, kv_score, index_q, w_raw, StepMode::kFull, 0, stream, "AttentionLayer.run");
           },
           "meta"_a, ARR("q"), ARR("kv"), OPT("kv_score"), OPT("index_q"), OPT("w_raw"), kw, STREAM,
           (std::string("The layer's step (SPEC 9.8): SWA insert with the query RoPE, for a kv source the compressor,\n"
                        "compressed insert and index-K store, for an index source the top-k, the sparse attention with\n"
                        "sink and the output inverse RoPE, into output() / attention_out() / lse() / q_rotated().\n") +
            kInputsDoc + "\ndsv41kv.Error (E8) before any write for a bad input or a source layer that has not run on meta.")
               .c_str())
      .def("run_queries",
           [](Layer& L, Meta& M, nb::handle q, nb::handle kv, int64_t step_max_seq_len, nb::handle kv_score,
              nb::handle index_q, nb::handle w_raw, nb::handle stream) {
             layer_step(L, M, q, kv, kv_score, index_q, w_raw, StepMode::kQueries, step_max_seq_len, stream,
                        "AttentionLayer.run_queries");
           },
           "meta"_a, ARR("q"), ARR("kv"), kw, ARR("step_max_seq_len"), OPT("kv_score"), OPT("index_q"), OPT("w_raw"), STREAM,
           (std::string("The read half of run() for one PCP rank (SPEC 7.6 step 4): the caches already hold the step's\n"
                        "rows; the query RoPE (no insert), the indexer, the attention and the inverse RoPE of meta's\n"
                        "rows. step_max_seq_len: the global step's largest seq_len (decides the shortcut). kv_score is\n"
                        "not read.\n") + kInputsDoc).c_str())
      .def("run_writes",
           [](Layer& L, Meta& M, nb::handle q, nb::handle kv, nb::handle kv_score, nb::handle index_q, nb::handle w_raw,
              nb::handle stream) {
             layer_step(L, M, q, kv, kv_score, index_q, w_raw, StepMode::kWrites, 0, stream, "AttentionLayer.run_writes");
           },
           "meta"_a, ARR("q"), ARR("kv"), OPT("kv_score"), OPT("index_q"), OPT("w_raw"), kw, STREAM,
           (std::string("The write half of run(): the SWA insert with the query RoPE and, for a kv source, the\n"
                        "compressor, compressed insert and index-K store; no indexer, attention or outputs.\n") +
            kInputsDoc).c_str())
      .def_prop_ro("info", [](const Layer& L) { return L.l->info(); }, "The layer's LayerInfo.")
      .def_prop_ro("last_stats", [](const Layer& L) { return L.l->last_stats(); }, "LayerStepStats of the last step.")
      .def_prop_ro("last_generation", [](const Layer& L) { return L.l->last_generation(); },
                   "The StepMetadata generation of the last step (0: never ran).")
      .def_prop_ro("sink", [](const Layer& L) { return L.l->sink(); }, "The per-head sink, f32 [H] (a list).")
      .LAYER_VIEW(output, "bf16 [max_tokens, H, 512]: the last step's rows [0, N) after the inverse RoPE.")
      .LAYER_VIEW(attention_out, "bf16 [max_tokens, H_pad, 512]: the attention before the inverse RoPE.")
      .LAYER_VIEW(lse, "f32 [max_tokens, H_pad]: +inf for a row without keys.")
      .LAYER_VIEW(q_rotated, "bf16 [max_tokens, H_pad, 512]: the queries the attention read.")
      .LAYER_VIEW(ring, "f32 [ring_blocks, cap, 1024]: the compressor ring (ratio-2 kv sources; E8 otherwise).")
      .LAYER_VIEW(latent, "bf16 [max_tokens, 512]: the compressor's closing rows (kv sources; E8 otherwise).")
      .def("swa_cache", [](nb::handle self) {
        Layer& L = nb::cast<Layer&>(self);
        return cache_array(L.l->swa_cache(), self, L.cfg.device_id);
      }, "The SWA cache in read.swa_format (swa_page_tokens states per page): packed formats uint8\n"
         "[num_pages, page_stride], plain rows [num_pages, S, 512] (bf16 / fp8 codes), as the ops take caches.")
      .def("compressed_cache", [](nb::handle self) {
        Layer& L = nb::cast<Layer&>(self);
        return cache_array(L.l->compressed_cache(), self, L.cfg.device_id);
      }, "The compressed cache in read.compressed_format (states_per_page(ratio) per page), laid out as\n"
         "swa_cache() (kv sources; E8 otherwise).")
      .def("index_k_cache", [](nb::handle self) {
        Layer& L = nb::cast<Layer&>(self);
        return index_k_array(L.l->index_k_cache(), self, L.cfg.device_id);
      }, "The index-K cache, uint8 [num_pages, page_stride] (fp8_132; kv sources, E8 otherwise).");
#undef LAYER_VIEW
}

}  // namespace dsv41kv::py

NB_MODULE(_core, m) {
  m.doc() = "dsv41kv's ops over caller-owned arrays (DLPack): see docs/python.md.";
  dsv41kv::py::bind(m);
  dsv41kv::py::bind_layer(m);
}
