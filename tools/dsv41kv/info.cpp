// `dsv41kv info`: record layouts, default page strides and the CUDA device, for engine authors.
#include <fmt/format.h>

#include "commands.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::cli {

void add_info(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("info", "print record layouts, default page strides and the GPU");
  static int64_t states = 64;
  cmd->add_option("--states-per-page", states, "states per kernel page")->check(CLI::Range(1, 1 << 20));
  cmd->callback([&exit_code] {
    fmt::print("record      bytes/state  values  scales  align  page stride ({} states)\n", states);
    for (int i = 0; i < kNumRecordFormats; ++i) {
      const RecordInfo& ri = record_info(static_cast<RecordFormat>(i));
      const CacheView c = CacheView::with_default_strides(reinterpret_cast<void*>(1), ri.format, 1, states);
      fmt::print("{:<11} {:>11}  {:>6}  {:>6}  {:>5}  {} {}\n", ri.name, ri.record_bytes,
                 ri.packed ? ri.value_bytes : kLatentDim, ri.packed ? ri.scale_bytes : 0,
                 ri.page_align, c.page_stride, ri.element == DType::BF16 ? "bf16 elements" : "bytes");
    }
    fmt::print("cuda: {}\n", cuda_device_description());
    exit_code = 0;
  });
}

}  // namespace dsv41kv::cli
