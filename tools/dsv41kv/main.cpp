// dsv41kv command-line tool. Exit codes: 0 success, 1 a check failed (conform, verify),
// 2 bad input (flags, files, arguments) with the message on stderr, 3 an internal error.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dsv41kv/common.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dsv41kv: DeepSeek-V4.1 compressed-KV write path (compressor, caches, metadata, PCP)"};
  app.require_subcommand(1);
  int exit_code = 0;
  dsv41kv::cli::add_info(app, exit_code);
  dsv41kv::cli::add_demo(app, exit_code);
  dsv41kv::cli::add_conform(app, exit_code);
  dsv41kv::cli::add_run(app, exit_code, std::vector<std::string>(argv, argv + argc));
  dsv41kv::cli::add_nccl_check(app, exit_code);
  dsv41kv::cli::add_bench(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "dsv41kv: %s\n", e.what());
    return 2;
  } catch (const dsv41kv::Error& e) {
    std::fprintf(stderr, "dsv41kv: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv41kv: internal error: %s\n", e.what());
    return 3;
  }
  return exit_code;
}
