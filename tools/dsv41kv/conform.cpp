// `dsv41kv conform FILE... [--dump DIR] [--device cpu|cuda]`: runs conformance files
// (SPEC 10.3) and prints one line per case and check, then "N passed, M failed".
// Exit code: 0 when every check passes, 1 when one fails, 2 when a file is missing or malformed
// (the message goes to stderr; the other files are still run).
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dsv41kv/conformance.hpp"

namespace dsv41kv::cli {

void add_conform(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("conform", "run conformance files (compress + insert, sparse decode / prefill attention, the indexer vs "
                                                   "the references, SPEC 10.3)");
  static std::vector<std::string> files;
  static std::string dump_dir;
  static std::string device = "cpu";
  static int threads = 0;
  cmd->add_option("files", files, "conformance files (.safetensors or .safetensors.gz)")->required();
  cmd->add_option("--dump", dump_dir, "write the project's outputs to DIR/<file name without .gz>");
  cmd->add_option("--device", device, "where the ops run (cpu | cuda)")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--threads", threads, "CPU threads (0 = all)")->check(CLI::Range(0, 4096));
  cmd->callback([&exit_code] {
    conformance::Options opt;
    opt.device = device == "cuda" ? Device::CUDA : Device::CPU;
    opt.dump_dir = dump_dir;
    opt.num_threads = threads;
    int64_t passed = 0, failed = 0;
    bool bad_input = false;
    for (const std::string& path : files) {
      try {
        const conformance::FileResult r = conformance::run_file(path, opt);
        for (const std::string& line : conformance::report(r)) fmt::print("{}\n", line);
        failed += r.failed();
        passed += r.checks() - r.failed();
        if (!r.dump_path.empty()) fmt::print("dumped {}\n", r.dump_path);
      } catch (const Error& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "dsv41kv conform: %s\n", e.what());
        bad_input = true;
      }
      std::fflush(stdout);
    }
    fmt::print("{} passed, {} failed\n", passed, failed);
    std::fflush(stdout);
    exit_code = bad_input ? 2 : (failed > 0 ? 1 : 0);
  });
}

}  // namespace dsv41kv::cli
