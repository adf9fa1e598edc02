// Safetensors reader and writer (see include/dsv41kv/safetensors.hpp).
#include "dsv41kv/safetensors.hpp"

#include "core/file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace dsv41kv::st {
namespace {

// Hugging Face rejects headers above 100 MB; so do we (a lying length must not allocate).
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

struct DTypeRow {
  StDType d;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {StDType::BOOL, "BOOL", 1}, {StDType::U8, "U8", 1},     {StDType::I8, "I8", 1},
    {StDType::U16, "U16", 2},   {StDType::I16, "I16", 2},   {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::U32, "U32", 4},   {StDType::I32, "I32", 4},
    {StDType::F32, "F32", 4},   {StDType::U64, "U64", 8},   {StDType::I64, "I64", 8},
    {StDType::F64, "F64", 8},   {StDType::F8_E4M3, "F8_E4M3", 1}, {StDType::F8_E5M2, "F8_E5M2", 1},
};

[[noreturn]] void format_error(const std::string& source, const std::string& what) {
  fail(ErrorCode::kFormat, fmt::format("safetensors file '{}': {}", source, what));
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool is_gzip(const std::vector<uint8_t>& b) { return b.size() >= 2 && b[0] == 0x1F && b[1] == 0x8B; }

std::vector<uint8_t> gunzip(const std::vector<uint8_t>& in, const std::string& path) {
  std::vector<uint8_t> out;
  out.resize(std::max<size_t>(in.size() * 4, 1 << 16));
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) fail(ErrorCode::kIo, fmt::format("'{}': zlib inflateInit failed", path));
  zs.next_in = const_cast<Bytef*>(in.data());
  size_t in_left = in.size();
  size_t produced = 0;
  int rc = Z_OK;
  for (;;) {
    if (produced == out.size()) out.resize(out.size() * 2);
    const uInt in_chunk = static_cast<uInt>(std::min<size_t>(in_left, 1u << 30));
    const uInt out_chunk = static_cast<uInt>(std::min<size_t>(out.size() - produced, 1u << 30));
    zs.avail_in = in_chunk;
    zs.next_out = out.data() + produced;
    zs.avail_out = out_chunk;
    rc = inflate(&zs, Z_NO_FLUSH);
    in_left -= in_chunk - zs.avail_in;
    produced += out_chunk - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Concatenated gzip members (as `cat a.gz b.gz` makes) continue the stream.
      if (in_left >= 2 && zs.next_in[0] == 0x1F && zs.next_in[1] == 0x8B) {
        inflateReset(&zs);
        continue;
      }
      break;
    }
    if (rc == Z_BUF_ERROR && in_left == 0 && zs.avail_out != 0) {
      inflateEnd(&zs);
      fail(ErrorCode::kFormat, fmt::format("gzip file '{}' is truncated", path));
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      const std::string msg = zs.msg ? zs.msg : "corrupt data";
      inflateEnd(&zs);
      fail(ErrorCode::kFormat, fmt::format("gzip file '{}' cannot be decompressed: {}", path, msg));
    }
  }
  inflateEnd(&zs);
  out.resize(produced);
  return out;
}

