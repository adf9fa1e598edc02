// Shared pieces of the conformance runners (conformance_file.hpp).
#include "oracles/conformance_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#if defined(DSV41KV_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace dsv41kv::conformance::detail {

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  fail(ErrorCode::kFormat, fmt::format("conformance file '{}': {}", path, what));
}

json dsv41_metadata(const st::SafetensorsFile& f) {
  const std::string& path = f.source();
  if (!f.metadata().count("dsv41")) bad_file(path, "__metadata__ has no key 'dsv41'");
  json j = json::parse(f.metadata("dsv41"), nullptr, false);
  if (j.is_discarded() || !j.is_object()) bad_file(path, "__metadata__ 'dsv41' is not a JSON object");
  return j;
}

const json& need(const json& j, const char* key, const std::string& path, std::string_view where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null())
    bad_file(path, fmt::format("metadata {}has no key '{}'", where, key));
  return *it;
}
int64_t need_int(const json& j, const char* key, const std::string& path, std::string_view where,
                 int64_t lo, int64_t hi) {
  const json& v = need(j, key, path, where);
  if (!v.is_number_integer())
    bad_file(path, fmt::format("metadata {}'{}' is {}, expected an integer", where, key, v.dump()));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad_file(path, fmt::format("metadata {}'{}' is {}, expected {} .. {}", where, key, x, lo, hi));
  return x;
}
double need_num(const json& j, const char* key, const std::string& path) {
  const json& v = need(j, key, path, "");
  if (!v.is_number()) bad_file(path, fmt::format("metadata '{}' is {}, expected a number", key, v.dump()));
  return v.get<double>();
}

const json& need_cases(const json& j, const std::string& path) {
  const json& cases = need(j, "cases", path, "");
  if (!cases.is_array()) bad_file(path, "metadata 'cases' is not a list");
  for (size_t i = 0; i < cases.size(); ++i)
    if (!cases[i].is_object()) bad_file(path, fmt::format("metadata cases[{}]. is not an object", i));
  return cases;
}

const st::TensorInfo& need_tensor(const st::SafetensorsFile& f, const std::string& name, st::StDType dt,
                                  std::vector<int64_t> shape) {
  if (!f.has(name)) bad_file(f.source(), fmt::format("has no tensor '{}'", name));
  const st::TensorInfo& ti = f.info(name);
  bool ok = ti.dtype == dt && ti.shape.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i)
    ok = shape[i] >= 0 ? ti.shape[i] == shape[i] : ti.shape[i] >= -shape[i];
  if (!ok) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i)
      want += (i ? ", " : "") + (shape[i] >= 0 ? std::to_string(shape[i]) : ">= " + std::to_string(-shape[i]));
    bad_file(f.source(), fmt::format("tensor '{}' is {}, expected {}{}]", name, ti.describe(), st::dtype_name(dt), want));
  }
  return ti;
}

#if defined(DSV41KV_WITH_CUDA)
namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(ErrorCode::kCuda, fmt::format("conform: {} failed: {}", what, cudaGetErrorString(e)));
}
}  // namespace
#endif

Staging::Staging(Device d) : device_(d) {
#if !defined(DSV41KV_WITH_CUDA)
  if (d == Device::CUDA) fail(ErrorCode::kInvalidArgument, "--device cuda: dsv41kv was built without CUDA");
#endif
}

Staging::~Staging() {
#if defined(DSV41KV_WITH_CUDA)
  for (auto& b : bufs_) cudaFree(b.dev);
#endif
}

void* Staging::put(const void* host, size_t bytes, bool output) {
  if (device_ == Device::CPU) return const_cast<void*>(host);
#if defined(DSV41KV_WITH_CUDA)
  void* dev = nullptr;
  check(cudaMalloc(&dev, std::max<size_t>(bytes, 1)), "cudaMalloc");
  bufs_.push_back({const_cast<void*>(host), dev, bytes, output});
  if (bytes) check(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  return dev;
#else
  (void)bytes;
  (void)output;
  return nullptr;
#endif
}

TensorView Staging::view(const TensorView& host, bool output) {
  TensorView v = host;
  if (device_ == Device::CPU) return v;
  int64_t span = v.numel() > 0 ? 1 : 0;
  for (int i = 0; i < v.ndim && span > 0; ++i)
    span += (v.shape[static_cast<size_t>(i)] - 1) * v.stride[static_cast<size_t>(i)];
  v.data = put(host.data, static_cast<size_t>(span) * dtype_size(host.dtype), output);
  v.device = device_;
  return v;
}

void Staging::download() {
#if defined(DSV41KV_WITH_CUDA)
  if (device_ == Device::CPU) return;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (auto& b : bufs_)
    if (b.output && b.bytes) check(cudaMemcpy(b.host, b.dev, b.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
#endif
}

void Dump::add(const std::string& name, st::StDType dt, std::vector<int64_t> shape, std::span<const uint8_t> bytes) {
  if (!on_) return;
  w_.add(name, dt, std::move(shape), bytes);
  replaced_.insert(name);
}

std::string Dump::finish() {
  if (!on_) return {};
  for (const auto& name : f_.names())
    if (!replaced_.count(name)) w_.add_from(f_, name);
  for (const auto& [k, v] : f_.metadata()) w_.set_metadata(k, v);
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) fail(ErrorCode::kIo, fmt::format("--dump: cannot create directory '{}': {}", dir_, ec.message()));
  std::string base = std::filesystem::path(f_.source()).filename().string();
  if (base.size() > 3 && base.compare(base.size() - 3, 3, ".gz") == 0) base.resize(base.size() - 3);
  const std::string out = (std::filesystem::path(dir_) / base).string();
  w_.write(out);
  return out;
}

}  // namespace dsv41kv::conformance::detail
