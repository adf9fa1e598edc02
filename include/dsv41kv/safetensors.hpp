// dsv41kv: safetensors files (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header, then the raw little-endian tensor bytes.
//
// The reader loads a whole file (plain, or gzip-compressed: detected by its magic bytes) into
// host memory and validates the header against the data before anything is handed out: a
// header that lies (lengths beyond the file, offsets outside the data area, byte counts that do
// not match the shape, overlapping or duplicate tensors, unknown dtypes, non-object JSON) is a
// dsv41kv::Error(ErrorCode::kFormat) whose message names the file and the tensor. It never
// crashes on a malformed file. A file that cannot be opened or read is ErrorCode::kIo.
//
// The writer builds a file from named tensors and a string->string metadata map, the way the
// Hugging Face writer does (tensors ordered by element size, largest first, then by name; the
// header padded with spaces so the data area starts 8-byte aligned), and writes it atomically
// (a temporary file in the same folder, then rename). A path ending in ".gz" is gzip-compressed.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv::st {

// Every dtype of the safetensors format. The library's own DType covers F32, BF16, U8, I32, I64.
enum class StDType : uint8_t {
  BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2,
};

const char* dtype_name(StDType d);  // the header spelling: "F32", "BF16", ...
size_t dtype_size(StDType d);       // bytes per element
std::optional<StDType> parse_dtype(std::string_view name);
// The library dtype of a safetensors dtype, if it has one.
std::optional<DType> to_dtype(StDType d);
StDType from_dtype(DType d);

// The safetensors dtype that stores C++ type T (float, uint16_t for bf16 bits, ...).
template <class T>
constexpr StDType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return StDType::F32;
  else if constexpr (std::is_same_v<T, double>) return StDType::F64;
  else if constexpr (std::is_same_v<T, int64_t>) return StDType::I64;
  else if constexpr (std::is_same_v<T, int32_t>) return StDType::I32;
  else if constexpr (std::is_same_v<T, int16_t>) return StDType::I16;
  else if constexpr (std::is_same_v<T, int8_t>) return StDType::I8;
  else if constexpr (std::is_same_v<T, uint64_t>) return StDType::U64;
  else if constexpr (std::is_same_v<T, uint32_t>) return StDType::U32;
  else if constexpr (std::is_same_v<T, uint8_t>) return StDType::U8;
  else static_assert(sizeof(T) == 0, "no safetensors dtype for this type (bf16/f16: use uint16_t and copy_as<uint16_t>)");
}

struct TensorInfo {
  std::string name;
  StDType dtype = StDType::U8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data area, [begin, end)
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  std::string describe() const;  // e.g. "f32[26, 1024]" with the safetensors dtype name
};

// A loaded, validated safetensors file (whole file in host memory).
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  // Reads `path` (plain or gzip) and validates it. kIo when it cannot be read, kFormat when the
  // content is malformed.
  static SafetensorsFile load(const std::string& path);
  // Parses an in-memory file image; `source` names it in error messages.
  static SafetensorsFile parse(std::vector<uint8_t> file_bytes, const std::string& source);

  const std::string& source() const { return source_; }
  // Tensor names in the order of their data (by begin offset, then name).
  const std::vector<std::string>& names() const { return names_; }
  bool has(std::string_view name) const;
  // kFormat naming the file and the tensor when absent.
  const TensorInfo& info(std::string_view name) const;
  std::span<const uint8_t> bytes(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // kFormat when the key is absent.
  const std::string& metadata(std::string_view key) const;

  // A copy of the elements. T must have the tensor's element size and a matching kind
  // (T = uint16_t reads BF16/F16/U16/I16 bits); kFormat naming the tensor otherwise.
  template <class T>
  std::vector<T> copy_as(std::string_view name) const {
    check_element(name, sizeof(T), kind_of<T>());
    const auto b = bytes(name);
    std::vector<T> out(b.size() / sizeof(T));
    if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());
    return out;
  }
  // Checks dtype and shape (an empty `shape` skips the shape check); kFormat naming the file,
  // the tensor, what it is and what was expected.
  void expect(std::string_view name, StDType dtype, const std::vector<int64_t>& shape = {}) const;

  // A host TensorView over the file's bytes (contiguous, read-only in spirit: do not write
  // through it). The tensor's dtype must be one of the library's DTypes and the data aligned to
  // its element size; kFormat otherwise.
  TensorView view(std::string_view name) const;

 private:
  enum class Kind { kFloat, kSigned, kUnsigned, kBits16 };
  template <class T>
  static constexpr Kind kind_of() {
    if constexpr (std::is_same_v<T, uint16_t>) return Kind::kBits16;
    else if constexpr (std::is_floating_point_v<T>) return Kind::kFloat;
    else if constexpr (std::is_signed_v<T>) return Kind::kSigned;
    else return Kind::kUnsigned;
  }
  void check_element(std::string_view name, size_t size, Kind kind) const;
  const TensorInfo& find(std::string_view name) const;

  std::string source_;
  std::vector<uint8_t> data_;  // the data area only (moved to the front of the file image)
  std::vector<std::string> names_;
  std::unordered_map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file. Tensor bytes are copied in.
class SafetensorsWriter {
 public:
  // `bytes.size()` must equal prod(shape) * dtype_size(dtype); duplicate names and the reserved
  // name "__metadata__" are errors (kInvalidArgument).
  void add(const std::string& name, StDType dtype, std::vector<int64_t> shape,
           std::span<const uint8_t> bytes);
  template <class T>
  void add(const std::string& name, std::vector<int64_t> shape, std::span<const T> values) {
    add(name, dtype_of<T>(), std::move(shape),
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()));
  }
  // A host TensorView; need not be contiguous (it is gathered in row-major order).
  void add(const std::string& name, const TensorView& view);
  // Copies one tensor of a loaded file under the same (or another) name.
  void add_from(const SafetensorsFile& file, const std::string& name, const std::string& as = {});
  void set_metadata(const std::string& key, const std::string& value);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  size_t size() const { return tensors_.size(); }
  // The complete file image.
  std::vector<uint8_t> serialize() const;
  // Writes the file atomically; gzip when `path` ends in ".gz". kIo on failure.
  void write(const std::string& path) const;

 private:
  struct Entry {
    StDType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes `bytes` to `path` atomically (temporary file + rename); gzip when `gzip`. kIo on failure.
void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes, bool gzip = false);
// Reads a whole file, transparently gunzipping it when it starts with the gzip magic. kIo.
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace dsv41kv::st