std::vector<uint8_t> gzip_bytes(std::span<const uint8_t> in, const std::string& path) {
  z_stream zs{};
  if (deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    fail(ErrorCode::kIo, fmt::format("'{}': zlib deflateInit failed", path));
  std::vector<uint8_t> out(deflateBound(&zs, static_cast<uLong>(in.size())) + 64);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  const size_t n = out.size() - zs.avail_out;
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) fail(ErrorCode::kIo, fmt::format("'{}': gzip compression failed ({})", path, rc));
  out.resize(n);
  return out;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Non-negative JSON integer -> uint64, or nullopt.
std::optional<uint64_t> as_u64(const nlohmann::json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------- dtypes

const char* dtype_name(StDType d) {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.name;
  return "?";
}
size_t dtype_size(StDType d) {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.size;
  return 0;
}
std::optional<StDType> parse_dtype(std::string_view name) {
  for (const auto& r : kDTypes)
    if (name == r.name) return r.d;
  return std::nullopt;
}
std::optional<DType> to_dtype(StDType d) {
  switch (d) {
    case StDType::F32: return DType::F32;
    case StDType::BF16: return DType::BF16;
    case StDType::U8: return DType::U8;
    case StDType::I32: return DType::I32;
    case StDType::I64: return DType::I64;
    default: return std::nullopt;
  }
}
StDType from_dtype(DType d) {
  switch (d) {
    case DType::F32: return StDType::F32;
    case DType::BF16: return StDType::BF16;
    case DType::U8: return StDType::U8;
    case DType::I32: return StDType::I32;
    case DType::I64: return StDType::I64;
  }
  return StDType::U8;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}
std::string TensorInfo::describe() const { return fmt::format("{}{}", dtype_name(dtype), shape_str(shape)); }

// ---------------------------------------------------------------- file I/O

std::vector<uint8_t> read_file(const std::string& path) {
  std::vector<uint8_t> buf = detail::read_file_bytes(path);
  if (is_gzip(buf)) return gunzip(buf, path);
  return buf;
}

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes, bool gzip) {
  std::vector<uint8_t> packed;
  if (gzip) {
    packed = gzip_bytes(bytes, path);
    bytes = packed;
  }
  static std::atomic<unsigned> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, static_cast<long>(getpid()), counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(ErrorCode::kIo, fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, std::min<size_t>(bytes.size() - done, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(ErrorCode::kIo, fmt::format("cannot write '{}': {}", tmp, std::strerror(e)));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(ErrorCode::kIo, fmt::format("cannot flush '{}': {}", tmp, std::strerror(e)));
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(ErrorCode::kIo, fmt::format("cannot close '{}': {}", tmp, std::strerror(e)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(ErrorCode::kIo, fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(e)));
  }
}

// ---------------------------------------------------------------- reader

SafetensorsFile SafetensorsFile::load(const std::string& path) { return parse(read_file(path), path); }

SafetensorsFile SafetensorsFile::parse(std::vector<uint8_t> file, const std::string& source) {
  SafetensorsFile out;
  out.source_ = source;
  const uint64_t size = file.size();
  if (size < 8)
    format_error(source, fmt::format("the file has {} bytes, fewer than the 8-byte header length", size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<size_t>(i)];
  if (n > size - 8)
    format_error(source, fmt::format("header length {} exceeds the {} bytes that follow it", n, size - 8));
  if (n > kMaxHeaderBytes)
    format_error(source, fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxHeaderBytes));
  if (n < 2) format_error(source, fmt::format("header length {} is too short for a JSON object", n));

  // Parse, recording duplicate keys in any object (the DOM would silently keep one of them).
  std::vector<std::vector<std::string>> key_stack;
  std::string duplicate;
  auto cb = [&](int /*depth*/, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) {
      key_stack.emplace_back();
    } else if (ev == E::object_end) {
      if (!key_stack.empty()) key_stack.pop_back();
    } else if (ev == E::key && !key_stack.empty() && parsed.is_string()) {
      auto& keys = key_stack.back();
      const std::string& k = parsed.get_ref<const std::string&>();
      if (duplicate.empty() && std::find(keys.begin(), keys.end(), k) != keys.end()) duplicate = k;
      keys.push_back(k);
    }
    return true;
  };
  const char* hb = reinterpret_cast<const char*>(file.data() + 8);
  nlohmann::json header = nlohmann::json::parse(hb, hb + n, cb, /*allow_exceptions=*/false);
  if (header.is_discarded()) format_error(source, "the header is not valid JSON");
  if (!header.is_object())
    format_error(source, fmt::format("the header is a JSON {}, expected an object", header.type_name()));
  if (!duplicate.empty()) format_error(source, fmt::format("the header repeats the key '{}'", duplicate));

  const uint64_t data_size = size - 8 - n;
  std::vector<TensorInfo> infos;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      if (!v.is_object())
        format_error(source, fmt::format("__metadata__ is a JSON {}, expected an object of strings", v.type_name()));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          format_error(source, fmt::format("__metadata__ key '{}' is a JSON {}, expected a string", m.key(),
                                           m.value().type_name()));
        out.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object())
      format_error(source, fmt::format("tensor '{}': entry is a JSON {}, expected an object", name, v.type_name()));
    TensorInfo ti;
    ti.name = name;
    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string())
      format_error(source, fmt::format("tensor '{}': missing or non-string 'dtype'", name));
    const auto pd = parse_dtype(dt->get_ref<const std::string&>());
    if (!pd)
      format_error(source, fmt::format("tensor '{}': unknown dtype '{}' (expected one of BOOL, U8, I8, U16, I16, "
                                       "F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2)",
                                       name, dt->get_ref<const std::string&>()));
    ti.dtype = *pd;
    const auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array())
      format_error(source, fmt::format("tensor '{}': missing or non-array 'shape'", name));
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      const auto u = as_u64(d);
      if (!u || *u > static_cast<uint64_t>(INT64_MAX))
        format_error(source, fmt::format("tensor '{}': shape {} has an entry that is not a non-negative integer",
                                         name, sh->dump()));
      if (__builtin_mul_overflow(numel, *u, &numel))
        format_error(source, fmt::format("tensor '{}': shape {} overflows", name, sh->dump()));
      ti.shape.push_back(static_cast<int64_t>(*u));
    }
    const auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      format_error(source, fmt::format("tensor '{}': missing 'data_offsets' or not a pair", name));
    const auto b = as_u64((*off)[0]), e = as_u64((*off)[1]);
    if (!b || !e)
      format_error(source, fmt::format("tensor '{}': data_offsets {} are not non-negative integers", name, off->dump()));
    ti.begin = *b;
    ti.end = *e;
    if (ti.end < ti.begin)
      format_error(source, fmt::format("tensor '{}': data_offsets [{}, {}] end before they begin", name, ti.begin, ti.end));
    if (ti.end > data_size)
      format_error(source, fmt::format("tensor '{}': data_offsets [{}, {}] lie outside the data area of {} bytes",
                                       name, ti.begin, ti.end, data_size));
    uint64_t want = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(ti.dtype)), &want) || want != ti.end - ti.begin)
      format_error(source, fmt::format("tensor '{}': {} needs {} bytes but data_offsets [{}, {}] hold {}", name,
                                       ti.describe(), want, ti.begin, ti.end, ti.end - ti.begin));
    infos.push_back(std::move(ti));
  }

  std::sort(infos.begin(), infos.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : (a.end != b.end ? a.end < b.end : a.name < b.name);
  });
  const TensorInfo* prev = nullptr;  // last non-empty tensor
  for (const auto& ti : infos) {
    if (ti.end == ti.begin) continue;
    if (prev && ti.begin < prev->end)
      format_error(source, fmt::format("tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (bytes [{}, {}))", ti.name,
                                       ti.begin, ti.end, prev->name, prev->begin, prev->end));
    prev = &ti;
  }

  // Keep only the data area, at the start of the (16-byte aligned) buffer.
  file.erase(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(8 + n));
  out.data_ = std::move(file);
  for (auto& ti : infos) {
    out.names_.push_back(ti.name);
    std::string key = ti.name;
    out.tensors_.emplace(std::move(key), std::move(ti));
  }
  return out;
}

