// What every conformance runner (write path: conformance.cpp; read path: one file per op) shares:
// the file's `dsv41` metadata and tensor checks (a mismatch is a malformed file, Error(kFormat)
// naming the file), the device staging of inputs and outputs, and the `--dump` writer.
// Private to oracles/.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsv41kv/common.hpp"
#include "dsv41kv/conformance.hpp"
#include "dsv41kv/safetensors.hpp"

namespace dsv41kv::conformance::detail {

using json = nlohmann::json;

[[noreturn]] void bad_file(const std::string& path, const std::string& what);

// The `__metadata__.dsv41` object of a conformance file.
json dsv41_metadata(const st::SafetensorsFile& f);

// Metadata keys: present (not null), integers within [lo, hi], numbers; `where` prefixes the key
// in messages (e.g. "cases[3].").
const json& need(const json& j, const char* key, const std::string& path, std::string_view where);
int64_t need_int(const json& j, const char* key, const std::string& path, std::string_view where = "",
                 int64_t lo = 0, int64_t hi = std::numeric_limits<int64_t>::max());
double need_num(const json& j, const char* key, const std::string& path);
// The metadata's `cases`, a list of objects.
const json& need_cases(const json& j, const std::string& path);

// Tensor checks: dtype and shape (a shape entry < 0 is "at least -entry").
const st::TensorInfo& need_tensor(const st::SafetensorsFile& f, const std::string& name, st::StDType dt,
                                  std::vector<int64_t> shape);

// Host buffers stay the source of truth; on CUDA every view gets a device copy and outputs are
// copied back by download().
class Staging {
 public:
  explicit Staging(Device d);
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging();
  void* put(const void* host, size_t bytes, bool output);
  TensorView view(const TensorView& host, bool output = false);
  void download();

 private:
  struct Buf {
    void* host;
    void* dev;
    size_t bytes;
    bool output;
  };
  std::vector<Buf> bufs_;
  Device device_;
};

// `--dump DIR`: the input file's tensors and metadata with the project's outputs added (or put in
// place of the reference's of the same name), written to DIR/<input name without .gz>.
class Dump {
 public:
  Dump(const Options& opt, const st::SafetensorsFile& f) : f_(f), on_(!opt.dump_dir.empty()), dir_(opt.dump_dir) {}
  bool on() const { return on_; }
  void add(const std::string& name, st::StDType dt, std::vector<int64_t> shape, std::span<const uint8_t> bytes);
  template <class T>
  void add(const std::string& name, st::StDType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
    add(name, dt, std::move(shape),
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)));
  }
  // Writes the file when dumping; returns its path (empty otherwise).
  std::string finish();

 private:
  const st::SafetensorsFile& f_;
  bool on_;
  std::string dir_;
  st::SafetensorsWriter w_;
  std::set<std::string> replaced_;
};

// The runners of the read-path ops, one file each (conformance.cpp's kRunners names them).
FileResult run_indexer_topk(const st::SafetensorsFile& f, const json& j, const Options& opt);  // conformance_indexer.cpp

}  // namespace dsv41kv::conformance::detail