bool SafetensorsFile::has(std::string_view name) const { return tensors_.find(std::string(name)) != tensors_.end(); }

const TensorInfo& SafetensorsFile::find(std::string_view name) const {
  const auto it = tensors_.find(std::string(name));
  if (it == tensors_.end()) format_error(source_, fmt::format("has no tensor '{}'", name));
  return it->second;
}
const TensorInfo& SafetensorsFile::info(std::string_view name) const { return find(name); }

std::span<const uint8_t> SafetensorsFile::bytes(std::string_view name) const {
  const TensorInfo& ti = find(name);
  return {data_.data() + ti.begin, static_cast<size_t>(ti.nbytes())};
}

const std::string& SafetensorsFile::metadata(std::string_view key) const {
  const auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) format_error(source_, fmt::format("has no __metadata__ key '{}'", key));
  return it->second;
}

void SafetensorsFile::check_element(std::string_view name, size_t size, Kind kind) const {
  const TensorInfo& ti = find(name);
  Kind have;
  switch (ti.dtype) {
    case StDType::F32: case StDType::F64: case StDType::BF16: case StDType::F16: have = Kind::kFloat; break;
    case StDType::I8: case StDType::I16: case StDType::I32: case StDType::I64: have = Kind::kSigned; break;
    default: have = Kind::kUnsigned; break;
  }
  const bool ok = dtype_size(ti.dtype) == size &&
                  (have == kind || (kind == Kind::kBits16 && size == 2) ||
                   // unsigned bytes read any 1-byte dtype (u8 caches, fp8 bytes, bool)
                   (kind == Kind::kUnsigned && size == 1));
  if (!ok)
    format_error(source_, fmt::format("tensor '{}' is {}, which cannot be read as a {}-byte {} type", name,
                                      ti.describe(), size,
                                      kind == Kind::kFloat ? "floating" : kind == Kind::kSigned ? "signed" : "unsigned"));
}

void SafetensorsFile::expect(std::string_view name, StDType dtype, const std::vector<int64_t>& shape) const {
  const TensorInfo& ti = find(name);
  if (ti.dtype != dtype || (!shape.empty() && ti.shape != shape))
    format_error(source_, fmt::format("tensor '{}' is {}, expected {}{}", name, ti.describe(), dtype_name(dtype),
                                      shape.empty() ? std::string() : shape_str(shape)));
}

TensorView SafetensorsFile::view(std::string_view name) const {
  const TensorInfo& ti = find(name);
  const auto d = to_dtype(ti.dtype);
  if (!d) format_error(source_, fmt::format("tensor '{}' is {}, which has no library dtype", name, ti.describe()));
  if (ti.shape.size() > 4) format_error(source_, fmt::format("tensor '{}' is {}: more than 4 dimensions", name, ti.describe()));
  void* p = const_cast<uint8_t*>(data_.data()) + ti.begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(ti.dtype) != 0)
    format_error(source_, fmt::format("tensor '{}' at data offset {} is not aligned to its {}-byte elements", name,
                                      ti.begin, dtype_size(ti.dtype)));
  TensorView v;
  v.data = p;
  v.dtype = *d;
  v.device = Device::CPU;
  if (ti.shape.empty()) {  // a scalar is a 1-element vector
    v.ndim = 1;
    v.shape[0] = 1;
    v.stride[0] = 1;
    return v;
  }
  v.ndim = static_cast<int>(ti.shape.size());
  int64_t st = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[static_cast<size_t>(i)] = ti.shape[static_cast<size_t>(i)];
    v.stride[static_cast<size_t>(i)] = st;
    st *= ti.shape[static_cast<size_t>(i)];
  }
  return v;
}

// ---------------------------------------------------------------- writer

void SafetensorsWriter::add(const std::string& name, StDType dtype, std::vector<int64_t> shape,
                            std::span<const uint8_t> bytes) {
  if (name == "__metadata__") invalid_argument("safetensors writer: '__metadata__' is not a tensor name");
  if (tensors_.count(name)) invalid_argument(fmt::format("safetensors writer: tensor '{}' added twice", name));
  uint64_t numel = 1;
  for (int64_t s : shape) {
    if (s < 0) invalid_argument(fmt::format("safetensors writer: tensor '{}' has negative shape {}", name, shape_str(shape)));
    numel *= static_cast<uint64_t>(s);
  }
  if (numel * dtype_size(dtype) != bytes.size())
    invalid_argument(fmt::format("safetensors writer: tensor '{}' {}{} needs {} bytes, got {}", name, dtype_name(dtype),
                                 shape_str(shape), numel * dtype_size(dtype), bytes.size()));
  tensors_.emplace(name, Entry{dtype, std::move(shape), std::vector<uint8_t>(bytes.begin(), bytes.end())});
}

void SafetensorsWriter::add(const std::string& name, const TensorView& v) {
  if (v.device != Device::CPU)
    invalid_argument(fmt::format("safetensors writer: tensor '{}' is on {}, expected a host view", name, device_name(v.device)));
  if (v.ndim < 1 || v.ndim > 4 || v.data == nullptr)
    invalid_argument(fmt::format("safetensors writer: tensor '{}' is absent or has {} dimensions", name, v.ndim));
  std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.ndim);
  const size_t es = dsv41kv::dtype_size(v.dtype);
  std::vector<uint8_t> bytes(static_cast<size_t>(v.numel()) * es);
  if (v.is_contiguous()) {
    if (!bytes.empty()) std::memcpy(bytes.data(), v.data, bytes.size());
  } else {
    std::array<int64_t, 4> idx{};
    const auto* base = static_cast<const uint8_t*>(v.data);
    for (size_t k = 0; k < bytes.size() / es; ++k) {
      int64_t off = 0;
      for (int d = 0; d < v.ndim; ++d) off += idx[static_cast<size_t>(d)] * v.stride[static_cast<size_t>(d)];
      std::memcpy(bytes.data() + k * es, base + off * static_cast<int64_t>(es), es);
      for (int d = v.ndim - 1; d >= 0; --d) {
        if (++idx[static_cast<size_t>(d)] < v.shape[static_cast<size_t>(d)]) break;
        idx[static_cast<size_t>(d)] = 0;
      }
    }
  }
  add(name, from_dtype(v.dtype), std::move(shape), bytes);
}

void SafetensorsWriter::add_from(const SafetensorsFile& file, const std::string& name, const std::string& as) {
  const TensorInfo& ti = file.info(name);
  add(as.empty() ? name : as, ti.dtype, ti.shape, file.bytes(name));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

std::vector<uint8_t> SafetensorsWriter::serialize() const {
  // Hugging Face order: larger elements first (keeps every tensor aligned), then by name.
  std::vector<const std::pair<const std::string, Entry>*> order;
  for (const auto& kv : tensors_) order.push_back(&kv);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
    const size_t sa = dtype_size(a->second.dtype), sb = dtype_size(b->second.dtype);
    return sa != sb ? sa > sb : a->first < b->first;
  });
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t off = 0;
  for (auto* e : order) {
    nlohmann::ordered_json t = nlohmann::ordered_json::object();
    t["dtype"] = dtype_name(e->second.dtype);
    t["shape"] = e->second.shape;
    t["data_offsets"] = {off, off + e->second.bytes.size()};
    off += e->second.bytes.size();
    h[e->first] = std::move(t);
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + off);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (auto* e : order) out.insert(out.end(), e->second.bytes.begin(), e->second.bytes.end());
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  const auto bytes = serialize();
  write_file_atomic(path, bytes, ends_with(path, ".gz"));
}

}  // namespace dsv41kv::st
